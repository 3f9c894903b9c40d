"""cpsgd-reproduce experiments of ``kind: bench`` and cpsgd-bench's algorithm variants.

* the variants syntax of ``cpsgd-bench --algorithms`` and its errors;
* the report's bench section from a small fixture (a results.json as cpsgd-bench
  writes it): the paper-layout table, the published ratios and ours, checked
  against the fixture's numbers computed here independently, and the sweep plot;
* one real ``cpsgd-reproduce`` of a tiny bench experiment (LeNet-5, 2 workers,
  emulated compute, 3 timed iterations), in its own process group with a hang
  guard; numbers are not asserted, only that they exist and are consistent.
"""
import json
import os
import subprocess
import sys

import pytest
import yaml
from procs import remove_networks_of, stop_group

from mxnet_cpsgd.bench import cli as bench_cli
from mxnet_cpsgd.bench.results import add_ratios
from mxnet_cpsgd.bench.runs import BenchError, netns_available, parse_variants, reference_labels
from mxnet_cpsgd.repro import bench_report, report
from mxnet_cpsgd.repro import runner as reproduce

#: a hang guard, not a timing check (the end-to-end run takes about 25 s idle)
BUDGET_S = 240


# ----------------------------------------------------------------------------
# cpsgd-bench --algorithms variants

def _validated(algorithms, *extra):
    args = bench_cli._parser().parse_args(["--algorithms", algorithms] + list(extra))
    bench_cli._validate(args)
    return args


def test_variants_parse_and_type_knobs():
    args = _validated("ssgd,BIT=bitsgd:threshold=1,k2=cpsgd:correction_period=2,"
                      "k5=cpsgd:correction-period=5:warmup_steps=4,cpsgd")
    assert args.algorithm_list == ["ssgd", "BIT", "k2", "k5", "cpsgd"]
    assert args.variants["BIT"].knobs == {"threshold": 1.0}
    assert args.variants["k5"].knobs == {"correction_period": 5, "warmup_steps": 4}
    assert args.variants["k5"].spec() == "k5=cpsgd:correction_period=5:warmup_steps=4"
    assert args.variants["ssgd"].spec() == "ssgd"
    # ratios divide by the first variant of a store without knobs
    refs = reference_labels(args.variants.values())
    assert refs == {"ssgd": "ssgd", "cpsgd": "cpsgd"}
    # a plain name keeps today's behaviour (lower-cased)
    assert [v.label for v in parse_variants("SSGD, bitsgd")] == ["ssgd", "bitsgd"]


@pytest.mark.parametrize("algorithms, message", [
    ("cpsgd:correction_period=2", "knobs need a label"),
    ("k2=cpsgd:corection_period=2", "unknown knob 'corection_period'"),
    ("k2=ssgd:correction_period=2", "store ssgd does not use knob 'correction_period'"),
    ("k2=cpsgd:correction_period=0", "integer >= 1"),
    ("k2=cpsgd:warmup_steps=50", "warmup_steps (50) > --warmup-iters (10)"),
    ("bitsgd=cpsgd", "names a store"),
    ("k2=nosuchstore", "unknown algorithm(s) nosuchstore"),
    ("a=ssgd,a=bitsgd", "used twice"),
    ("a/b=ssgd", "a label is letters"),
    ("compute=ssgd", "compute-only"),
    ("pk=horovod:exchange=per_key", "store horovod does not use knob 'exchange'"),
    ("pk=cpsgd:exchange=per_key", "store cpsgd does not use knob 'exchange'"),
    ("pk=fp16:exchange=later", "must be one of 'per_step', 'per_key', got 'later'"),
])
def test_variant_errors(algorithms, message):
    with pytest.raises(BenchError) as err:
        _validated(algorithms)
    assert message in str(err.value)


def test_bench_ratios_use_the_plain_variant():
    """/bitsgd divides by the knob-less bitsgd variant, whatever its label."""
    rows = [{"rate": "none", "algorithm": l, "mean_ms": t, "peak_rss_mb": 1.0}
            for l, t in (("BIT", 50.0), ("BIT1", 40.0), ("k5", 45.0))]
    variants = [{"label": "BIT", "store": "bitsgd", "knobs": {}},
                {"label": "BIT1", "store": "bitsgd", "knobs": {"threshold": 1.0}},
                {"label": "k5", "store": "cpsgd", "knobs": {"correction_period": 5}}]
    add_ratios(rows, 30.0, variants)
    assert rows[2]["vs_bitsgd"] == pytest.approx(45.0 / 50.0)
    assert rows[1]["vs_bitsgd"] == pytest.approx(40.0 / 50.0)
    assert rows[2]["vs_ssgd"] is None


# ----------------------------------------------------------------------------
# the report from a fixture

REFERENCE = {"columns": ["SSGD", "BIT", "k2", "k5"],
             "rows": {"Te M=4": [2.24, 2.22, 1.88, 1.86], "Te M=2": [4.32, 3.65, 3.61, 3.51],
                      "Tc M=4": [2.19, 2.26, 2.14, 2.08]}}
#: ms/iter per M (and swept value) of the fixture
FIXTURE_MS = {(4, 100): {"SSGD": 216.4, "BIT": 184.0, "k2": 171.0, "k5": 167.0},
              (2, 100): {"SSGD": 137.7, "BIT": 115.1, "k2": 104.0, "k5": 101.6},
              (4, 200): {"SSGD": 260.0, "BIT": 240.0, "k2": 215.0, "k5": 212.0},
              (2, 200): {"SSGD": 210.0, "BIT": 205.0, "k2": 203.0, "k5": 201.0}}


def _results_json(m, compute_ms, ms, rate="100mbit"):
    """A results.json as cpsgd-bench writes it (the fields the report reads)."""
    rows = [{"rate": "-", "algorithm": "compute", "failure": None, "mean_ms": compute_ms}]
    for label, t in ms.items():
        rows.append({"rate": rate, "algorithm": label, "failure": None, "mean_ms": t,
                     "transfer_bound_ms": 90.0 + m, "vs_floor": t / max(compute_ms, 90.0 + m),
                     "max_link_bytes_per_iter": 1.1e6 + m, "busiest_link": "host 0 up",
                     "tx_bytes_per_iter": 7.0e5, "cpu_floor_ms": 80.0,
                     "other_cpu_cores": 0.1})
    variants = [{"label": l, "store": {"SSGD": "ssgd", "BIT": "bitsgd"}.get(l, "cpsgd"),
                 "knobs": {"correction_period": int(l[1:])} if l.startswith("k") else {}}
                for l in ms]
    return {"config": {"model": "cifar_resnet20_v1", "num_workers": m, "batch_size": 32,
                       "placement": "colocated", "emulate_compute": compute_ms,
                       "iters": 20, "warmup_iters": 10, "algo_warmup_steps": 5,
                       "threshold": 0.5, "correction_period": 5, "rates": [rate],
                       "variants": variants},
            "compute_ms": compute_ms, "rows": rows, "runs": []}


def _write_fixture(out, sweep):
    points = sorted(FIXTURE_MS) if sweep else [(4, 100), (2, 100)]
    for order, (m, compute) in enumerate(points):
        inv_id = "te/M%d" % m + ("-emulate-compute%d" % compute if sweep else "")
        directory = os.path.join(out, "bench", inv_id)
        os.makedirs(directory)
        meta = {"invocation_id": inv_id, "order": order, "experiment": "te",
                "num_workers": m, "sweep_flag": "emulate-compute" if sweep else None,
                "sweep_value": compute if sweep else None,
                "labels": ["SSGD", "BIT", "k2", "k5"], "reference": REFERENCE,
                "compare": [["k5", "BIT"], ["k5", "SSGD"]], "status": "ok",
                "wall_time": 60.0, "command_text": "cpsgd-bench ...", "failure": None}
        with open(os.path.join(directory, "invocation.json"), "w") as f:
            json.dump(meta, f)
        with open(os.path.join(directory, "results.json"), "w") as f:
            json.dump(_results_json(m, float(compute), FIXTURE_MS[(m, compute)]), f)


def test_report_from_fixture(tmp_path):
    out = str(tmp_path)
    _write_fixture(out, sweep=False)
    rep = report.generate(out)
    md = rep.markdown
    # the paper layout: rows M=4 then M=2, columns the labels, then compute-only
    assert "|  | SSGD | BIT | k2 | k5 | compute-only |" in md
    assert "| M=4 | 216.4 | 184.0 | 171.0 | 167.0 | 100.0 |" in md
    assert "| M=2 | 137.7 | 115.1 | 104.0 | 101.6 | 100.0 |" in md
    assert "| Te M=4 | 2.24 | 2.22 | 1.88 | 1.86 |" in md      # the published table
    (exp,) = rep.bench
    rows = {(r["num_workers"], r["pair"]): r for r in bench_report.ratio_rows(exp)}
    for m, te_row in ((4, 0), (2, 1)):
        ms = FIXTURE_MS[(m, 100)]
        published = dict(zip(REFERENCE["columns"], list(REFERENCE["rows"].values())[te_row]))
        for a, b in (("k5", "BIT"), ("k5", "SSGD")):
            row = rows[(m, "%s/%s" % (a, b))]
            assert row["ours"] == pytest.approx(ms[a] / ms[b])
            assert row["published"] == pytest.approx(published[a] / published[b])
    # published k5/BIT 1.86/2.22 = 0.84 at M=4, 3.51/3.65 = 0.96 at M=2
    assert "| M=4 | %.2f | 0.84 | %.2f | 0.83 |" % (167.0 / 184.0, 167.0 / 216.4) in md
    assert "| M=2 | %.2f | 0.96 | %.2f | 0.81 |" % (101.6 / 115.1, 101.6 / 137.7) in md
    # bound, bytes and compute-only per run
    assert "| M=4 | k5 | 167.0 | 1.67 | 94.0 | 1.67 | 1100 | host 0 up | 700 | 80 | 0.10 |" \
        in md
    assert not rep.figures                  # no sweep, no plot
    # the report is regenerated from the files alone
    assert report.generate(out).markdown == md


def test_report_sweep_plot(tmp_path):
    out = str(tmp_path)
    _write_fixture(out, sweep=True)
    rep = report.generate(out)
    assert "| M=2, emulate-compute 200 | 210.0 | 205.0 | 203.0 | 201.0 | 200.0 |" in rep.markdown
    assert "| M=4, emulate-compute 200 | %.2f | 0.84 |" % (212.0 / 240.0) in rep.markdown
    assert rep.figures == ["bench-sweep-te.png"]
    assert os.path.getsize(os.path.join(out, "bench-sweep-te.png")) > 1000


# ----------------------------------------------------------------------------
# the spec

BENCH_SPEC = {
    "name": "tinybench",
    "title": "tiny bench",
    "experiments": [{
        "name": "te",
        "kind": "bench",
        "bench_args": {"model": "lenet", "emulate-compute": 20, "iters": 3,
                       "warmup-iters": 2, "batch-size": 16, "job-timeout": 60},
        "workers": [2],
        "runs": [{"label": "SSGD", "algorithm": "ssgd"},
                 {"label": "k{correction_period}", "algorithm": "cpsgd",
                  "grid": {"correction_period": [2]}}],
        "reference": {"columns": ["SSGD", "k2"], "rows": {"Te M=2": [4.32, 3.61]}},
        "compare": [["k2", "SSGD"]],
    }],
}


def _bench_spec(bench_rates, **changes):
    spec = json.loads(json.dumps(BENCH_SPEC))
    spec["experiments"][0]["bench_args"]["rates"] = bench_rates
    spec["experiments"][0].update(changes)
    return spec


def test_bench_spec_expands_to_commands():
    spec = _bench_spec("100mbit", workers=[4, 2], sweep={"emulate_compute": [50, 100]})
    del spec["experiments"][0]["bench_args"]["emulate-compute"]
    reproduce.validate_spec(spec)
    plans = reproduce.expand_bench_plans(spec)
    assert reproduce.expand(spec) == []      # no training runs
    assert [p.invocation_id for p in plans] == [
        "te/M4-emulate-compute50", "te/M4-emulate-compute100",
        "te/M2-emulate-compute50", "te/M2-emulate-compute100"]
    flags = plans[0].flags()
    assert flags[:2] == ["-n", "4"]
    assert flags[-2:] == ["--algorithms", "SSGD=ssgd,k2=cpsgd:correction_period=2"]
    assert "--emulate-compute 50" in " ".join(flags)
    assert plans[0].fingerprint() != plans[1].fingerprint()
    selected = reproduce.select_bench(plans, ["te/M2*"], [])
    assert [p.num_workers for p in selected] == [2, 2]


@pytest.mark.parametrize("change, message", [
    ({"rates": ["100mbit"]}, "give rates in bench_args"),
    ({"bench_args": {"algorithms": "ssgd"}}, "set by cpsgd-reproduce"),
    ({"sweep": {"repeats": 3}}, "needs a list"),
    ({"sweep": {"iters": [3], "rates": ["none"]}}, "one bench flag"),
    ({"compare": [["k2"]]}, "pairs"),
    ({"reference": {"columns": ["SSGD"], "rows": {"M=2": [1, 2]}}}, "needs 1 values"),
    ({"kind": "nope"}, "kind must be"),
    ({"runs": [{"label": "SSGD", "algorithm": "ssgd", "workers": [2]}]}, "not for bench runs"),
    ({"args": {"x": 1}}, "for training experiments"),
])
def test_bad_bench_specs(change, message):
    spec = _bench_spec("none", **change)
    with pytest.raises(reproduce.SpecError) as err:
        reproduce.validate_spec(spec)
        reproduce.expand_bench_plans(spec)
    assert message in str(err.value)


# ----------------------------------------------------------------------------
# end to end

def _teardown(proc, out):
    """Stop a reproduction still running (its process group) and remove the
    emulated networks its bench jobs created; returns what was left behind."""
    stop_group(proc, 60)
    return remove_networks_of(os.path.join(out, "bench", "*", "*", "runs", "*", "logs",
                                           "launcher.log"))


def _reproduce(argv, out, budget):
    proc = subprocess.Popen([sys.executable, "-m", "mxnet_cpsgd.repro"] + argv,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    left = []
    try:
        output, _ = proc.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        left = _teardown(proc, out)
        pytest.fail("cpsgd-reproduce took more than %d s" % budget)
    finally:
        left = left or _teardown(proc, out)
    print(output)
    assert not left, "namespaces/links left behind: %s" % left
    return proc.returncode, output


def test_bench_experiment_end_to_end(tmp_path):
    rates = "none" if netns_available() else "loopback"
    spec_path = str(tmp_path / "spec.yaml")
    with open(spec_path, "w") as f:
        yaml.safe_dump(_bench_spec(rates), f)
    out = str(tmp_path / "out")
    # --allow-dirty: the tree under test may have uncommitted changes
    code, output = _reproduce([spec_path, "-o", out, "--allow-dirty"], out, BUDGET_S)
    inv_dir = os.path.join(out, "bench", "te", "M2")
    log = os.path.join(inv_dir, "output.log")
    assert code == 0, open(log).read()[-3000:] if os.path.exists(log) else output
    with open(os.path.join(inv_dir, "invocation.json")) as f:
        meta = json.load(f)
    assert meta["status"] == "ok" and meta["wall_time"] > 0
    with open(os.path.join(inv_dir, "results.json")) as f:
        result = json.load(f)
    assert result["config"]["num_workers"] == 2
    assert result["config"]["emulate_compute"] == 20
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert set(rows) == {"compute", "SSGD", "k2"}
    assert all(r["failure"] is None and r["mean_ms"] > 0 for r in rows.values())
    k2 = next(r for r in result["runs"] if r["algorithm"] == "k2")
    assert (k2["store"], k2["knobs"]) == ("cpsgd", {"correction_period": 2})
    assert k2["workers"][0]["knobs"]["correction_period"] == 2
    for name in ("results.md", "time_vs_rate.png"):
        assert os.path.getsize(os.path.join(inv_dir, name)) > 0
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert "| M=2 | %.1f | %.1f | %.1f |" % (rows["SSGD"]["mean_ms"], rows["k2"]["mean_ms"],
                                             result["compute_ms"]) in md
    assert "| M=2 | %.2f | %.2f |" % (rows["k2"]["mean_ms"] / rows["SSGD"]["mean_ms"],
                                      3.61 / 4.32) in md
    # complete: a second run starts nothing; --report-only rebuilds the same tables
    code, output = _reproduce([spec_path, "-o", out], out, 60)
    assert code == 0 and "te/M2: complete, skipped" in output, output
    code, output = _reproduce([spec_path, "-o", out, "--report-only"], out, 60)
    assert code == 0, output
    with open(os.path.join(out, "report.md")) as f:
        assert "| M=2 | %.1f |" % rows["SSGD"]["mean_ms"] in f.read()
