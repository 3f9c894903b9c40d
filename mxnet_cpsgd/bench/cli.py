"""Benchmark the algorithms' time per iteration over emulated networks.

Usage::

    cpsgd-bench [--model cifar_resnet20_v1] [-n 2] [-s S] [--batch-size 32]
        [--placement colocated|separate] [--emulate-compute MS]
        [--rates none,1gbit,100mbit] [--queue fair|fifo]
        [--algorithms ssgd,bitsgd,odsgd,cpsgd,horovod]
        [--iters 30] [--warmup-iters 10] [--time-scale D] [--timeline] [--out-dir DIR]

``--algorithms`` also takes variants ``LABEL=STORE[:KNOB=VALUE...]`` (e.g.
``k2=cpsgd:correction_period=2``): the store with its own knobs, named LABEL in
every table, file and plot (docs/performance.md).
    cpsgd-bench --plot-workers A/results.json B/results.json ... --out-dir DIR
        [--algorithms ssgd,cpsgd]   # several files of one -n: their mean and spread
        [--plot-rate fastest|slowest]   # each file at one of its rates

Placement (``--placement``): ``colocated`` (default) gives every worker its own
emulated host (network namespace) that also runs one server, the scheduler on
host 0, as MXNet's tools/launch.py deploys a cluster (-s defaults to -n);
``separate`` puts every node on its own host (-s defaults to 1).  The
all-reduce stores (``horovod`` and compressors built on it) run as Horovod/Gloo
jobs on the same hosts: a rendezvous service on host 0 and each worker in its
own UTS namespace whose host name is its address (Horovod 0.28.1 connects to
host *names*).

``--emulate-compute MS`` replaces forward and backward by engine waits that
total MS ms and release each layer's gradients in reverse order (see
mxnet_cpsgd/bench/emulate.py); everything else is real.

One invocation runs a *compute-only* job (the same worker processes training
with no kvstore at all) and then every (rate, algorithm) pair as its own
launcher job (MXNet allows one distributed store per process), and writes

* ``results.json``: every measured number, per worker and aggregated;
* ``results.md``: the table (also printed) and the target checks;
* ``time_vs_rate.png``: time per iteration against the link rate, one line
  per algorithm, compute-only as a horizontal line;
* with ``--timeline``: ``timeline/<rate>-<algorithm>.trace.json`` (all
  workers' MXNet profiler traces merged, one pid per worker; open in
  chrome://tracing or ui.perfetto.dev) and ``timeline-<rate>.png`` (a few
  iterations of up to three runs one above the other: bitsgd, cpsgd and horovod
  where they were measured, else the next algorithms).

Rates: ``none`` runs every node in its own network namespace on a bridge with
links so fast (``--unshaped-rate``, default 100gbit) that tbf never queues, so
bytes can still be counted; ``loopback`` runs on 127.0.0.1 like a plain
launcher job (no byte counts); any tc rate (``100mbit``, ``1gbit``) shapes
both directions of every node's link.  Namespaces need root; without it
``none`` falls back to ``loopback`` and shaped rates are skipped.  ``--queue``
picks the shaped links' queue discipline: ``fair`` (default, as every figure of
docs/performance.md; the flows share the rate, as with a Linux host's default
fq_codel; mxnet_cpsgd.cluster.netem) or ``fifo`` (one tbf FIFO per link
direction, the flows of a link take turns).

Time dilation (``--time-scale D``, D >= 1, default 1): every job runs D times
slower, emulated compute x D and link rates / D (and delays x D), and every
time reported is the measured time divided by D, labelled as dilated.  The
ratio of transfer time to compute is kept while the machine's own CPU work
(stores, servers, the network stack: the *CPU floor*) shrinks to 1/D of an
iteration, so more workers than cores can be emulated faithfully.  Needs
``--emulate-compute`` (real compute cannot be slowed down).  Every run reports
its CPU floor as a fraction of its iteration; above 10 % the bench warns (the
time then says more about this machine's cores than about the algorithm).

How the numbers are made (docs/performance.md has the details):

* time per iteration: each worker times the gaps between the moments its
  consecutive iterations' losses became readable, over ``--iters`` iterations
  after ``--warmup-iters`` discarded ones.  The table's *median* is the mean
  over workers of each worker's median; *min*/*max* are over all workers'
  iterations; samples/s per worker = batch / median.
* bytes per iteration per worker: the worker's own ``eth0`` tx+rx byte
  counters (Ethernet frames: payload plus TCP/IP/ps-lite overhead) over the
  timed window, divided by the iterations, mean over workers.
* transfer bound: the time the busiest link direction needs at the rate for
  the bytes it carried per iteration: max over every host's up/down link
  (separate placement: every worker's and every server's link, servers'
  counters read by worker 0; colocated: a worker's link is its host's, shared
  with its server) of bytes x 8 / rate.
* ratios: to horovod, bitsgd and ssgd at the same rate in the same invocation,
  and to max(compute-only, transfer bound).
* peak RSS: VmHWM of the worker processes, the largest over workers.
"""
import datetime
import json
import os
import sys
import time
from typing import Optional, Sequence

from mxnet_cpsgd.cluster import netem, netspec
from mxnet_cpsgd.bench.worker import COMPUTE_ONLY

from .options import build_parser, validate
from .runs import BenchError, THREAD_ENV, UNSHAPED, code_fingerprint, netns_available, run_one
from .results import analyse, check_targets, cpu_floor_warnings
from .output import build_timelines, markdown_report, plot

# the names the flags' parser and checks had before they moved to options.py
_parser, _validate = build_parser, validate


# ------------------------------------------------------------------ progress

class _SimpleBar:
    """A one-line progress bar for when tqdm is not installed."""

    def __init__(self, total, stream=sys.stderr):
        self.total, self.n, self.desc, self._stream = total, 0, "", stream
        self._start = time.monotonic()
        self._draw()

    def set_description(self, desc):
        self.desc = desc
        self._draw()

    def update(self, n=1):
        self.n += n
        self._draw()

    def write(self, text):
        self._stream.write("\r" + " " * 100 + "\r" + text + "\n")
        self._draw()

    def _draw(self):
        width = 30
        done = int(width * self.n / max(1, self.total))
        self._stream.write("\r[%s%s] %d/%d %4.0fs %s" % (
            "#" * done, "." * (width - done), self.n, self.total,
            time.monotonic() - self._start, self.desc[:40].ljust(40)))
        self._stream.flush()

    def close(self):
        self._stream.write("\n")
        self._stream.flush()


def _progress(total, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
        return tqdm(total=total, unit="run", dynamic_ncols=True, file=sys.stderr)
    except ImportError:
        return _SimpleBar(total)


# ------------------------------------------------------------------- output

def plotting_available() -> bool:
    """Whether matplotlib (the ``examples`` extra) is installed for the plots."""
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


NO_PLOTS = ("cpsgd-bench: warning: matplotlib is not installed (pip install "
            "'mxnet-cpsgd[examples]'): writing results.json and results.md without plots")


def write_outputs(result: dict, out_dir: str) -> str:
    """results.json, results.md and time_vs_rate.png (without matplotlib: no
    plot, the tables only); returns the Markdown."""
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    report = markdown_report(result)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(report + "\n")
    if plotting_available() and any(r.get("mean_ms") is not None
                                    and r["algorithm"] != COMPUTE_ONLY
                                    for r in result["rows"]):
        plot(result, os.path.join(out_dir, "time_vs_rate.png"))
    return report


def rerender(path: str, out_dir: Optional[str]) -> int:
    """Recompute the tables, checks and plot of a results.json (e.g. after
    changing how they are derived); the measured runs are not touched."""
    with open(path) as f:
        result = json.load(f)
    if "runs" not in result:
        # e.g. the results.json kept in reports/perf/, reduced to what --plot-workers reads
        print("cpsgd-bench: error: %s has no 'runs' (the jobs' own records) to recompute "
              "from; --plot-workers can still read it" % path, file=sys.stderr)
        return 2
    result["rows"], result["compute_ms"] = analyse(result["runs"],
                                                   result["config"]["num_servers"],
                                                   result["config"].get("variants"))
    result["checks"] = check_targets(result["rows"], result["compute_ms"], result["config"])
    result["rerendered"] = datetime.datetime.now().isoformat(timespec="seconds")
    if not plotting_available():
        print(NO_PLOTS, file=sys.stderr)
    out_dir = out_dir or os.path.dirname(os.path.abspath(path))
    os.makedirs(out_dir, exist_ok=True)
    print(write_outputs(result, out_dir))
    return 0


# --------------------------------------------------------------------- main

def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot_rate and not args.plot_workers:
        parser.error("--plot-rate is used only with --plot-workers")
    if args.rerender:
        return rerender(args.rerender, args.out_dir)
    if args.plot_workers:
        return _plot_workers(parser, args)
    try:
        validate(args)
        if args.tcp_congestion:  # every namespace the jobs create takes it
            os.environ[netspec.TCP_CONGESTION_ENV] = netspec.check_tcp_congestion(
                args.tcp_congestion)
    except (BenchError, netem.NetemError) as err:
        parser.error(str(err))
    if not plotting_available():
        # said before the jobs run, not discovered after them
        print(NO_PLOTS, file=sys.stderr)
    have_netns = netns_available()
    rates = _runnable_rates(args.rate_list, have_netns)
    none_mode = ("network namespaces, tbf at %s (unshaped)" % args.unshaped_rate
                 if have_netns else "loopback (no namespaces: not root)")
    out_dir = args.out_dir or os.path.join(
        "bench-results", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)

    started = datetime.datetime.now().isoformat(timespec="seconds")
    load_start = list(os.getloadavg())
    runs, interrupted = _run_jobs(args, _jobs(args, rates), os.path.join(out_dir, "runs"),
                                  have_netns)
    result = _result(args, argv, rates, none_mode, runs, interrupted, started, load_start)
    return _write_and_report(args, result, out_dir, interrupted)


def _plot_workers(parser, args) -> int:
    """--plot-workers: the scaling plots and table of several results.json."""
    from .scaling import plot_workers
    if not plotting_available():
        parser.error("--plot-workers needs matplotlib: pip install 'mxnet-cpsgd[examples]'")
    out_dir = args.out_dir or "."
    algorithms = [a.split("=", 1)[0].strip() for a in (args.algorithms or "").split(",")
                  if a.strip()]
    try:
        table = plot_workers(args.plot_workers, out_dir, algorithms, args.plot_rate)
    except BenchError as err:
        parser.error(str(err))
    print(table)
    print(os.path.join(out_dir, "time_vs_workers.png"))
    print(os.path.join(out_dir, "throughput_vs_workers.png"))
    return 0


def _runnable_rates(rate_list, have_netns):
    """The rates this machine can run (shaped ones need namespaces)."""
    rates = []
    for rate in rate_list:
        if rate not in UNSHAPED and not have_netns:
            print("cpsgd-bench: skipping rate %s: network emulation needs root and "
                  "iproute2" % rate, file=sys.stderr)
            continue
        rates.append(rate)
    if not rates:
        raise SystemExit("cpsgd-bench: no rate can run here")
    return rates


def _jobs(args, rates):
    """(repeat, rate, algorithm) of every job, in the order they run."""
    # every repeat is a full round (compute-only first), so that a disturbance
    # of the shared machine hits all algorithms alike rather than one cell
    jobs = []
    for repeat in range(args.repeats):
        if not args.no_compute_only:
            jobs.append((repeat, "loopback" if "loopback" in rates and "none" not in rates
                         else "none", COMPUTE_ONLY))
        for rate in rates:
            for algorithm in args.algorithm_list:
                jobs.append((repeat, rate, algorithm))
    return jobs


def _run_jobs(args, jobs, raw_dir, have_netns):
    """Run the jobs one after the other; returns their records and the signal
    exit status that interrupted them (0: none did)."""
    bar = _progress(len(jobs), not args.no_progress)
    stream = sys.stdout if args.verbose else None
    runs = []
    interrupted = 0
    try:
        for repeat, rate, algorithm in jobs:
            label = "%s @ %s" % (algorithm, rate if algorithm != COMPUTE_ONLY else "-")
            if args.repeats > 1:
                label += " (round %d/%d)" % (repeat + 1, args.repeats)
            if bar is not None:
                bar.set_description(label)
            use_netns = have_netns and rate != "loopback"
            name = "%s-%s" % (rate, algorithm)
            if args.repeats > 1:
                name = "r%d-%s" % (repeat, name)
            run = run_one(args, rate, algorithm, os.path.join(raw_dir, name), use_netns,
                          stream, profile=(repeat == 0))
            run["repeat"] = repeat
            runs.append(run)
            if run["returncode"] >= 128 and run["failure"].startswith("received "):
                # the launcher caught SIGINT/SIGTERM/SIGHUP and tore the job down:
                # stop here, but still write what was measured
                interrupted = run["returncode"]
                (bar.write if bar is not None else print)(
                    "cpsgd-bench: interrupted; writing the results measured so far")
                break
            if run["failure"]:
                msg = "cpsgd-bench: %s failed: %s" % (label, run["failure"])
                (bar.write if bar is not None else print)(msg)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return runs, interrupted


def _tcp_congestion() -> Optional[str]:
    """The emulated hosts' TCP congestion control: the flag's, else the machine's."""
    try:
        return (os.environ.get(netspec.TCP_CONGESTION_ENV)
                or netspec.machine_tcp_congestion())
    except OSError:  # not Linux
        return None


def _result(args, argv, rates, none_mode, runs, interrupted, started, load_start) -> dict:
    """results.json: the configuration, the rows and checks derived from the runs,
    and the runs themselves."""
    rows, compute_ms = analyse(runs, args.num_servers,
                               [v.as_dict() for v in args.variants.values()])
    config = {k: getattr(args, k) for k in (
        "placement", "emulate_compute", "model", "num_workers", "num_servers", "batch_size", "iters", "warmup_iters",
        "algo_warmup_steps", "threshold", "correction_period", "timeline", "repeats",
        "timeline_iters", "unshaped_rate", "engine_threads", "queue", "time_scale")}
    config.update({"rates": rates, "algorithms": args.algorithm_list,
                   "variants": [v.as_dict() for v in args.variants.values()],
                   "none_mode": none_mode, "tcp_congestion": _tcp_congestion(),
                   "thread_env": dict(THREAD_ENV,
                                      MXNET_CPU_WORKER_NTHREADS=str(args.engine_threads))})
    return {
        "command": "cpsgd-bench " + " ".join(argv),
        "code": code_fingerprint(),
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "load_start": load_start, "load_end": list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "config": config, "compute_ms": compute_ms, "rows": rows,
        "checks": check_targets(rows, compute_ms, config),
        "interrupted": bool(interrupted),
        "runs": runs,
    }


def _write_and_report(args, result, out_dir, interrupted) -> int:
    """Timelines, results.json/.md and the plot; prints the table; the exit status."""
    runs, rows = result["runs"], result["rows"]
    if args.timeline:
        result["timelines"] = build_timelines(result, runs, out_dir,
                                              plots=plotting_available())
    report = write_outputs(result, out_dir)
    if not args.keep_raw:
        # the raw profiler traces are large and merged under timeline/ already
        for run in runs:
            for name in os.listdir(run["run_dir"]) if os.path.isdir(run["run_dir"]) else []:
                if name.startswith("profile-") and name.endswith(".json"):
                    os.remove(os.path.join(run["run_dir"], name))
    print(report)
    for warning in cpu_floor_warnings(rows):
        print("cpsgd-bench: warning: " + warning, file=sys.stderr)
    print("results in %s" % os.path.abspath(out_dir))
    if interrupted:
        return interrupted
    failed = [r for r in runs if r["failure"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
