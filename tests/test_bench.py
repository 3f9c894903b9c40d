"""cpsgd-bench end to end on a tiny configuration (numbers printed, not asserted).

LeNet-5, 2 workers + 1 server, algorithms ssgd and cpsgd, 3 timed iterations,
at rate ``none`` and, where network namespaces are available (root + iproute2),
also at 100mbit, with ``--timeline``.  Only sanity is checked: the run succeeds,
times are positive, and the JSON, Markdown and PNG files exist and are not
empty.  The bench runs as a subprocess in its own process group; on a timeout or
failure the group gets SIGTERM (the launcher and the network emulation tear down
their jobs and namespaces), then SIGKILL, and every namespace the run created
is removed.
"""
import json
import os
import subprocess
import sys
import time

import pytest
from procs import remove_networks_of, stop_group

from mxnet_cpsgd.bench.output import markdown_table
from mxnet_cpsgd.bench.results import summarize
from mxnet_cpsgd.bench.runs import netns_available, parse_list, rate_bps
from mxnet_cpsgd.cluster import netem

#: a hang guard, not a timing check: the run takes about 40 s on an idle 2-core machine
BUDGET_S = 300


def _teardown(proc, out_dir):
    """Stop the bench if it still runs; remove and return what its jobs left."""
    stop_group(proc, 30)
    return remove_networks_of(os.path.join(out_dir, "runs", "*", "logs", "launcher.log"))


def test_bench_end_to_end(tmp_path):
    shaped = netns_available()
    rates = "none,100mbit" if shaped else "none"
    out_dir = str(tmp_path / "bench")
    args = ["--model", "lenet", "-n", "2", "-s", "1", "--batch-size", "16", "--rates", rates,
            "--algorithms", "ssgd,cpsgd", "--iters", "3", "--warmup-iters", "2",
            "--timeline", "--timeline-iters", "2", "--job-timeout", "60"]
    result = _run_bench(args, out_dir, BUDGET_S)
    for name in ("results.json", "results.md", "time_vs_rate.png"):
        path = os.path.join(out_dir, name)
        assert os.path.getsize(path) > 0, path
    rows = result["rows"]
    expected = {("-", "compute")} | {(r, a) for r in parse_list(rates)
                                     for a in ("ssgd", "cpsgd")}
    assert {(r["rate"], r["algorithm"]) for r in rows} == expected
    for row in rows:
        assert row["failure"] is None
        assert 0 < row["min_ms"] <= row["median_ms"] <= row["max_ms"], row
        assert row["peak_rss_mb"] > 0
        if row["algorithm"] != "compute" and shaped:
            assert row["bytes_per_iter"] > 0, row
            if rate_bps(row["rate"]) is not None:
                assert row["transfer_bound_ms"] > 0, row
    assert result["compute_ms"] > 0
    # timelines: one merged trace per distributed run, one PNG per rate
    for rate in parse_list(rates):
        png = os.path.join(out_dir, "timeline-%s.png" % rate)
        assert os.path.getsize(png) > 0, png
        for algorithm in ("ssgd", "cpsgd"):
            trace = os.path.join(out_dir, "timeline", "%s-%s.trace.json" % (rate, algorithm))
            with open(trace) as f:
                events = json.load(f)["traceEvents"]
            pids = {e["pid"] for e in events if e.get("ph") == "X"}
            assert pids == {0, 1}, (trace, pids)
            assert any(e.get("cat") in ("push", "pull") for e in events), trace
    print(markdown_table(rows))


def _run_bench(args, out_dir, budget):
    """Run cpsgd-bench with ``args``; returns its results.json."""
    cmd = [sys.executable, "-m", "mxnet_cpsgd.bench", "--no-progress", "--out-dir",
           out_dir] + list(args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    left = []
    try:
        output, _ = proc.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        left = _teardown(proc, out_dir)
        output = proc.stdout.read() if proc.stdout else ""
        pytest.fail("cpsgd-bench took more than %d s\n%s" % (budget, output[-3000:]))
    finally:
        left = left or _teardown(proc, out_dir)
    print(output)
    assert not left, "namespaces/links left behind: %s" % left
    assert proc.returncode == 0, output[-3000:]
    with open(os.path.join(out_dir, "results.json")) as f:
        return json.load(f)


def _horovod_available():
    try:
        import horovod.mxnet  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not netns_available(), reason="needs root and iproute2 (namespaces)")
@pytest.mark.skipif(not _horovod_available(), reason="horovod.mxnet not installed")
def test_bench_horovod_in_emulated_hosts(tmp_path):
    """A 2-worker Horovod/Gloo run, each worker on its own emulated host (own
    network and UTS namespace), all-reduce compressors on the same path (topk,
    and fp16 as a variant exchanging each key at once), and cpsgd with colocated
    servers; the links with the 'fair' queue."""
    out_dir = str(tmp_path / "bench")
    result = _run_bench(["--model", "lenet", "-n", "2", "--batch-size", "16",
                         "--rates", "100mbit",
                         "--algorithms", "horovod,topk,fp16pk=fp16:exchange=per_key,cpsgd",
                         "--iters", "3", "--warmup-iters", "2", "--no-compute-only",
                         "--queue", "fair", "--job-timeout", "90"], out_dir, 400)
    assert result["config"]["placement"] == "colocated"
    assert result["config"]["queue"] == "fair"
    assert {r["emulate_network"] for r in result["runs"]} == {"100mbit,fair"}
    with open(os.path.join(out_dir, "results.md")) as f:
        assert "Shaped links' queue: fair" in f.read()
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert set(rows) == {"horovod", "topk", "fp16pk", "cpsgd"}
    assert rows["topk"]["failure"] is None and rows["topk"]["vs_horovod"] > 0
    assert rows["fp16pk"]["failure"] is None and rows["fp16pk"]["vs_horovod"] > 0
    pk = next(r for r in result["runs"] if r["algorithm"] == "fp16pk")
    assert (pk["store"], pk["knobs"]) == ("fp16", {"exchange": "per_key"}), pk
    hvd = rows["horovod"]
    assert hvd["failure"] is None and hvd["mean_ms"] > 0
    # a ring all-reduce of 2 workers moves about the gradient each way per link
    assert hvd["tx_bytes_per_iter"] > hvd["param_bytes"] * 0.5, hvd
    assert set(hvd["link_bytes_per_iter"]) == {"host 0 up", "host 1 up",
                                               "host 0 down", "host 1 down"}
    assert rows["cpsgd"]["vs_horovod"] > 0
    # the drop counters are read from the fair links' leaf queues
    assert rows["cpsgd"].get("tbf_drops_per_iter") is not None, rows["cpsgd"]


def test_bench_four_workers_emulated_compute(tmp_path):
    """-n 4 with --emulate-compute: 4 hosts each with a worker and a server."""
    out_dir = str(tmp_path / "bench")
    rates = "100mbit" if netns_available() else "loopback"
    result = _run_bench(["--model", "lenet", "-n", "4", "--batch-size", "16",
                         "--rates", rates, "--algorithms", "cpsgd",
                         "--emulate-compute", "20", "--iters", "3", "--warmup-iters", "2",
                         "--job-timeout", "120"], out_dir, 400)
    cfg = result["config"]
    assert (cfg["num_workers"], cfg["num_servers"], cfg["emulate_compute"]) == (4, 4, 20.0)
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert rows["compute"]["mean_ms"] > 0 and rows["cpsgd"]["mean_ms"] > 0
    run = next(r for r in result["runs"] if r["algorithm"] == "cpsgd")
    assert len(run["workers"]) == 4
    layers = run["workers"][0]["emulated_layers"]
    assert layers and abs(sum(l["share"] for l in layers) - 1) < 1e-6
    if rates != "loopback":
        # each host's link bytes per timed iteration: they add up to at most the
        # window's (which also holds the final drain), and the busiest per iteration
        for w in run["workers"]:
            assert len(w["iter_tx_bytes"]) == len(w["iter_rx_bytes"]) == 3, w
            assert 0 < sum(w["iter_tx_bytes"]) <= w["tx_bytes"], w
            assert 0 < sum(w["iter_rx_bytes"]) <= w["rx_bytes"], w
    # per timed iteration, read in the worker's namespace: TCP counters only grow,
    # the machine's busy CPU seconds lie within 0 and its cores x the iteration
    for w in run["workers"]:
        assert len(w["iter_tcp_timeouts"]) == len(w["iter_tcp_retrans"]) == 3, w
        assert min(w["iter_tcp_timeouts"]) >= 0 and min(w["iter_tcp_retrans"]) >= 0, w
        for busy, seconds in zip(w["iter_machine_busy_s"], w["iter_times_s"]):
            assert 0 <= busy <= (os.cpu_count() * seconds) + 0.05, w
        assert rows["cpsgd"]["busiest_link_bytes_by_iter"] == [
            max(max(w["iter_tx_bytes"][i], w["iter_rx_bytes"][i]) for w in run["workers"])
            for i in range(3)]


def test_host_placement():
    from mxnet_cpsgd.cluster.launch import host_of_nodes
    # scheduler, 2 servers, 2 workers
    assert host_of_nodes(2, 2, "colocated") == (2, [0, 0, 1, 0, 1])
    assert host_of_nodes(2, 1, "separate") == (4, [0, 1, 2, 3])
    # rendezvous + 4 workers
    assert host_of_nodes(4, 4, "colocated", allreduce=True) == (4, [0, 0, 1, 2, 3])
    assert host_of_nodes(2, 1, "separate", allreduce=True) == (3, [0, 1, 2])


def test_emulated_compute_releases_layers_in_reverse_order():
    """The emulated backward writes the last layer's gradients first; shares
    follow the layers' FLOPs.  Order only, no timing limits."""
    import mxnet as mx
    from mxnet_cpsgd.bench.emulate import EmulatedCompute
    from mxnet_cpsgd.training import models
    net = models.get_model("lenet", classes=10)
    models.initialize(net, (1, 28, 28), [mx.cpu()], hybridize=False, seed=0)
    emu = EmulatedCompute(net, (1, 28, 28), 8, total_ms=300.0)
    layers = emu.describe()
    assert abs(sum(l["share"] for l in layers) - 1) < 1e-9
    assert abs(sum(l["forward_ms"] + l["backward_ms"] for l in layers) - 300.0) < 1e-6
    first = emu.layers[0]["params"][0].grad()
    last = emu.layers[-1]["params"][0].grad()
    before = first.asnumpy().copy()
    import threading
    done = {}

    def watch(name, array):
        array.wait_to_read()
        done[name] = time.monotonic()
    loss = emu.iteration()
    threads = [threading.Thread(target=watch, args=a) for a in
               (("first", first), ("last", last), ("loss", loss))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # the forward ends first, then the backward releases the last layer first. The
    # last layer's share can be a fraction of a millisecond, less than the watching
    # threads' wake-up jitter, so "loss before last" is not compared; the first
    # layer's gradient comes after the whole rest of the backward (about 200 ms).
    assert done["loss"] < done["first"], done
    assert done["last"] < done["first"], done
    assert not (first.asnumpy() == before).all()  # written with the emulated values
    mx.nd.waitall()


def test_layer_flops_count_the_whole_batch():
    """The layers' FLOPs (counted from a one-sample pass) are those of the batch,
    against counts by hand: conv 2 x weights x output pixels, BatchNorm 4 per
    output value, Dense 2 x weights, each x the batch."""
    import mxnet as mx
    from mxnet import gluon
    from mxnet_cpsgd.bench.emulate import layer_flops
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Conv2D(4, kernel_size=3, in_channels=2), gluon.nn.BatchNorm(in_channels=4),
            gluon.nn.Flatten(), gluon.nn.Dense(5, in_units=4 * 6 * 6))
    net.initialize()
    batch = 8
    layers = layer_flops(net, (2, 8, 8), batch)
    assert [l["flops"] for l in layers] == [2 * (4 * 2 * 3 * 3) * (6 * 6) * batch,
                                           4 * (4 * 6 * 6) * batch,
                                           2 * (5 * 4 * 6 * 6) * batch]
    assert [len(l["params"]) for l in layers] == [2, 2, 2]
    mx.nd.waitall()


def test_failure_tail_shows_the_dead_node():
    """A job's failure text keeps the last lines of the node that died even when
    another node printed last, and only the output's tail otherwise."""
    from mxnet_cpsgd.bench.runs import failure_tail
    output = "\n".join(["[worker 1] Segmentation fault: 11", "[server 0] up"]
                       + ["[worker 0] line %d" % i for i in range(40)])
    tail = failure_tail(output, "worker 1 exited with signal SIGSEGV; stopping the job")
    lines = tail.splitlines()
    assert lines[0] == "[worker 1] Segmentation fault: 11"
    assert lines[1] == "..."
    assert lines[2:] == ["[worker 0] line %d" % i for i in range(25, 40)]
    # the named node's lines already in the tail are not repeated
    short = "[worker 1] a\n[worker 0] b"
    assert failure_tail(short, "worker 1 exited with code 255") == short
    # a failure that names no node: the tail alone
    assert failure_tail(output, "job timed out after 90 s").splitlines() == lines[2:]


def test_summarize_transfer_bound():
    """The bound is the busiest link direction's bytes x 8 / rate."""
    run = {"rate": "100mbit", "algorithm": "ssgd", "failure": None, "load_before": [0, 0, 0],
           "load_after": [0, 0, 0], "workers": [
               {"rank": r, "iter_times_s": [0.1, 0.2, 0.3], "loop_s": 0.6, "drained_s": 0.6,
                "iters": 3,
                "batch_size": 32, "param_bytes": 1000, "num_params": 250,
                "vmhwm_kb": 1024 * (100 + r), "tx_bytes": 3000, "rx_bytes": 6000,
                "iter_tx_bytes": [1000 + r, 500, 1500], "iter_rx_bytes": [2000, 3000, 1600 + r],
                "server_bytes": [{"tx": 12000, "rx": 6000}] if r == 0 else None}
               for r in range(2)]}
    row = summarize(run, 1)
    # per iteration, the larger direction of the busiest worker link
    assert row["busiest_link_bytes_by_iter"] == [2000, 3000, 1601]
    assert row["median_ms"] == pytest.approx(200.0)
    assert row["bytes_per_iter"] == pytest.approx(3000.0)
    assert row["busiest_link"] == "server 0 up"
    assert row["transfer_bound_ms"] == pytest.approx(1e3 * 4000 * 8 / 100e6)
    assert row["peak_rss_mb"] == pytest.approx(101.0)


def test_summarize_divides_dilated_times():
    """A run dilated D times: times / D, bytes as measured, the bound at the
    undilated rate, the CPU floor as a fraction of the iteration."""
    def run(scale):
        return {"rate": "100mbit", "algorithm": "ssgd", "failure": None,
                "load_before": [0, 0, 0], "load_after": [0, 0, 0], "time_scale": scale,
                "placement": "colocated", "workers": [
                    {"rank": r, "iter_times_s": [scale * t for t in (0.1, 0.2, 0.3)],
                     "drained_s": scale * 0.6, "iters": 3, "step_call_s": [0.01 * scale],
                     "batch_size": 32, "param_bytes": 1000, "num_params": 250,
                     "vmhwm_kb": 1024, "tx_bytes": 3000, "rx_bytes": 6000,
                     "cpu_s": 0.03, "peer_cpu_s": {"server": 0.03} if r == 0 else None}
                    for r in range(2)]}
    plain, dilated = summarize(run(1), 2), summarize(run(10), 2)
    assert dilated["time_scale"] == 10
    for key in ("median_ms", "mean_ms", "min_ms", "max_ms", "step_call_ms"):
        assert dilated[key] == pytest.approx(plain[key]), key
    assert dilated["transfer_bound_ms"] == pytest.approx(plain["transfer_bound_ms"])
    assert dilated["bytes_per_iter"] == plain["bytes_per_iter"]
    # the same CPU seconds spread over a 10 x longer iteration
    assert dilated["cpu_floor_ms"] == pytest.approx(plain["cpu_floor_ms"] / 10)
    assert dilated["cpu_floor_fraction"] == pytest.approx(plain["cpu_floor_fraction"] / 10)
    assert plain["cpu_floor_fraction"] == pytest.approx(
        plain["cpu_floor_ms"] / plain["mean_ms"])


@pytest.mark.parametrize("argv,message", [
    (["--time-scale", "0.5", "--emulate-compute", "10"], "bad time scale '0.5'"),
    (["--time-scale", "fast", "--emulate-compute", "10"], "bad time scale 'fast'"),
    (["--time-scale", "10"], "needs --emulate-compute"),
    (["--time-scale", "10", "--emulate-compute", "10", "--rates", "loopback"],
     "'loopback' has no emulated link"),
    (["--tcp-congestion", "no-such-algorithm"], "this kernel offers"),
])
def test_bench_rejects_bad_time_scale(tmp_path, capsys, argv, message):
    from mxnet_cpsgd.bench.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--out-dir", str(tmp_path / "never"), "--no-progress"] + argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(str(tmp_path / "never"))  # nothing started


#: runs cpsgd-bench with matplotlib unimportable, as without the examples extra
_NO_MATPLOTLIB = ("import sys; sys.modules['matplotlib'] = None; "
                  "from mxnet_cpsgd.bench.cli import main; sys.exit(main())")


def test_bench_time_scale_smoke_without_matplotlib(tmp_path):
    """--time-scale 3 runs the job 3 x slower (compute and links) and says so;
    without matplotlib the results are written and the plots skipped with a
    warning given before the jobs.  No timing is asserted."""
    shaped = netns_available()
    rate = "100mbit" if shaped else "none"
    out_dir = str(tmp_path / "bench")
    cmd = [sys.executable, "-c", _NO_MATPLOTLIB, "--no-progress", "--out-dir", out_dir,
           "--model", "lenet", "-n", "2", "-s", "1", "--batch-size", "16", "--rates", rate,
           "--algorithms", "ssgd", "--iters", "3", "--warmup-iters", "2",
           "--emulate-compute", "10", "--time-scale", "3", "--job-timeout", "90"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, text=True)
    left = []
    try:
        out, err = proc.communicate(timeout=BUDGET_S)
    except subprocess.TimeoutExpired:
        left = _teardown(proc, out_dir)
        pytest.fail("cpsgd-bench took more than %d s" % BUDGET_S)
    finally:
        left = left or _teardown(proc, out_dir)
    print(out, err)
    assert not left, "namespaces/links left behind: %s" % left
    assert proc.returncode == 0, err[-3000:]
    assert "matplotlib is not installed" in err
    assert "Dilated x3" in out
    with open(os.path.join(out_dir, "results.json")) as f:
        result = json.load(f)
    assert not os.path.exists(os.path.join(out_dir, "time_vs_rate.png"))
    assert result["config"]["time_scale"] == 3
    for run in result["runs"]:
        assert run["time_scale"] == 3 and run["failure"] is None
        for worker in run["workers"]:
            assert worker["emulate_compute_ms"] == pytest.approx(30.0)
    if shaped:
        ssgd = next(r for r in result["runs"] if r["algorithm"] == "ssgd")
        assert netem.parse_spec(ssgd["emulate_network"]).rate_bps == pytest.approx(100e6 / 3,
                                                                                   rel=1e-6)
    for row in result["rows"]:
        # the compute-only row sleeps: its CPU time, counted in 10 ms clock ticks,
        # may be none at all over 3 iterations
        floor = 0 <= row["cpu_floor_fraction"] if row["algorithm"] == "compute" \
            else 0 < row["cpu_floor_fraction"]
        assert row["mean_ms"] > 0 and floor, row
    with open(os.path.join(out_dir, "results.md")) as f:
        assert "Dilated x3" in f.read()


def test_plot_workers_scaling_table_and_throughput(tmp_path):
    """--plot-workers: efficiency = compute-only / iteration time per worker
    count, a throughput plot with the ideal line."""
    from mxnet_cpsgd.bench.cli import main
    from mxnet_cpsgd.bench.output import scaling_table
    paths = []
    for n, iteration_s in ((2, 0.125), (4, 0.2)):
        run = {"rate": "100mbit", "algorithm": "cpsgd", "failure": None, "time_scale": 10,
               "load_before": [0, 0, 0], "load_after": [0, 0, 0], "workers": [
                   {"rank": r, "iter_times_s": [10 * iteration_s] * 3,
                    "drained_s": 30 * iteration_s, "iters": 3, "batch_size": 32,
                    "param_bytes": 1000, "num_params": 250, "vmhwm_kb": 1024}
                   for r in range(n)]}
        row = summarize(run, n)
        result = {"config": {"num_workers": n, "batch_size": 32, "model": "lenet",
                             "placement": "colocated", "emulate_compute": 10,
                             "time_scale": 10},
                  "compute_ms": 100.0, "rows": [row]}
        path = str(tmp_path / ("n%d.json" % n))
        with open(path, "w") as f:
            json.dump(result, f)
        paths.append(path)
    results = [json.load(open(p)) for p in paths]
    table = scaling_table(results)
    assert "| cpsgd | 2 | 100mbit | 125.0 |" in table and "| 0.80 |" in table
    assert "| cpsgd | 4 | 100mbit | 200.0 |" in table and "| 0.50 |" in table
    assert main(["--plot-workers"] + paths + ["--out-dir", str(tmp_path / "plots")]) == 0
    for name in ("time_vs_workers.png", "throughput_vs_workers.png", "scaling.md"):
        assert os.path.getsize(str(tmp_path / "plots" / name)) > 0
