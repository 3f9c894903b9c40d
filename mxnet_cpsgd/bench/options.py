"""The command line of ``cpsgd-bench`` (:mod:`.cli`): its flags, and the checks
that refuse a bad combination of them before any job runs (unknown models,
stores and knobs; a time dilation without emulated compute; warm-up steps that
would fall into the timed iterations).  Every flag is described in
:mod:`.cli`'s module doc and ``cpsgd-bench --help``.
"""
import argparse
import os
import sys

from mxnet_cpsgd.cluster import netem
from mxnet_cpsgd.bench.worker import COMPUTE_ONLY, STOCK_SYNC, WORKLOADS

from .runs import (BenchError, DEFAULT_ALGORITHMS, MODEL_ALIASES, UNSHAPED, parse_list,
                   parse_variants)
from .scaling import PLOT_RATES


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``cpsgd-bench``'s flags."""
    p = argparse.ArgumentParser(
        prog="cpsgd-bench",
        description="Time per iteration of the algorithms at several emulated link rates "
                    "(one launcher job per rate and algorithm, plus a compute-only job).")
    _add_job_options(p)
    _add_algorithm_options(p)
    _add_output_options(p)
    return p


def _add_job_options(p: argparse.ArgumentParser) -> None:
    """What each job runs on: model, workers and servers, compute, links."""
    p.add_argument("--model", default="cifar_resnet20_v1",
                   help="lenet, resnet20 (cifar_resnet20_v1, default), inception-bn "
                        "(cifar_inception_bn), resnet50 (resnet50_v1); synthetic data")
    p.add_argument("-n", "--num-workers", type=int, default=2,
                   help="workers of every job (default 2)")
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
                        "forward FLOPs); stores, servers, network are real (default 0: "
                        "real compute on the CPU)")
    p.add_argument("--time-scale", default="1", metavar="D",
                   help="time dilation: run D times slower (emulated compute x D, link "
                        "rates / D, delays x D) and report every time divided by D "
                        "(labelled dilated); D >= 1, default 1; needs --emulate-compute")
    p.add_argument("--batch-size", type=int, default=32,
                   help="samples per iteration on each worker (default 32)")
    p.add_argument("--rates", default="none,1gbit,100mbit",
                   help="comma-separated: none (namespaces, unshaped), loopback, or tc "
                        "rates such as 50mbit,1gbit (default none,1gbit,100mbit)")
    p.add_argument("--queue", choices=netem.QUEUES, default="fair",
                   help="queue discipline of the shaped links: fair (default, as every "
                        "figure of docs/performance.md: the TCP flows of a link share "
                        "its rate, like a Linux host's fq_codel) or fifo (one FIFO per "
                        "link direction)")
    p.add_argument("--tcp-congestion", metavar="NAME", default=None,
                   help="TCP congestion control of the emulated hosts, e.g. cubic (Linux's "
                        "usual default), reno or bbr (default: this machine's, which "
                        "new namespaces inherit; the results record which)")
    p.add_argument("--unshaped-rate", default="100gbit",
                   help="tbf rate of the 'none' rate's namespaces (far above what a veth "
                        "pair carries, so nothing is shaped); default 100gbit")
    p.add_argument("--engine-threads", type=int, default=1,
                   help="MXNET_CPU_WORKER_NTHREADS of every process (default 1: one engine "
                        "thread per process; OMP_NUM_THREADS stays 1)")
    p.add_argument("--worker-setup", metavar="FILE", default=None,
                   help="a Python file every worker runs after importing mxnet_cpsgd and "
                        "before creating its store, e.g. a patch to try on a store "
                        "(default: none)")
    p.add_argument("--job-timeout", type=float, default=600.0,
                   help="seconds one job may run (default 600)")


def _add_algorithm_options(p: argparse.ArgumentParser) -> None:
    """Which stores run, with which knobs, for how many iterations."""
    p.add_argument("--algorithms", default=None,
                   help="comma-separated store names (default %s); '%s' adds MXNet's own "
                        "dist_sync store as a baseline. A variant LABEL=STORE[:KNOB=VALUE"
                        "...] runs STORE with its own knobs under LABEL, e.g. "
                        "k2=cpsgd:correction_period=2 (they override --threshold, "
                        "--correction-period, --algo-warmup-steps); ratios such as "
                        "/bitsgd divide by the first variant of that store without knobs; "
                        "with --plot-workers: the labels to plot, in this order (default "
                        "every one in the results)" % (DEFAULT_ALGORITHMS, STOCK_SYNC))
    p.add_argument("--iters", type=int, default=30, help="timed iterations (default 30)")
    p.add_argument("--warmup-iters", type=int, default=10,
                   help="discarded iterations before timing (default 10)")
    p.add_argument("--algo-warmup-steps", type=int, default=None,
                   help="the algorithms' own S-SGD warm-up (warmup_steps; bitsgd's stays "
                        "off); default half of --warmup-iters, so the timed iterations "
                        "are all post-warm-up")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="2-bit quantization threshold of bitsgd and cpsgd (default 0.5)")
    p.add_argument("--correction-period", type=int, default=5,
                   help="correction period of cpsgd and cpsgd_<compressor> (default 5)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the whole sweep this many times, round by round, and report "
                        "the median over rounds (default 1); --timeline profiles round 1")
    p.add_argument("--no-compute-only", action="store_true",
                   help="skip the compute-only job")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """Where results go, profiles, and the runs-nothing modes (rerender, plots)."""
    p.add_argument("--timeline", action="store_true",
                   help="profile --timeline-iters extra iterations per run with MXNet's "
                        "profiler; merged traces, and per rate a PNG of up to three runs "
                        "(bitsgd, cpsgd and horovod where measured, else the next ones)")
    p.add_argument("--timeline-iters", type=int, default=4,
                   help="profiled iterations per run with --timeline (default 4)")
    p.add_argument("--out-dir", default=None,
                   help="results directory (default bench-results/<date-time>)")
    p.add_argument("--keep-raw", action="store_true",
                   help="also keep the workers' raw profiler traces under runs/ (the "
                        "workers' JSON and logs are always kept there)")
    p.add_argument("--rerender", metavar="RESULTS_JSON", default=None,
                   help="do not run anything: recompute the tables, target checks and plot "
                        "of an earlier results.json (into --out-dir, default its directory; "
                        "without --rerender: run the sweep)")
    p.add_argument("--plot-workers", nargs="+", metavar="RESULTS_JSON", default=None,
                   help="do not run anything: plot time per iteration and throughput "
                        "against workers from several results.json (e.g. -n 2 and -n 4) "
                        "into --out-dir (time_vs_workers.png, throughput_vs_workers.png "
                        "with the ideal line, scaling.md: efficiency = compute / iteration); "
                        "several files with the same -n (and the same rates, time scale, "
                        "model, batch, servers, placement, queue and emulated compute) are "
                        "one point: their mean, bars from the fastest to the slowest, and "
                        "scaling.md lists each one's time and efficiency as 'a / b' "
                        "(default: run the sweep)")
    p.add_argument("--plot-rate", choices=PLOT_RATES, default=None,
                   help="with --plot-workers: first reduce each results.json to one of its "
                        "rates, its fastest (e.g. the balanced point) or its slowest (e.g. "
                        "the exchange-bound point), keeping its compute-only job, so files "
                        "that ran different rate sets share a plot; the files of one -n "
                        "must then share that rate. Default: every rate of every file")
    p.add_argument("--verbose", action="store_true", help="print the workers' output")
    p.add_argument("--no-progress", action="store_true",
                   help="draw no progress bar")


def validate(args: argparse.Namespace) -> None:
    """Check the parsed flags and fill in what they imply (defaults that depend on
    other flags, the variants with typed knobs, the rate list); raises
    :class:`BenchError` (or ``netem.NetemError``) for what no job could run."""
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
    chosen = args.algorithms is not None
    if not chosen:
        args.algorithms = DEFAULT_ALGORITHMS
    variants = parse_variants(args.algorithms)
    import importlib.util
    if importlib.util.find_spec("horovod") is None:
        wanted = [v.label for v in variants if v.store in args.allreduce_algorithms]
        if wanted and chosen:
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
