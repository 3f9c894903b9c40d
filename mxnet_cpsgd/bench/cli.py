"""Benchmark the algorithms' time per iteration over emulated networks.

Usage::

    cpsgd-bench [--model cifar_resnet20_v1] [-n 2] [-s S] [--batch-size 32]
        [--placement colocated|separate] [--emulate-compute MS]
        [--rates none,1gbit,100mbit] [--queue fifo|fair]
        [--algorithms ssgd,bitsgd,odsgd,cpsgd,horovod]
        [--iters 30] [--warmup-iters 10] [--time-scale D] [--timeline] [--out-dir DIR]

``--algorithms`` also takes variants ``LABEL=STORE[:KNOB=VALUE...]`` (e.g.
``k2=cpsgd:correction_period=2``): the store with its own knobs, named LABEL in
every table, file and plot (docs/performance.md).
    cpsgd-bench --plot-workers A/results.json B/results.json --out-dir DIR

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
picks the shaped links' queue discipline: ``fifo`` (default; one tbf FIFO per
link direction, the flows of a link take turns) or ``fair`` (the flows share
the rate, as with a Linux host's default fq_codel; mxnet_cpsgd.cluster.netem).

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
import argparse
import datetime
import json
import os
import sys
import time
from typing import Optional, Sequence

from mxnet_cpsgd.cluster import netem
from mxnet_cpsgd.bench.worker import COMPUTE_ONLY, STOCK_SYNC, WORKLOADS

from .runs import (BenchError, DEFAULT_ALGORITHMS, MODEL_ALIASES, THREAD_ENV, UNSHAPED,
                   code_fingerprint, netns_available, parse_list, parse_variants, run_one)
from .results import analyse, check_targets, cpu_floor_warnings
from .output import build_timelines, markdown_report, plot


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


# --------------------------------------------------------------------- main

def _parser():
    p = argparse.ArgumentParser(
        prog="cpsgd-bench",
        description="Time per iteration of the algorithms at several emulated link rates "
                    "(one launcher job per rate and algorithm, plus a compute-only job).")
    p.add_argument("--model", default="cifar_resnet20_v1",
                   help="lenet, resnet20 (cifar_resnet20_v1, default), inception-bn "
                        "(cifar_inception_bn), resnet50 (resnet50_v1); synthetic data")
    p.add_argument("-n", "--num-workers", type=int, default=2)
    p.add_argument("-s", "--num-servers", type=int, default=None,
                   help="servers (default: one per worker with --placement colocated, "
                        "1 with separate)")
    p.add_argument("--placement", choices=("colocated", "separate"), default="colocated",
                   help="colocated (default): one emulated host per worker, running that "
                        "worker and one server (the scheduler on host 0), as MXNet's "
                        "tools/launch.py deploys a cluster; separate: every node on its "
                        "own host (the servers' links carry every worker's traffic)")
    p.add_argument("--emulate-compute", type=float, default=0.0, metavar="MS",
                   help="an emulated accelerator: forward/backward replaced by engine "
                        "waits totalling MS ms per iteration that release each layer's "
                        "gradients in reverse order (time per layer in proportion to its "
                        "forward FLOPs); stores, servers, network are real")
    p.add_argument("--time-scale", default="1", metavar="D",
                   help="time dilation: run D times slower (emulated compute x D, link "
                        "rates / D, delays x D) and report every time divided by D "
                        "(labelled dilated); D >= 1, default 1; needs --emulate-compute")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--rates", default="none,1gbit,100mbit",
                   help="comma-separated: none (namespaces, unshaped), loopback, or tc "
                        "rates such as 50mbit,1gbit (default none,1gbit,100mbit)")
    p.add_argument("--queue", choices=netem.QUEUES, default="fifo",
                   help="queue discipline of the shaped links: fifo (default; one FIFO "
                        "per link direction) or fair (the TCP flows of a link share its "
                        "rate, like a Linux host's fq_codel)")
    p.add_argument("--algorithms", default=DEFAULT_ALGORITHMS,
                   help="comma-separated store names (default %s); '%s' adds MXNet's own "
                        "dist_sync store as a baseline. A variant LABEL=STORE[:KNOB=VALUE"
                        "...] runs STORE with its own knobs under LABEL, e.g. "
                        "k2=cpsgd:correction_period=2 (they override --threshold, "
                        "--correction-period, --algo-warmup-steps); ratios such as "
                        "/bitsgd divide by the first variant of that store without knobs"
                        % (DEFAULT_ALGORITHMS, STOCK_SYNC))
    p.add_argument("--iters", type=int, default=30, help="timed iterations (default 30)")
    p.add_argument("--warmup-iters", type=int, default=10,
                   help="discarded iterations before timing (default 10)")
    p.add_argument("--algo-warmup-steps", type=int, default=None,
                   help="the algorithms' own S-SGD warm-up (warmup_steps); default half "
                        "of --warmup-iters, so the timed iterations are all post-warm-up")
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--correction-period", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1,
                   help="run the whole sweep this many times, round by round, and report "
                        "the median over rounds (default 1); --timeline profiles round 1")
    p.add_argument("--no-compute-only", action="store_true",
                   help="skip the compute-only job")
    p.add_argument("--timeline", action="store_true",
                   help="profile --timeline-iters extra iterations per run with MXNet's "
                        "profiler; merged traces, and per rate a PNG of up to three runs "
                        "(bitsgd, cpsgd and horovod where measured, else the next ones)")
    p.add_argument("--timeline-iters", type=int, default=4)
    p.add_argument("--engine-threads", type=int, default=1,
                   help="MXNET_CPU_WORKER_NTHREADS of every process (default 1: one engine "
                        "thread per process; OMP_NUM_THREADS stays 1)")
    p.add_argument("--worker-setup", metavar="FILE", default=None,
                   help="a Python file every worker runs after importing mxnet_cpsgd and "
                        "before creating its store (e.g. a patch to try on a store)")
    p.add_argument("--unshaped-rate", default="100gbit",
                   help="tbf rate of the 'none' rate's namespaces (far above what a veth "
                        "pair carries, so nothing is shaped); default 100gbit")
    p.add_argument("--job-timeout", type=float, default=600.0,
                   help="seconds one job may run (default 600)")
    p.add_argument("--out-dir", default=None,
                   help="results directory (default bench-results/<date-time>)")
    p.add_argument("--keep-raw", action="store_true",
                   help="also keep the workers' raw profiler traces under runs/ (the "
                        "workers' JSON and logs are always kept there)")
    p.add_argument("--rerender", metavar="RESULTS_JSON", default=None,
                   help="do not run anything: recompute the tables, target checks and plot "
                        "of an earlier results.json (into --out-dir, default its directory)")
    p.add_argument("--plot-workers", nargs="+", metavar="RESULTS_JSON", default=None,
                   help="do not run anything: plot time per iteration and throughput "
                        "against workers from several results.json (e.g. -n 2 and -n 4) "
                        "into --out-dir (time_vs_workers.png, throughput_vs_workers.png "
                        "with the ideal line, scaling.md: efficiency = compute / iteration)")
    p.add_argument("--verbose", action="store_true", help="print the workers' output")
    p.add_argument("--no-progress", action="store_true")
    return p


def _validate(args):
    args.model = MODEL_ALIASES.get(args.model.lower(), args.model)
    if args.model not in WORKLOADS:
        raise BenchError("unknown model %r; known: %s" % (args.model, ", ".join(
            sorted(set(MODEL_ALIASES)))))
    if args.num_servers is None:
        args.num_servers = args.num_workers if args.placement == "colocated" else 1
    if args.emulate_compute < 0:
        raise BenchError("--emulate-compute must be >= 0")
    try:
        args.time_scale = netem.parse_time_scale(args.time_scale)
    except netem.NetemError as err:
        raise BenchError("--time-scale: %s" % err) from None
    if args.time_scale != 1 and not args.emulate_compute:
        raise BenchError("--time-scale %g needs --emulate-compute MS: real compute cannot "
                         "be slowed down, so dilating only the links would change the "
                         "ratio of transfer to compute" % args.time_scale)
    if args.num_workers < 1 or args.num_servers < 1 or args.batch_size < 1:
        raise BenchError("workers, servers and batch size must be >= 1")
    if args.engine_threads < 1:
        raise BenchError("--engine-threads must be >= 1")
    if args.repeats < 1:
        raise BenchError("--repeats must be >= 1")
    if args.iters < 1 or args.warmup_iters < 0:
        raise BenchError("--iters must be >= 1 and --warmup-iters >= 0")
    if args.algo_warmup_steps is None:
        args.algo_warmup_steps = args.warmup_iters // 2
    if args.algo_warmup_steps > args.warmup_iters:
        raise BenchError("--algo-warmup-steps (%d) > --warmup-iters (%d): timed iterations "
                         "would include the algorithms' S-SGD warm-up"
                         % (args.algo_warmup_steps, args.warmup_iters))
    import mxnet as mx
    import mxnet_cpsgd  # noqa: F401  (registers the stores, needed to validate names)
    if args.worker_setup:
        if not os.path.isfile(args.worker_setup):
            raise BenchError("--worker-setup %s: no such file" % args.worker_setup)
        import runpy
        runpy.run_path(args.worker_setup, run_name="cpsgd_bench_setup")
    from mxnet_cpsgd.bench.worker import is_allreduce
    known = sorted(name for name, cls in mx.kv.KVStoreBase.kv_registry.items()
                   if getattr(cls, "policy_class", None) is not None or is_allreduce(cls))
    args.allreduce_algorithms = sorted(name for name in known
                                       if is_allreduce(mx.kv.KVStoreBase.kv_registry[name]))
    variants = parse_variants(args.algorithms)
    import importlib.util
    if importlib.util.find_spec("horovod") is None:
        wanted = [v.label for v in variants if v.store in args.allreduce_algorithms]
        if wanted and args.algorithms != DEFAULT_ALGORITHMS:
            raise BenchError("%s need Horovod (horovod.mxnet), which is not installed"
                             % ", ".join(wanted))
        if wanted:
            print("cpsgd-bench: skipping %s: Horovod is not installed" % ", ".join(wanted),
                  file=sys.stderr)
            variants = [v for v in variants if v.label not in wanted]
    unknown = [v.store for v in variants if v.store not in known and v.store != STOCK_SYNC]
    if unknown or not variants:
        raise BenchError("unknown algorithm(s) %s; known: %s"
                         % (", ".join(unknown) or "(none given)",
                            ", ".join(known + [STOCK_SYNC])))
    args.variants = {}
    for variant in variants:
        variant = _checked_variant(variant, known, args)
        args.variants[variant.label] = variant
    args.algorithm_list = [v.label for v in args.variants.values()]
    args.rate_list = parse_list(args.rates)
    if not args.rate_list:
        raise BenchError("--rates is empty")
    if args.time_scale != 1 and "loopback" in args.rate_list:
        raise BenchError("--time-scale: rate 'loopback' has no emulated link to dilate; "
                         "use 'none' or shaped rates")
    for rate in args.rate_list:
        if rate not in UNSHAPED:
            netem.parse_rate(rate)
    netem.parse_rate(args.unshaped_rate)


def _checked_variant(variant, known, args):
    """A variant whose label does not pass for another store and whose knobs
    its store accepts, with typed values (the stores' own validators)."""
    from mxnet_cpsgd.stores.config import KNOBS, ConfigError
    import mxnet as mx
    from mxnet_cpsgd.bench.worker import store_defaults
    if variant.label.lower() == COMPUTE_ONLY:
        raise BenchError("--algorithms: %r is the compute-only job's name, not a label"
                         % variant.label)
    named = variant.label.lower()
    if (named in known or named == STOCK_SYNC) and (named != variant.store or variant.knobs):
        # ratios such as /bitsgd refer to the plain store: a label must not pose as one
        raise BenchError("--algorithms: label %r names a store; use it only for that store "
                         "without knobs" % variant.label)
    if not variant.knobs:
        return variant
    accepted = ({} if variant.store == STOCK_SYNC else
                store_defaults(mx.kv.KVStoreBase.kv_registry[variant.store]))
    typed = {}
    for name, value in variant.knobs.items():
        if name not in KNOBS:
            raise BenchError("--algorithms %s: unknown knob %r; knobs: %s"
                             % (variant.label, name, ", ".join(sorted(KNOBS))))
        if name not in accepted:
            raise BenchError("--algorithms %s: store %s does not use knob %r; it accepts: %s"
                             % (variant.label, variant.store, name,
                                ", ".join(sorted(accepted)) or "no knobs"))
        try:
            typed[name] = KNOBS[name][0]("%s:%s" % (variant.label, name), value)
        except ConfigError as err:
            raise BenchError("--algorithms %s: %s" % (variant.label, err)) from None
    if typed.get("warmup_steps", 0) > args.warmup_iters:
        raise BenchError("--algorithms %s: warmup_steps (%d) > --warmup-iters (%d): timed "
                         "iterations would include the algorithm's S-SGD warm-up"
                         % (variant.label, typed["warmup_steps"], args.warmup_iters))
    return type(variant)(variant.label, variant.store, typed)


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rerender:
        return rerender(args.rerender, args.out_dir)
    if args.plot_workers:
        from .output import plot_throughput_vs_workers, plot_vs_workers, scaling_table
        if not plotting_available():
            parser.error("--plot-workers needs matplotlib: pip install 'mxnet-cpsgd[examples]'")
        results = []
        for path in args.plot_workers:
            with open(path) as f:
                results.append(json.load(f))
        out_dir = args.out_dir or "."
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "time_vs_workers.png")
        plot_vs_workers(results, path)
        throughput = os.path.join(out_dir, "throughput_vs_workers.png")
        plot_throughput_vs_workers(results, throughput)
        table = scaling_table(results)
        with open(os.path.join(out_dir, "scaling.md"), "w") as f:
            f.write(table + "\n")
        print(table)
        print(path)
        print(throughput)
        return 0
    try:
        _validate(args)
    except (BenchError, netem.NetemError) as err:
        parser.error(str(err))
    if not plotting_available():
        # said before the jobs run, not discovered after them
        print(NO_PLOTS, file=sys.stderr)
    have_netns = netns_available()
    rates = []
    for rate in args.rate_list:
        if rate not in UNSHAPED and not have_netns:
            print("cpsgd-bench: skipping rate %s: network emulation needs root and "
                  "iproute2" % rate, file=sys.stderr)
            continue
        rates.append(rate)
    if not rates:
        raise SystemExit("cpsgd-bench: no rate can run here")
    none_mode = ("network namespaces, tbf at %s (unshaped)" % args.unshaped_rate
                 if have_netns else "loopback (no namespaces: not root)")
    out_dir = args.out_dir or os.path.join(
        "bench-results", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    raw_dir = os.path.join(out_dir, "runs")

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
    bar = _progress(len(jobs), not args.no_progress)
    stream = sys.stdout if args.verbose else None
    started = datetime.datetime.now().isoformat(timespec="seconds")
    load_start = list(os.getloadavg())
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

    rows, compute_ms = analyse(runs, args.num_servers,
                               [v.as_dict() for v in args.variants.values()])
    config = {k: getattr(args, k) for k in (
        "placement", "emulate_compute", "model", "num_workers", "num_servers", "batch_size", "iters", "warmup_iters",
        "algo_warmup_steps", "threshold", "correction_period", "timeline", "repeats",
        "timeline_iters", "unshaped_rate", "engine_threads", "queue", "time_scale")}
    config.update({"rates": rates, "algorithms": args.algorithm_list,
                   "variants": [v.as_dict() for v in args.variants.values()],
                   "none_mode": none_mode,
                   "thread_env": dict(THREAD_ENV,
                                      MXNET_CPU_WORKER_NTHREADS=str(args.engine_threads))})
    result = {
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
