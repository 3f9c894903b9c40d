"""--emulate-compute and --val-every-iters on a real 2-worker job, and the measured
time-to-accuracy table from validation logs.

The padding must not change the numbers: a padded job (with validations every few
iterations) and an unpadded one on the same seed end with the same weights, bit for
bit (the checkpoints' SHA-256).  The padded job's training clock is at least the
emulated compute of its iterations (a lower bound the padding guarantees: no upper
limit is asserted).
"""
import json
import os
import sys
import uuid

import pytest
from procs import kill_all, processes_with_env

from mxnet_cpsgd.repro import measured_tta
from mxnet_cpsgd.repro.logs import Run
from mxnet_cpsgd.training import options

try:
    import mlxtend  # noqa: F401
    HAVE_MLXTEND = True
except ImportError:
    HAVE_MLXTEND = False

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERS, EVERY, EMULATED_MS = 12, 4, 25.0


def _job(tmp_path, name, *extra):
    from mxnet_cpsgd.cluster import launch
    out = tmp_path / name
    command = [sys.executable, os.path.join(REPO, "scripts", "train_mnist.py"),
               "--algorithm", "ssgd", "--dataset", "mnist-5k", "--seed", "3",
               "--max-iters", str(ITERS), "--checkpoint-dir", str(out / "ckpt"),
               "--log-json", str(out / "log.json")] + list(extra)
    tag = uuid.uuid4().hex
    env = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "CPSGD_TTA_TEST": tag}
    try:
        result = launch.run_job(command, 2, 1, env=env, timeout=30, job_timeout=150,
                                stream=None)
    finally:
        leftover = processes_with_env(CPSGD_TTA_TEST=tag)
        kill_all(leftover)
    assert result.returncode == 0, "%s\n%s" % (result.failure, result.output[-3000:])
    assert not leftover
    meta = json.loads((out / "ckpt" / ("iter-%09d" % ITERS) / "checkpoint.json").read_text())
    return out, meta["params_sha256"]


def _lines(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.skipif(not HAVE_MLXTEND, reason="mlxtend not installed")
def test_padding_and_interval_validation_keep_the_weights(tmp_path):
    plain, plain_sha = _job(tmp_path, "plain")
    padded, padded_sha = _job(tmp_path, "padded", "--emulate-compute", str(EMULATED_MS),
                              "--val-every-iters", str(EVERY), "--no-comm-timing")
    assert padded_sha == plain_sha
    assert not (plain / "log-val.json").exists()  # no timing flag: no validation log
    for name in ("log-val.json", "log-val.rank1.json"):
        points = _lines(padded / name)
        assert [p["iteration"] for p in points] == [4, 8, 12]
        clocks = [p["train_clock"] for p in points]
        assert clocks == sorted(clocks)
        # the padding's lower bound: every iteration takes at least the emulated time
        assert clocks[-1] >= ITERS * EMULATED_MS / 1e3
        assert all(p["emulate_compute_ms"] == EMULATED_MS and p["time_scale"] == 1.0
                   for p in points)
    epoch = _lines(padded / "log.json")[-1]
    assert epoch["val_acc"] == points[-1]["val_acc"] and epoch["total_iterations"] == ITERS
    plain_epoch = _lines(plain / "log.json")[-1]
    assert plain_epoch["val_acc"] == epoch["val_acc"]
    assert "train_clock" not in plain_epoch


@pytest.mark.parametrize("argv, message", [
    (["--emulate-compute", "0"], "--emulate-compute must be > 0"),
    (["--time-scale", "4"], "needs --emulate-compute"),
    (["--emulate-compute", "10", "--time-scale", "0.5"], "--time-scale must be >= 1"),
    (["--val-every-iters", "0"], "--val-every-iters must be >= 1"),
])
def test_timing_flags_refused(argv, message):
    parser = options.build_parser("t")
    with pytest.raises(options.UsageError, match=message):
        options.validate_timing_args(parser.parse_args(argv))


def _write_val(run_dir, rank, points, scale=2.0, samples=100):
    os.makedirs(run_dir, exist_ok=True)
    name = "log-val.json" if rank == 0 else "log-val.rank%d.json" % rank
    with open(os.path.join(run_dir, name), "w") as f:
        for iteration, clock, acc in points:
            f.write(json.dumps({"iteration": iteration, "val_acc": acc,
                                "val_samples": samples, "train_clock": clock,
                                "time_scale": scale, "compute_overrun": 0.0}) + "\n")


def test_measured_cells_and_projection(tmp_path):
    """Two seeds of S-SGD and of a faster run: the target is S-SGD's mean final
    accuracy minus the drop; ranks combine by samples, the clock is the slowest
    rank's divided by the dilation; the projection is iterations x bench ms."""
    runs = []
    curves = {  # label -> seed -> rank -> [(iteration, dilated clock, accuracy)]
        "SSGD": {1: {0: [(10, 20.0, 0.80), (20, 40.0, 0.90)],
                     1: [(10, 22.0, 0.80), (20, 41.0, 0.90)]},
                 2: {0: [(10, 18.0, 0.70), (20, 38.0, 0.88)],
                     1: [(10, 18.0, 0.74), (20, 38.0, 0.88)]}},
        "cp": {1: {0: [(10, 12.0, 0.88), (20, 24.0, 0.89)],
                   1: [(10, 12.0, 0.90), (20, 24.0, 0.89)]},
               2: {0: [(10, 10.0, 0.80), (20, 22.0, 0.885)],
                   1: [(10, 10.0, 0.80), (20, 26.0, 0.885)]}},
    }
    for label, seeds in curves.items():
        for seed, ranks in seeds.items():
            run_dir = str(tmp_path / ("%s-s%d" % (label, seed)))
            for rank, pts in ranks.items():
                _write_val(run_dir, rank, pts)
            knobs = {"warmup_steps": 5} if label == "cp" else {}
            runs.append(Run(run_dir, {"label": label, "seed": seed, "experiment": "e",
                                      "num_workers": 2, "rate": "10mbit", "knobs": knobs}))
    cells = measured_tta.measured_cells(runs, {"drops": [1.5]})
    by_label = {c.label: c for c in cells}
    target = (0.90 + 0.88) / 2 - 0.015
    assert by_label["SSGD"].target == pytest.approx(target)
    # seed 1: 0.875 needs iteration 20 (clock max(40, 41) / 2); seed 2 likewise (38 / 2)
    assert by_label["SSGD"].seconds == {1: 20.5, 2: 19.0}
    # cp seed 1 reaches at iteration 10 (mean 0.89); seed 2 at 20 (max(22, 26) / 2)
    assert by_label["cp"].seconds == {1: 6.0, 2: 13.0}
    assert by_label["cp"].iterations == {1: 10, 2: 20}
    assert (by_label["cp"].warmup, by_label["SSGD"].warmup) == (5, 0)
    assert by_label["cp"].projected(50.0, 50.0) == {1: 0.5, 2: 1.0}
    text = measured_tta.measured_markdown(cells, {"e": {"cp": 50.0, "SSGD": 50.0}})
    cp_row = next(line for line in text.splitlines() if "| cp |" in line)
    # paired: (6 - 20.5, 13 - 19) = (-14.5, -6): mean -10.25; ratio 0.75 / 9.5
    assert "-10.2 [" in cp_row and "| 0.08 |" in cp_row
    # the projection's times from a bench experiment at the same M and rate
    from mxnet_cpsgd.repro.bench_report import BenchExperiment, Point
    bench = BenchExperiment("b", ["cp"], [
        Point(2, None, "20mbit", {"cp": {"mean_ms": 70.0}}, 60.0),
        Point(2, None, "10mbit", {"cp": {"mean_ms": 80.0}}, 60.0)], [], [])
    assert measured_tta.bench_times(cells, {"bench_experiments": {"e": "b"}}, [bench]) == \
        {"e": {"cp": 80.0}}
    assert measured_tta.bench_times(cells, {"bench_experiments": {"e": "b"},
                                            "bench_ms_per_iteration": {"e": {"cp": 5.0}}},
                                    [bench]) == {"e": {"cp": 5.0}}
    # a dense warm-up of 15 iterations: those at the reference's ms, the rest at the run's
    warm = measured_tta.Cell("e", 2, "10mbit", "cp", "SSGD", 1.5, target, warmup=15,
                             seconds={1: 6.0, 2: 13.0}, iterations={1: 10, 2: 20})
    assert warm.projected(50.0, 200.0) == {1: pytest.approx(10 * 0.2),
                                          2: pytest.approx(15 * 0.2 + 5 * 0.05)}
    assert warm.projected(50.0) == {}  # no reference time, no projection
    assert measured_tta.check_settings({"drops": [0]}) is not None
    assert measured_tta.check_settings({"drops": [0.5], "bench_ms_per_iteration":
                                        {"e": {"cp": 50.0}}}) is None


def test_spec_placement_and_dilated_rate():
    """placement colocated: a server per worker by default; a run's time-scale dilates
    its rate for the launcher; separate runs keep their fingerprints' old form."""
    from mxnet_cpsgd.repro import emulated_hosts, spec as spec_mod
    base = {"script": "scripts/train_mnist.py", "workers": [4], "rates": ["30mbit,fair"],
            "args": {"emulate-compute": 100, "time-scale": 3},
            "runs": [{"label": "SSGD", "algorithm": "ssgd"}]}
    colocated = spec_mod.expand(dict(base, placement="colocated"))[0]
    separate = spec_mod.expand(base)[0]
    assert (colocated.num_servers, colocated.placement) == (4, "colocated")
    assert (separate.num_servers, separate.placement) == (1, "separate")
    assert colocated.fingerprint() != separate.fingerprint()
    # 30 Mbit/s dilated x3
    assert emulated_hosts.job_network("30mbit,fair", colocated.args) == "10000000bit,fair"
    assert emulated_hosts.job_network("30mbit", {}) == "30mbit"
    assert emulated_hosts.job_network(None, colocated.args) is None
    assert ("--emulate-network 30mbit,fair --time-scale 3 --placement colocated"
            in colocated.launch_text())
    with pytest.raises(spec_mod.SpecError, match="placement"):
        spec_mod.validate_spec(dict(base, placement="everywhere"))
    with pytest.raises(spec_mod.SpecError, match="measured_time_to_accuracy"):
        spec_mod.validate_spec(dict(base, measured_time_to_accuracy={"drop": [1]}))
