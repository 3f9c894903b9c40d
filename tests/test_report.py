"""mxnet_cpsgd.repro.report on a small fixed set of logs (no training, no MXNet).

The expected numbers are computed here from the same fixed values, independently
of the report's own code.
"""
import json
import os

import pytest

from mxnet_cpsgd.repro import markdown, report, summary
from mxnet_cpsgd.repro.logs import read_run

# per label: (algorithm, k, M, seed) -> per rank, per epoch (val_acc, train_loss,
# train_acc, epoch_time, comm_time)
EPOCHS = 3


def _values(base_acc, base_time, rank, epoch, seed=1):
    """Deterministic, distinct per rank/epoch/seed."""
    val_acc = base_acc + 0.02 * epoch + 0.004 * rank + 0.001 * seed
    train_loss = 1.0 / (epoch + 1) + 0.01 * rank + 0.003 * seed
    train_acc = val_acc - 0.01
    epoch_time = base_time * (3.0 if epoch == 0 else 1.0 + 0.1 * epoch) + 0.05 * rank
    comm_time = epoch_time / 2 + 0.01 * seed
    return val_acc, train_loss, train_acc, epoch_time, comm_time


RUNS = [
    # experiment, label, algorithm, k, M, seed, base_acc, base_time
    ("acc", "SSGD", "ssgd", None, 2, 1, 0.80, 4.0),
    ("acc", "SSGD", "ssgd", None, 2, 2, 0.80, 4.0),
    ("acc", "BIT", "bitsgd", None, 2, 1, 0.78, 3.6),
    ("acc", "k2", "cpsgd", 2, 2, 1, 0.797, 3.5),     # within 0.5 points
    ("acc", "k5", "cpsgd", 5, 2, 1, 0.75, 3.4),      # 5+ points below S-SGD
    ("acc", "SSGD", "ssgd", None, 4, 1, 0.81, 2.2),
    ("acc", "k5", "cpsgd", 5, 4, 1, 0.805, 1.9),
]


def _write_run(root, exp, label, algorithm, k, m, seed, base_acc, base_time, order,
               meta=True, epochs=EPOCHS, duplicate_epoch=None):
    run_dir = os.path.join(root, "runs", exp, "%s-M%d-loopback-s%d" % (label, m, seed))
    os.makedirs(run_dir)
    if meta:
        knobs = {"correction_period": k} if k is not None else {}
        with open(os.path.join(run_dir, "run.json"), "w") as f:
            json.dump({"run_id": "%s/%s-M%d-s%d" % (exp, label, m, seed), "order": order,
                       "experiment": exp, "label": label, "algorithm": algorithm,
                       "num_workers": m, "rate": None, "seed": seed, "knobs": knobs,
                       "status": "ok", "wall_time": 12.0,
                       "command_text": "python scripts/train_mnist.py --algorithm %s"
                                       % algorithm}, f)
    for rank in range(m):
        name = "log.json" if rank == 0 else "log.rank%d.json" % rank
        with open(os.path.join(run_dir, name), "w") as f:
            for epoch in range(epochs):
                va, tl, ta, te, tc = _values(base_acc, base_time, rank, epoch, seed)
                if duplicate_epoch == epoch:   # an earlier, replaced line (resume)
                    f.write(json.dumps({"algorithm": algorithm, "epoch": epoch,
                                        "rank": rank, "num_workers": m, "val_acc": 0.0,
                                        "train_loss": 9.0, "train_acc": 0.0,
                                        "epoch_time": 99.0, "comm_time": 99.0}) + "\n")
                f.write(json.dumps({"algorithm": algorithm, "epoch": epoch, "rank": rank,
                                    "num_workers": m, "val_acc": va, "train_loss": tl,
                                    "train_acc": ta, "val_loss": tl, "epoch_time": te,
                                    "comm_time": tc, "iterations": 100}) + "\n")
            f.write("{broken last line")  # a run killed mid-write
    return run_dir


def _mean(xs):
    return sum(xs) / len(xs)


def expected_run(base_acc, base_time, m, seed, epochs=EPOCHS):
    """final val acc, best val acc, final train loss, Te, Tc of one run, computed
    from _values: mean over ranks per epoch; Te/Tc over epochs 1.. ."""
    per_epoch = [[_values(base_acc, base_time, r, e, seed) for r in range(m)]
                 for e in range(epochs)]
    val = [_mean([v[0] for v in ranks]) for ranks in per_epoch]
    loss = [_mean([v[1] for v in ranks]) for ranks in per_epoch]
    te = [_mean([v[3] for v in ranks]) for ranks in per_epoch]
    tc = [_mean([v[4] for v in ranks]) for ranks in per_epoch]
    steady = slice(1, None) if epochs > 1 else slice(0, None)
    return {"final": val[-1], "best": max(val), "loss": loss[-1],
            "te": _mean(te[steady]), "tc": _mean(tc[steady])}


def expected_group(label, m):
    runs = [expected_run(acc, t, mm, seed) for (_, lab, _, _, mm, seed, acc, t) in RUNS
            if lab == label and mm == m]
    return {key: _mean([r[key] for r in runs]) for key in runs[0]}


@pytest.fixture()
def logs(tmp_path):
    root = str(tmp_path / "out")
    for order, run in enumerate(RUNS):
        _write_run(root, *run, order=order, duplicate_epoch=1 if order == 2 else None)
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump({"title": "Fixed logs", "command": "cpsgd-reproduce spec.yaml -o out",
                   "reference_te_tc": {"columns": ["SSGD", "k5"],
                                       "rows": {"Te M=4": [2.24, 1.86]}}}, f)
    return root


def test_accuracy_table_matches_own_computation(logs):
    rep = report.generate(logs)
    rows = {(r["label"], r["num_workers"]): r for r in rep.accuracy_rows}
    assert set(rows) == {("SSGD", 2), ("BIT", 2), ("k2", 2), ("k5", 2), ("SSGD", 4),
                         ("k5", 4)}
    for (label, m), row in rows.items():
        exp = expected_group(label, m)
        assert row["final_val_acc"] == pytest.approx(exp["final"])
        assert row["best_val_acc"] == pytest.approx(exp["best"])
        assert row["final_train_loss"] == pytest.approx(exp["loss"])
        assert row["te"] == pytest.approx(exp["te"])
        assert row["tc"] == pytest.approx(exp["tc"])
        assert row["epochs"] == EPOCHS
        base = expected_group("SSGD", m)["final"]
        assert row["delta_vs_ssgd"] == pytest.approx(100 * (exp["final"] - base))
    assert rows[("SSGD", 2)]["seeds"] == 2
    # std over the two SSGD seeds: the seeds shift val acc by 0.001 each
    assert rows[("SSGD", 2)]["final_val_acc_std"] == pytest.approx(
        (2 * 0.0005 ** 2) ** 0.5)
    # the Markdown shows the same numbers, in percent with two decimals
    k5 = expected_group("k5", 2)
    line = next(l for l in rep.markdown.splitlines() if l.startswith("| acc | k5 | 2 |"))
    assert "%.2f" % (100 * k5["final"]) in line
    assert "%.2f" % (100 * k5["best"]) in line
    assert "%.4f" % k5["loss"] in line


def test_te_tc_table_in_paper_layout(logs):
    rep = report.generate(logs)
    assert len(rep.te_tc) == 1
    t = rep.te_tc[0]
    assert t.columns == ["SSGD", "BIT", "k2", "k5"]
    assert t.rows == ["Te M=4", "Te M=2", "Tc M=4", "Tc M=2"]
    for label in t.columns:
        for m in (2, 4):
            if (label, m) in {(r[1], r[4]) for r in RUNS}:
                exp = expected_group(label, m)
                assert t.value("Te", m, label) == pytest.approx(exp["te"])
                assert t.value("Tc", m, label) == pytest.approx(exp["tc"])
            else:
                assert t.value("Te", m, label) is None
    md = rep.markdown
    header = "|  | SSGD | BIT | k2 | k5 |"
    assert header in md
    te4 = [l for l in md.splitlines() if l.startswith("| Te M=4 |")][0]
    assert te4 == "| Te M=4 | %.2f | n/a | n/a | %.2f |" % (
        expected_group("SSGD", 4)["te"], expected_group("k5", 4)["te"])
    # the published reference table is shown
    assert "| Te M=4 | 2.24 | 1.86 |" in md


def test_replaced_epoch_line_and_broken_line(logs):
    run = read_run(os.path.join(logs, "runs", "acc", "BIT-M2-loopback-s1"))
    series = summary.epoch_series(run)
    assert [p["epoch"] for p in series] == [0, 1, 2]
    va = _mean([_values(0.78, 3.6, r, 1)[0] for r in range(2)])
    assert series[1]["val_acc"] == pytest.approx(va)


def test_findings_flag_the_gap(logs):
    rep = report.generate(logs)
    k5 = [f for f in rep.findings if "M=2" in f and " k5 final" in f][0]
    assert "more than 0.5 points below S-SGD" in k5
    k2 = [f for f in rep.findings if "M=2" in f and " k2 final" in f][0]
    # a gap of means is never called a match: that is the paired table's TOST
    assert "within 0.5 points" in k2 and "not an equivalence test" in k2
    assert not any("match" in f for f in rep.findings)
    bit = [f for f in rep.findings if "M=2" in f and " BIT final" in f][0]
    assert "more than 0.5 points below S-SGD" in bit and "%+.2f points" % (
        100 * (expected_group("BIT", 2)["final"] - expected_group("SSGD", 2)["final"])) in bit
    ratio = expected_group("k2", 2)["te"] / expected_group("BIT", 2)["te"]
    assert any(("k2 Te = %.2f x BIT-SGD" % ratio) in f for f in rep.findings)


def test_k_sensitivity(logs):
    rep = report.generate(logs)
    entry = [e for e in rep.k_sensitivity if e["num_workers"] == 2][0]
    assert entry["k"] == [2, 5]
    assert entry["final_val_acc"] == pytest.approx(
        [expected_group("k2", 2)["final"], expected_group("k5", 2)["final"]])
    assert entry["te"] == pytest.approx(
        [expected_group("k2", 2)["te"], expected_group("k5", 2)["te"]])
    assert set(entry["references"]) == {"SSGD", "BIT"}


def test_pngs_exist_and_are_linked(logs):
    rep = report.generate(logs)
    assert "k-sensitivity.png" in rep.figures
    assert markdown.figure_name("curves", "acc", 2, None) in rep.figures
    assert markdown.figure_name("curves", "acc", 4, None) in rep.figures
    for name in rep.figures:
        path = os.path.join(logs, name)
        assert os.path.getsize(path) > 1000
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert "](%s)" % name in rep.markdown
    assert os.path.isfile(os.path.join(logs, "report.md"))
    assert "cpsgd-reproduce spec.yaml -o out" in rep.markdown


def _png_size(path):
    """(width, height) in pixels from the PNG's IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_band_figure_makes_room_for_a_long_legend_and_title(tmp_path):
    """34 runs in one panel (the learning-rate grid's every-run figure): matplotlib must
    find room for the legend and the title (it warns 'Tight layout not applied' when it
    cannot, and the title then overlaps the panel's), and the figure grows with them."""
    import warnings
    from mxnet_cpsgd.repro import plots

    def panel(n):
        return [{"name": "M = 2", "lines": [
            {"label": "run-%02d-lr0.0125" % i,
             "seeds": [[(100 * e, 0.5 + 0.01 * e + 0.001 * i) for e in range(1, 5)]]}
            for i in range(n)]}]
    title = ("every run of a grid: validation accuracy vs iterations, a long title that "
             "does not fit on one line of a single panel (band: range over seeds)")
    few, many = str(tmp_path / "few.png"), str(tmp_path / "many.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        plots.plot_iteration_bands(panel(3), few, title)
        plots.plot_iteration_bands(panel(34), many, title)
    assert _png_size(many)[1] > _png_size(few)[1]


def test_single_epoch_uses_it_and_runs_without_meta(tmp_path):
    root = str(tmp_path)
    _write_run(root, "t", "SSGD", "ssgd", None, 2, 1, 0.5, 2.0, order=0, meta=False,
               epochs=1)
    rep = report.generate(root, plots=True)
    row = rep.accuracy_rows[0]
    assert row["label"] == "ssgd"  # inferred from the records
    exp = expected_run(0.5, 2.0, 2, 1, epochs=1)
    assert row["te"] == pytest.approx(exp["te"])
    assert row["final_val_acc"] == pytest.approx(exp["final"])
    assert "one epoch per run, no curve" in rep.markdown


def test_failed_runs_listed_and_empty_tree(tmp_path):
    root = str(tmp_path)
    rep = report.generate(root)
    assert "No run logged an epoch." in rep.markdown
    d = tmp_path / "runs" / "x" / "BIT-M2-100mbit-s1"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({
        "run_id": "x/BIT-M2-100mbit-s1", "label": "BIT", "algorithm": "bitsgd",
        "num_workers": 2, "rate": "100mbit", "status": "skipped",
        "failure": "network emulation unavailable: needs root"}))
    rep = report.generate(root)
    assert "| x/BIT-M2-100mbit-s1 | skipped | BIT |" in rep.markdown
    assert "needs root" in rep.markdown


def test_cli(logs, tmp_path, capsys):
    out = str(tmp_path / "elsewhere")
    assert report.main([logs, "--out-dir", out, "--name", "r.md", "--no-plots"]) == 0
    assert os.path.isfile(os.path.join(out, "r.md"))
    assert not [n for n in os.listdir(out) if n.endswith(".png")]


def test_divergence_is_flagged(tmp_path):
    root = str(tmp_path)
    d = _write_run(root, "e", "BIT", "bitsgd", None, 2, 1, 0.3, 1.0, order=0)
    # rewrite rank 0 and 1 with a rising training loss
    for name in ("log.json", "log.rank1.json"):
        path = os.path.join(d, name)
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.startswith("{\"")]
        for rec in lines:
            rec["train_loss"] = 2.0 + 0.1 * rec["epoch"]
        with open(path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in lines))
    _write_run(root, "e", "SSGD", "ssgd", None, 2, 1, 0.8, 1.0, order=1)
    rep = report.generate(root, plots=False)
    assert any("BIT final val acc" in f and "did NOT train" in f for f in rep.findings)
    assert any("BIT did not converge" in f and "2.0000" in f and "2.2000" in f
               for f in rep.findings), rep.findings


def test_timing_only_experiment_is_not_judged_on_accuracy(logs):
    meta_path = os.path.join(logs, "reproduce.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["experiments"] = [{"name": "acc", "purpose": "timing"}]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    rep = report.generate(logs)
    assert not [f for f in rep.findings if "final val acc" in f]
    assert any("Te = " in f for f in rep.findings)           # timing still checked
    assert len(rep.accuracy_rows) == 6                       # still listed
    assert not [n for n in rep.figures if n.startswith("curves-")]
    assert all(v is None for e in rep.k_sensitivity for v in e["final_val_acc"])
    assert "measure time only" in rep.markdown
    line = next(l for l in rep.markdown.splitlines() if l.startswith("| acc | k5 | 2 |"))
    assert "| - | - | - | - | - | %.2f |" % expected_group("k5", 2)["te"] in line


def test_analysis_file_is_included_at_the_top(logs):
    with open(os.path.join(logs, "analysis.md"), "w") as f:
        f.write("Hand-written words.\n")
    md = report.generate(logs, plots=False).markdown
    # the claims table lives in analysis.md: right under the title, before the setup
    assert md.index("## Analysis") < md.index("Hand-written words.") < md.index(
        "## How this report was produced") < md.index("## Final accuracy")
