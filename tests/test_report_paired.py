"""Seed-paired differences and their figures in the report (fixed logs, no MXNet).

The expected means and intervals are computed here from the fixture's numbers, with
scipy's Student t quantile, independently of mxnet_cpsgd.repro.paired.
"""
import json
import math
import os

import pytest

from mxnet_cpsgd.repro import paired, report

# label -> {seed: final val acc}; SSGD-mom0 is the reference of the -mom0 labels
FINAL = {
    "SSGD": {1: 0.880, 2: 0.884, 3: 0.878},
    "k5": {1: 0.870, 2: 0.871, 3: 0.866},          # clearly below, 3 pairs
    "BIT-wu": {1: 0.881, 2: 0.879, 3: 0.882},      # straddles 0
    "local": {1: 0.500},                           # one seed
    "SSGD-mom0": {1: 0.870, 2: 0.872},
    "k5-mom0": {1: 0.874, 2: 0.877, 3: 0.9},       # seed 3 has no reference: 2 pairs
}
ALGORITHM = {"SSGD": "ssgd", "SSGD-mom0": "ssgd", "k5": "cpsgd", "k5-mom0": "cpsgd",
             "BIT-wu": "bitsgd", "local": "cpsgd"}
EPOCHS, ITERS = 3, 50


def _write(root, label, seed, final, code=None):
    d = os.path.join(root, "runs", "m2", "%s-M2-loopback-s%d" % (label, seed))
    os.makedirs(d)
    meta = {"run_id": "m2/%s-M2-loopback-s%d" % (label, seed), "experiment": "m2",
            "label": label, "algorithm": ALGORITHM[label], "num_workers": 2, "rate": None,
            "seed": seed, "knobs": {}, "status": "ok", "wall_time": 3.0}
    if code is not None:
        meta["code"] = code
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump(meta, f)
    for rank in range(2):
        name = "log.json" if rank == 0 else "log.rank%d.json" % rank
        with open(os.path.join(d, name), "w") as f:
            for e in range(EPOCHS):
                acc = final - 0.05 * (EPOCHS - 1 - e)   # both ranks validate alike
                f.write(json.dumps({"epoch": e, "rank": rank, "num_workers": 2,
                                    "val_acc": acc, "train_loss": 1.0 / (e + 1),
                                    "train_acc": acc, "epoch_time": 1.0, "comm_time": 0.5,
                                    "iterations": ITERS}) + "\n")


@pytest.fixture()
def root(tmp_path):
    r = str(tmp_path / "out")
    for label, seeds in FINAL.items():
        for seed, final in seeds.items():
            _write(r, label, seed, final,
                   code={"commit": "abcdef0123456789", "dirty": seed == 2})
    return r


def _expected(label, ref):
    seeds = sorted(set(FINAL[label]) & set(FINAL[ref]))
    d = [100 * (FINAL[label][s] - FINAL[ref][s]) for s in seeds]
    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return seeds, mean, None
    from scipy import stats
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return seeds, mean, (mean - half, mean + half)


def test_reference_labels():
    labels = ["SSGD", "SSGD-mom0", "k5", "BIT-wu-mom0"]
    assert paired.reference_label("k5", labels) == "SSGD"
    assert paired.reference_label("BIT-wu-mom0", labels) == "SSGD-mom0"
    assert paired.reference_label("SSGD-mom0", labels) == "SSGD"
    assert paired.reference_label("SSGD", labels) is None
    assert paired.reference_label("k5", ["k5"]) is None


def test_t95_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 30):
        assert paired.t95(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3)
    with pytest.raises(ValueError):
        paired.t95(0)


def test_paired_differences_and_verdicts(root):
    pytest.importorskip("scipy.stats")
    rep = report.generate(root)
    got = {d.label: d for d in paired.paired_differences(
        report.group_runs([report.summarize_run(r) for r in report.load_runs(root)]))}
    assert set(got) == {"k5", "BIT-wu", "local", "SSGD-mom0", "k5-mom0"}
    for label, d in got.items():
        seeds, mean, ci = _expected(label, d.reference)
        assert d.seeds == seeds
        assert d.mean == pytest.approx(mean, abs=1e-9)
        if ci is None:
            assert d.ci is None
        else:
            assert d.ci[0] == pytest.approx(ci[0], abs=1e-3)
            assert d.ci[1] == pytest.approx(ci[1], abs=1e-3)
    assert got["k5-mom0"].reference == "SSGD-mom0" and got["k5-mom0"].n == 2
    assert got["k5"].verdict == "below"
    assert got["BIT-wu"].verdict == "not distinguishable"
    assert got["local"].verdict == "one seed: no interval"
    assert got["k5-mom0"].verdict in ("above", "not distinguishable")
    # with also_base, k5-mom0 (and only the -mom0 labels) also against SSGD, seeds 1-3
    both = paired.paired_differences(
        report.group_runs([report.summarize_run(r) for r in report.load_runs(root)]),
        also_base=True)
    extra = [(d.label, d.reference) for d in both
             if (d.label, d.reference) not in {(x.label, x.reference) for x in got.values()}]
    assert extra == [("k5-mom0", "SSGD")]
    k5m = next(d for d in both if (d.label, d.reference) == ("k5-mom0", "SSGD"))
    assert k5m.seeds == [1, 2, 3] and k5m.mean == pytest.approx(_expected("k5-mom0", "SSGD")[1])
    assert "| m2 | 2 | loopback | k5-mom0 | SSGD | 3 |" in rep.markdown
    # the report's table and figures
    assert "## Seed-paired differences to S-SGD" in rep.markdown
    line = next(l for l in rep.markdown.splitlines() if l.startswith("| m2 | 2 | loopback | k5 |"))
    assert "%+.2f" % _expected("k5", "SSGD")[1] in line and "below" in line
    for fname in ("accuracy-seeds-m2.png", "accuracy-all-m2.png", "paired-m2.png"):
        assert fname in rep.figures and os.path.getsize(os.path.join(root, fname)) > 1000
        assert "(%s)" % fname in rep.markdown
    # provenance: the code commit of every run, dirty marked
    assert "abcdef0123+dirty" in rep.markdown and "abcdef0123 |" in rep.markdown


def test_iteration_series_is_cumulative(root):
    runs = report.load_runs(root)
    groups = report.group_runs([report.summarize_run(r) for r in runs])
    g = next(g for g in groups if g.label == "SSGD")
    series = paired.iteration_series(g)
    assert len(series) == 3
    for pts in series:
        assert [x for x, _ in pts] == [ITERS * (e + 1) for e in range(EPOCHS)]


def test_runs_without_code_say_na(tmp_path):
    r = str(tmp_path)
    _write(r, "SSGD", 1, 0.8)
    rep = report.generate(r, plots=False)
    assert "| n/a |" in rep.markdown


def _write_finals(root, finals):
    """``{label: {seed: final val acc}}`` as runs of experiment m2."""
    for label, seeds in finals.items():
        for seed, final in seeds.items():
            _write(root, label, seed, final)


def _chosen_section(md):
    """The report's "between chosen runs" section, up to the next heading."""
    return md.split("between chosen runs")[1].split("\n## ")[0]


def _chosen_rows(md):
    """The cells of the "between chosen runs" table's rows."""
    return [[c.strip() for c in row.strip("|").split("|")]
            for row in _chosen_section(md).splitlines() if row.startswith("| m2 |")]


def _tiny_meta(root, runs, figures=None, comparisons=None):
    """reproduce.json as cpsgd-reproduce writes it: the planned runs of experiment m2."""
    meta = {"name": "t", "experiments": [{"name": "m2", "args": [], "labels": []}],
            "runs": runs, "figures": figures, "comparisons": comparisons}
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump(meta, f)


def test_experiments_table_lists_the_runs_that_exist(root):
    planned = ["m2/%s-M2-loopback-s%d" % (label, seed)
               for label in ("SSGD", "k5", "BIT") for seed in (1, 2, 3, 4)]
    _tiny_meta(root, planned)
    rep = report.generate(root, plots=False)
    row = next(l for l in rep.markdown.splitlines() if l.startswith("| m2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    exist, missing = cells[2], cells[3]
    # what exists: every label of the fixture with its seeds, in ranges
    for label, seeds in FINAL.items():
        s = sorted(seeds)
        text = "%d-%d" % (s[0], s[-1]) if len(s) > 1 else str(s[0])
        assert "%s-M2-loopback: %s" % (label, text) in exist
    # planned but absent: seed 4 of SSGD and k5, every seed of BIT; nothing that exists
    assert missing == "SSGD-M2-loopback: 4; k5-M2-loopback: 4; BIT-M2-loopback: 1-4"


def test_collapsed_seeds_are_counted_not_averaged(tmp_path):
    r = str(tmp_path)
    finals = {"SSGD": {1: 0.88, 2: 0.89, 3: 0.87, 4: 0.885},
              "k5": {1: 0.86, 2: 0.10, 3: 0.85, 4: 0.865}}
    _write_finals(r, finals)
    groups = report.group_runs([report.summarize_run(x) for x in report.load_runs(r)])
    d = next(x for x in paired.paired_differences(groups) if x.label == "k5")
    diffs = {s: 100 * (finals["k5"][s] - finals["SSGD"][s]) for s in finals["k5"]}
    assert d.not_trained == [s for s in sorted(diffs) if diffs[s] < -20] == [2]
    t = d.trained()
    assert t.seeds == [1, 3, 4] and t.n == 3
    assert t.mean == pytest.approx(sum(diffs[s] for s in (1, 3, 4)) / 3)
    assert d.mean == pytest.approx(sum(diffs.values()) / 4)
    # the spec's figures: one panel per experiment (a label without runs left out), and
    # the paired bars of the listed labels
    _tiny_meta(r, [], figures=[
        {"name": "head", "kind": "curves", "title": "T",
         "panels": [{"experiment": "m2", "labels": [{"S-SGD": "SSGD"}, "k5", "nothing"]}]},
        {"name": "bars", "kind": "paired", "experiment": "m2", "labels": ["k5"]},
        {"name": "empty", "kind": "paired", "experiment": "m2", "labels": ["nothing"]}])
    rep = report.generate(r)
    for fname in ("figure-head.png", "figure-bars.png"):
        assert fname in rep.figures and os.path.getsize(os.path.join(r, fname)) > 1000
        assert "(%s)" % fname in rep.markdown
    assert "figure-empty.png" not in rep.figures
    assert not os.path.exists(os.path.join(r, "figure-empty.png"))
    assert "## Summary figures" in rep.markdown


def test_chosen_comparisons_between_two_algorithms(root):
    """The spec's comparisons: differences between two runs neither of which is
    S-SGD, as a table row each, computed independently here."""
    _tiny_meta(root, [], comparisons=[
        {"experiment": "m2", "run": "k5", "vs": "BIT-wu"},
        {"experiment": "m2", "run": "k5-mom0", "vs": "k5"},
        {"experiment": "m2", "run": "k5", "vs": "nothing"}])   # no such runs: left out
    md = report.generate(root, plots=False).markdown
    assert "## Seed-paired differences between chosen runs" in md
    rows = _chosen_rows(md)
    assert len(rows) == 2
    for cells, (label, ref) in zip(rows, [("k5", "BIT-wu"), ("k5-mom0", "k5")]):
        seeds, mean, ci = _expected(label, ref)
        assert cells[3:7] == [label, ref, str(len(seeds)), ", ".join(map(str, seeds))]
        assert cells[7] == "%+.2f" % mean
        assert cells[8] == "[%+.2f, %+.2f]" % ci
    assert "nothing" not in _chosen_section(md)


def test_chosen_comparison_without_the_seeds_that_did_not_train(tmp_path):
    """A collapse in either run of a chosen pair: the row over every seed, then one
    over the seeds where both trained."""
    r = str(tmp_path)
    finals = {"k5": {1: 0.86, 2: 0.10, 3: 0.85, 4: 0.865},
              "BIT-wu": {1: 0.87, 2: 0.88, 3: 0.10, 4: 0.875}}
    _write_finals(r, finals)
    _tiny_meta(r, [], comparisons=[{"experiment": "m2", "run": "k5", "vs": "BIT-wu"}])
    cells = _chosen_rows(report.generate(r, plots=False).markdown)
    assert [c[3] for c in cells] == ["k5", "k5 (seeds that trained)"]
    assert cells[0][5:7] == ["4", "1, 2, 3, 4"]
    assert cells[1][5:7] == ["2", "1, 4"]     # seed 2 (k5) and 3 (BIT-wu) left out
    kept = [100 * (finals["k5"][s] - finals["BIT-wu"][s]) for s in (1, 4)]
    assert cells[1][7] == "%+.2f" % (sum(kept) / 2)


@pytest.mark.parametrize("state", [
    # a resumable run stopped between sittings: its last logged epoch is not its final one
    {"status": "failed", "failure": "received SIGTERM",
     "sittings": [{"status": "failed", "resumed_from_iteration": None}]},
    # a sitting under way, or killed before it could write its end
    {"status": "running", "sittings": []},
], ids=["stopped", "running"])
def test_a_run_in_progress_is_listed_not_compared(tmp_path, state):
    """A run in progress is listed as such (and in the runs list with its status)
    and kept out of the tables."""
    r = str(tmp_path)
    _write(r, "SSGD", 1, 0.88)
    _write(r, "k5", 1, 0.30)
    path = os.path.join(r, "runs", "m2", "k5-M2-loopback-s1", "run.json")
    with open(path) as f:
        meta = json.load(f)
    meta.update(state, expected_epochs=10)
    with open(path, "w") as f:
        json.dump(meta, f)
    rep = report.generate(r, plots=False)
    assert [row["label"] for row in rep.accuracy_rows] == ["SSGD"]
    assert "m2/k5-M2-loopback-s1, %d of 10 epochs logged" % EPOCHS in rep.markdown
    assert "| m2/k5-M2-loopback-s1 | %s |" % state["status"] in rep.markdown


def test_a_killed_sitting_of_unknown_length_marks_the_wall_time(tmp_path):
    """A run one of whose sittings was killed at an unknown time shows its wall time
    as a lower bound (the known sittings' sum), and its sittings in the note."""
    r = str(tmp_path)
    _write(r, "SSGD", 1, 0.88)
    path = os.path.join(r, "runs", "m2", "SSGD-M2-loopback-s1", "run.json")
    with open(path) as f:
        meta = json.load(f)
    sittings = [{"status": "killed", "wall_time": None, "resumed_from_iteration": None},
                {"status": "ok", "wall_time": 61.4, "resumed_from_iteration": 400}]
    meta.update(sittings=sittings, wall_time=61.4, wall_time_incomplete=True)
    with open(path, "w") as f:
        json.dump(meta, f)
    md = report.generate(r, plots=False).markdown
    row = [line for line in md.splitlines()
           if line.startswith("| m2/SSGD-M2-loopback-s1 |")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert cells[6] == ">= 61" and cells[9] == "2 sittings, resumed at iteration 400"


def test_t90_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 30):
        assert paired.t90(df) == pytest.approx(stats.t.ppf(0.95, df), abs=1e-3)
    assert paired.t90(200) == pytest.approx(stats.norm.ppf(0.95), abs=1e-3)
    with pytest.raises(ValueError):
        paired.t90(0)


def tost_wording(lower_passes, upper_passes, margin):
    """The verdict the report should print, given which one-sided test passed (lower:
    H0 mean <= -margin rejected; upper: H0 mean >= +margin rejected)."""
    if lower_passes and upper_passes:
        return "equivalent"
    if lower_passes:        # not worse by the margin; a larger gain not excluded
        return "not shown equivalent (upper end above +%g)" % margin
    if upper_passes:
        return "not shown equivalent (lower end below -%g)" % margin
    return "not shown equivalent (both ends outside +-%g)" % margin


@pytest.mark.parametrize("diffs, margin", [
    ([0.10, -0.05, 0.20, 0.00, 0.05], 0.5),    # tight around 0: equivalent
    ([0.10, -0.40, 0.60, 0.00, 0.30], 0.5),    # centred but wide
    ([0.45, 0.40, 0.50, 0.42, 0.48], 0.5),     # tight but near the margin
    ([-0.60, -0.70, -0.65], 0.5),              # clearly below
    ([0.2, -0.1], 1.0),                        # 2 seeds, wide margin
])
def test_equivalence_is_tost_at_the_margin(diffs, margin):
    """TOST computed here from scipy's one-sided tests: equivalent iff both one-sided
    p-values (H0: mean <= -margin, H0: mean >= +margin) are below 0.05."""
    stats = pytest.importorskip("scipy.stats")
    d = paired.PairedDiff("e", 2, None, "k5", "SSGD", list(range(len(diffs))), diffs)
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1)) / math.sqrt(n)
    p_low = stats.t.sf((mean + margin) / se, n - 1)
    p_high = stats.t.cdf((mean - margin) / se, n - 1)
    assert d.equivalence(margin) == tost_wording(p_low < 0.05, p_high < 0.05, margin)
    lo, hi = d.ci90
    half = stats.t.ppf(0.95, n - 1) * se
    assert lo == pytest.approx(mean - half, abs=1e-3) and hi == pytest.approx(mean + half, abs=1e-3)


def test_equivalence_outcomes_and_bad_margin():
    eq = paired.PairedDiff("e", 2, None, "a", "b", [1, 2, 3, 4, 5], [0.1, -0.05, 0.2, 0.0, 0.05])
    wide = paired.PairedDiff("e", 2, None, "a", "b", [1, 2, 3], [0.9, -0.9, 0.1])
    one = paired.PairedDiff("e", 2, None, "a", "b", [1], [0.0])
    assert eq.equivalence(0.5) == "equivalent"
    assert wide.equivalence(0.5) == "not shown equivalent (both ends outside +-0.5)"
    above = paired.PairedDiff("e", 2, None, "a", "b", [1, 2, 3, 4, 5],
                              [0.54, -0.28, -0.15, 0.34, 0.50])
    assert above.equivalence(0.5) == "not shown equivalent (upper end above +0.5)"
    below = paired.PairedDiff("e", 2, None, "a", "b", [1, 2, 3], [-0.60, -0.70, -0.65])
    assert below.equivalence(0.5) == "not shown equivalent (lower end below -0.5)"
    assert wide.verdict == "not distinguishable"      # an interval with 0 is not "equal"
    assert one.equivalence(0.5) == "one seed: no interval"
    # a seed count fixed before the runs: fewer pairs leave the verdict open
    assert eq.equivalence(0.5, min_seeds=5) == "equivalent"
    assert eq.equivalence(0.5, min_seeds=6) == "not decided (5 of 6 seeds)"
    assert wide.equivalence(0.5, min_seeds=5) == "not decided (3 of 5 seeds)"
    with pytest.raises(ValueError):
        eq.equivalence(0)


def test_report_shows_tost_at_the_spec_margin(root):
    """With the spec's equivalence_margin the paired tables gain the 90 % interval and the
    TOST verdict, each row's computed here from its differences with scipy."""
    stats = pytest.importorskip("scipy.stats")
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump({"equivalence_margin": 0.5}, f)
    md = report.generate(root, plots=False).markdown
    assert "TOST at +-0.5" in md and "90 % CI" in md
    for label, ref in (("k5", "SSGD"), ("BIT-wu", "SSGD")):
        seeds = sorted(set(FINAL[label]) & set(FINAL[ref]))
        d = [100 * (FINAL[label][s] - FINAL[ref][s]) for s in seeds]
        n, mean = len(d), sum(d) / len(d)
        se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)
        half = stats.t.ppf(0.95, n - 1) * se
        verdict = tost_wording(-0.5 < mean - half, mean + half < 0.5, 0.5)
        line = next(l for l in md.splitlines()
                    if l.startswith("| m2 | 2 | loopback | %s | %s |" % (label, ref)))
        assert line.endswith("| [%+.2f, %+.2f] | %s |" % (mean - half, mean + half, verdict))
    # without a margin, no TOST column
    os.remove(os.path.join(root, "reproduce.json"))
    assert "TOST" not in report.generate(root, plots=False).markdown


@pytest.mark.parametrize("margin", [0, -0.5, "0.5", True])
def test_spec_refuses_a_bad_equivalence_margin(margin):
    from mxnet_cpsgd.repro import spec as spec_mod
    bad = {"script": "scripts/train_mnist.py", "runs": [{"label": "S", "algorithm": "ssgd"}],
           "equivalence_margin": margin}
    with pytest.raises(spec_mod.SpecError, match="equivalence_margin"):
        spec_mod.validate_spec(bad)
    spec_mod.validate_spec(dict(bad, equivalence_margin=0.5))


def test_report_waits_for_the_spec_min_seeds(root):
    """With equivalence_min_seeds above a row's pairs its verdict is 'not decided', the
    interval still shown; the note says how many seeds the verdict waits for."""
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump({"equivalence_margin": 0.5, "equivalence_min_seeds": 99}, f)
    md = report.generate(root, plots=False).markdown
    assert "waits for 99 paired seeds" in md
    line = next(l for l in md.splitlines() if l.startswith("| m2 | 2 | loopback | k5 | SSGD |"))
    n = len(set(FINAL["k5"]) & set(FINAL["SSGD"]))
    assert line.endswith("| not decided (%d of 99 seeds) |" % n)


def test_an_experiment_sets_its_own_min_seeds(root):
    """An experiment's own equivalence_min_seeds decides its rows (the spec's waits for
    99 here, the experiment's for the pairs it has); the note names both."""
    n = len(set(FINAL["k5"]) & set(FINAL["SSGD"]))
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump({"equivalence_margin": 0.5, "equivalence_min_seeds": 99,
                   "experiments": [{"name": "m2", "equivalence_min_seeds": n}]}, f)
    md = report.generate(root, plots=False).markdown
    assert "waits for 99 paired seeds" in md
    assert "for experiment m2, %d (its own" % n in md
    line = next(l for l in md.splitlines() if l.startswith("| m2 | 2 | loopback | k5 | SSGD |"))
    assert "not decided" not in line
    # one seed more than the pairs there are: not decided, for this experiment's rows
    with open(os.path.join(root, "reproduce.json"), "w") as f:
        json.dump({"equivalence_margin": 0.5,
                   "experiments": [{"name": "m2", "equivalence_min_seeds": n + 1}]}, f)
    md = report.generate(root, plots=False).markdown
    line = next(l for l in md.splitlines() if l.startswith("| m2 | 2 | loopback | k5 | SSGD |"))
    assert line.endswith("| not decided (%d of %d seeds) |" % (n, n + 1))


def test_spec_refuses_a_bad_experiment_min_seeds():
    from mxnet_cpsgd.repro import spec as spec_mod
    exp = {"name": "e", "runs": [{"label": "S", "algorithm": "ssgd"}]}
    base = {"script": "scripts/train_mnist.py", "experiments": [dict(exp, equivalence_min_seeds=1)]}
    with pytest.raises(spec_mod.SpecError, match="equivalence_min_seeds.*experiment 'e'"):
        spec_mod.validate_spec(base)
    spec_mod.validate_spec(dict(base, experiments=[dict(exp, equivalence_min_seeds=3)]))


@pytest.mark.parametrize("value", [1, 0, 2.5, "5", True])
def test_spec_refuses_a_bad_equivalence_min_seeds(value):
    from mxnet_cpsgd.repro import spec as spec_mod
    base = {"script": "scripts/train_mnist.py", "runs": [{"label": "S", "algorithm": "ssgd"}]}
    with pytest.raises(spec_mod.SpecError, match="equivalence_min_seeds"):
        spec_mod.validate_spec(dict(base, equivalence_min_seeds=value))
    spec_mod.validate_spec(dict(base, equivalence_min_seeds=5))
