"""Time to accuracy from fixed training logs (no MXNet): iterations to S-SGD's final
accuracy minus a drop, computed here independently from the curves the fixture writes."""
import json
import os

import pytest

from mxnet_cpsgd.repro import report
from mxnet_cpsgd.repro.time_to_accuracy import (iterations_to_target, time_to_accuracy,
                                                time_to_accuracy_markdown)

ITERS = 100     # iterations per epoch
# label -> seed -> validation accuracy at the end of each epoch (both ranks alike)
CURVES = {
    "SSGD": {1: [0.80, 0.86, 0.89, 0.900], 2: [0.81, 0.87, 0.88, 0.896]},
    "k5": {1: [0.70, 0.84, 0.894, 0.897], 2: [0.75, 0.85, 0.87, 0.889]},
    "BIT": {1: [0.60, 0.70, 0.80, 0.85], 2: [0.62, 0.71, 0.85, 0.8935]},
}


def _write(root, label, seed, curve):
    d = os.path.join(root, "runs", "m2", "%s-M2-loopback-s%d" % (label, seed))
    os.makedirs(d)
    meta = {"run_id": "m2/%s-M2-loopback-s%d" % (label, seed), "experiment": "m2",
            "label": label, "algorithm": {"SSGD": "ssgd", "k5": "cpsgd"}.get(label, "bitsgd"),
            "num_workers": 2, "rate": None, "seed": seed, "knobs": {}, "status": "ok"}
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump(meta, f)
    for rank in range(2):
        name = "log.json" if rank == 0 else "log.rank%d.json" % rank
        with open(os.path.join(d, name), "w") as f:
            for e, acc in enumerate(curve):
                f.write(json.dumps({"epoch": e, "rank": rank, "num_workers": 2,
                                    "val_acc": acc, "iterations": ITERS}) + "\n")


@pytest.fixture()
def groups(tmp_path):
    root = str(tmp_path / "out")
    for label, seeds in CURVES.items():
        for seed, curve in seeds.items():
            _write(root, label, seed, curve)
    return report.group_runs([report.summarize_run(r) for r in report.load_runs(root)])


def _expected(label, drop):
    """Per seed, (epoch index + 1) x ITERS of the first epoch at the target."""
    ref = [c[-1] for c in CURVES["SSGD"].values()]
    target = sum(ref) / len(ref) - drop / 100.0
    out = []
    for seed in sorted(CURVES[label]):
        hit = [e for e, acc in enumerate(CURVES[label][seed]) if acc >= target]
        out.append((hit[0] + 1) * ITERS if hit else None)
    return target, out


def test_iterations_to_target():
    pts = [(100, 0.5), (200, 0.8), (300, 0.9)]
    assert iterations_to_target(pts, 0.8) == 200
    assert iterations_to_target(pts, 0.95) is None
    assert iterations_to_target([], 0.1) is None


@pytest.mark.parametrize("drop", [0.5, 1.0])
def test_time_to_accuracy_per_seed(groups, drop):
    rows = {r.label: r for r in time_to_accuracy(groups, drops=[drop])}
    assert set(rows) == {"SSGD", "k5", "BIT"}
    for label, row in rows.items():
        target, iters = _expected(label, drop)
        assert row.reference == "SSGD"
        assert row.target == pytest.approx(target)
        assert row.iterations == iters
        got = [i for i in iters if i is not None]
        assert row.reached == len(got)
        assert row.mean_iterations == (sum(got) / len(got) if got else None)


def test_markdown_marks_measured_and_combined(groups):
    rows = time_to_accuracy(groups, drops=[1.0])
    text = time_to_accuracy_markdown(rows, {"m2": {"k5": 50.0}})
    k5 = next(r for r in rows if r.label == "k5")
    assert "iterations (measured, mean)" in text and "(combined)" in text
    line = next(l for l in text.splitlines() if "| k5 |" in l)
    assert "| 50.0 | %.0f |" % (k5.mean_iterations * 0.05) in line
    bit = next(l for l in text.splitlines() if "| BIT |" in l)
    assert "| n/a | n/a |" in bit       # no time per iteration given


def test_report_section_from_the_spec_settings(tmp_path):
    """The spec's time_to_accuracy settings (via reproduce.json) add the section; without
    them the report has none."""
    root = str(tmp_path / "out")
    for label, seeds in CURVES.items():
        for seed, curve in seeds.items():
            _write(root, label, seed, curve)
    assert "## Time to accuracy" not in report.generate(root, plots=False).markdown
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump({"time_to_accuracy": {"drops": [1.0], "source": "cpsgd-bench, test",
                                        "ms_per_iteration": {"m2": {"k5": 50.0}}}}, f)
    md = report.generate(root, plots=False).markdown
    assert "## Time to accuracy" in md and "Time per iteration: cpsgd-bench, test" in md
    _, iters = _expected("k5", 1.0)
    got = [i for i in iters if i is not None]
    section = md.split("## Time to accuracy", 1)[1].split("\n## ", 1)[0]
    line = next(l for l in section.splitlines() if l.startswith("| m2 | 2 | loopback | k5 |"))
    assert "| %.0f | 50.0 | %.0f |" % (sum(got) / len(got), sum(got) / len(got) * 0.05) in line


@pytest.mark.parametrize("bad", [
    [], {"drops": [0]}, {"drops": 0.5}, {"ms_per_iteration": {"m2": {"k5": -1}}},
    {"ms_per_iteration": {"m2": 5}}, {"unknown": 1}, {"experiments": "m2"},
    {"same_iterations": {"horovod": 1}}, {"same_iterations": ["SSGD"]}])
def test_spec_refuses_bad_time_to_accuracy(bad):
    from mxnet_cpsgd.repro import spec as spec_mod
    base = {"script": "scripts/train_mnist.py", "runs": [{"label": "S", "algorithm": "ssgd"}]}
    with pytest.raises(spec_mod.SpecError, match="time_to_accuracy"):
        spec_mod.validate_spec(dict(base, time_to_accuracy=bad))
    spec_mod.validate_spec(dict(base, time_to_accuracy={"drops": [0.5, 1.0]}))


def test_same_iterations_rows_and_experiment_filter(groups):
    """A timed-only algorithm (Horovod for S-SGD) takes its source's per-seed iterations,
    right after the source's row; an experiment filter keeps only the named ones."""
    rows = time_to_accuracy(groups, drops=[0.5], same_iterations={"horovod": "SSGD"})
    labels = [r.label for r in rows]
    assert labels.index("horovod") == labels.index("SSGD") + 1
    hvd = rows[labels.index("horovod")]
    _, iters = _expected("SSGD", 0.5)
    assert hvd.iterations == iters and hvd.iterations_of == "SSGD"
    text = time_to_accuracy_markdown(rows, {"m2": {"horovod": 40.0}})
    line = next(l for l in text.splitlines() if "| horovod (iterations of SSGD) |" in l)
    got = [i for i in iters if i is not None]
    assert "| 40.0 | %.0f |" % (sum(got) / len(got) * 0.04) in line
    assert time_to_accuracy(groups, experiments=["other"]) == []
    assert len(time_to_accuracy(groups, drops=[0.5], experiments=["m2"])) == 3


def test_report_draws_the_time_to_accuracy_figure(tmp_path):
    """With times per iteration and plots on, the section links a figure that exists."""
    root = str(tmp_path / "out")
    for label, seeds in CURVES.items():
        for seed, curve in seeds.items():
            _write(root, label, seed, curve)
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump({"time_to_accuracy": {"drops": [1.0], "same_iterations": {"hvd": "SSGD"},
                                        "ms_per_iteration": {"m2": {"k5": 50.0, "hvd": 60.0,
                                                                    "SSGD": 70.0}}}}, f)
    md = report.generate(root, plots=True).markdown
    assert "](time-to-accuracy.png)" in md
    assert os.path.getsize(os.path.join(root, "time-to-accuracy.png")) > 1000


def test_resumed_run_counts_its_steps_before_the_resume(tmp_path):
    """After a resume an epoch's ``iterations`` counts only the steps since; the
    cumulative count is its ``total_iterations``, so a run resumed inside epoch 2
    (60 of its 100 steps before the resume) reaches the target at 300, not 240."""
    from mxnet_cpsgd.repro.paired import iteration_series
    root = str(tmp_path / "out")
    curve = [0.80, 0.86, 0.95]
    _write(root, "SSGD", 1, curve)
    d = os.path.join(root, "runs", "m2", "SSGD-M2-loopback-s1")
    for name in ("log.json", "log.rank1.json"):
        with open(os.path.join(d, name), "w") as f:
            for e, (acc, iters) in enumerate(zip(curve, [100, 100, 40])):
                f.write(json.dumps({"epoch": e, "rank": 0, "num_workers": 2, "val_acc": acc,
                                    "iterations": iters,
                                    "total_iterations": (e + 1) * ITERS}) + "\n")
    groups = report.group_runs([report.summarize_run(r) for r in report.load_runs(root)])
    (series,) = iteration_series(groups[0])
    assert [it for it, _ in series] == [100.0, 200.0, 300.0]
    assert iterations_to_target(series, 0.9) == 300


def test_resumed_two_bit_run_says_its_residual_restarted():
    """The run list's note says MXNet's 2-bit residual restarted for a resumed run
    of a store that pushes through it, and only then; the list of such stores is
    the stores' own (their default compression type)."""
    from mxnet_cpsgd.repro.run_tables import TWO_BIT_STORES, sittings_note
    from mxnet_cpsgd.stores.catalog import stores
    assert sorted(TWO_BIT_STORES) == sorted(
        name for name, (_, knobs) in stores().items() if knobs.get("type") == "2bit")
    resumed = {"sittings": [{}, {"resumed_from_iteration": 400}]}
    assert "residual restarted" in sittings_note(dict(resumed, algorithm="cpsgd"))
    assert "residual restarted" not in sittings_note(dict(resumed, algorithm="ssgd"))
    assert "resumed at iteration 400" in sittings_note(dict(resumed, algorithm="ssgd"))
    assert sittings_note({"algorithm": "cpsgd", "sittings": [{}]}) == ""
