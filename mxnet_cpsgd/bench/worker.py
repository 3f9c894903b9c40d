"""The per-worker timing loop of ``cpsgd-bench`` (one process per worker).

``cpsgd-bench`` starts this module as the workers' command of a launcher job
(``python -m mxnet_cpsgd.bench.worker ...``); run by hand it needs the same
ps-lite environment as any worker.  Each worker

1. builds the model on synthetic tensors and a ``gluon.Trainer`` with the
   algorithm's store (``--algorithm compute`` trains the same way with *no*
   kvstore at all: a plain local SGD update; a bare ``dist_sync`` store is
   created only for the rank and the start/stop barriers and never carries
   a gradient);
2. runs ``--warmup-iters`` discarded iterations (the algorithm's own warm-up,
   ``--algo-warmup-steps``, must end inside them);
3. drains the pipeline (``waitall``), reads its interface's byte counters,
   meets the other workers at a barrier and runs ``--iters`` timed iterations.
   An iteration's time is the time between the moments its loss and the
   previous iteration's loss became readable, which is what a training loop
   that updates a metric every iteration sees; communication that is still
   running in the background (CP-SGD, OD-SGD) is not waited for;
4. drains again, meets at a barrier, reads the counters again; rank 0 also
   reads the counters of the servers' namespaces;
5. optionally profiles ``--profile-iters`` more iterations with MXNet's
   profiler (after the timed window, so profiling never disturbs it);
6. writes ``worker-<rank>.json`` into ``--out-dir``.
"""
import argparse
import json
import os
import runpy
import sys
import time
import traceback

from .probes import (cpu_seconds, job_namespaces, job_peers, memory_kb, read_counters,
                     read_drops, read_server_counters, read_stall_counters,
                     server_namespaces, system_cpu_seconds)

WORKLOADS = {
    # model name: (sample shape, classes)
    "lenet": ((1, 28, 28), 10),
    "cifar_resnet20_v1": ((3, 32, 32), 10),
    "cifar_inception_bn": ((3, 32, 32), 10),
    "resnet50_v1": ((3, 224, 224), 1000),
}

COMPUTE_ONLY = "compute"
#: stock MXNet dist_sync (gluon.Trainer(kvstore=mx.kv.create('dist_sync'))), a baseline
STOCK_SYNC = "dist_sync"


def _parser():
    p = argparse.ArgumentParser(prog="python -m mxnet_cpsgd.bench.worker",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cifar_resnet20_v1", choices=sorted(WORKLOADS),
                   help="the network, on synthetic data (default cifar_resnet20_v1)")
    p.add_argument("--algorithm", required=True,
                   help="a registered store name, or '%s' (no kvstore)" % COMPUTE_ONLY)
    p.add_argument("--batch-size", type=int, default=32,
                   help="samples per iteration (default 32)")
    p.add_argument("--iters", type=int, default=30, help="timed iterations (default 30)")
    p.add_argument("--warmup-iters", type=int, default=10,
                   help="discarded iterations before timing (default 10)")
    p.add_argument("--algo-warmup-steps", type=int, default=5,
                   help="warmup_steps of the stores whose warm-up is on (default 5)")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="threshold of the stores that take one (default 0.5)")
    p.add_argument("--correction-period", type=int, default=5,
                   help="correction_period of the CP-SGD stores (default 5)")
    p.add_argument("--knobs", default=None, metavar="JSON",
                   help="a JSON object of store knobs (an algorithm variant of cpsgd-bench); "
                        "they override --threshold/--correction-period/--algo-warmup-steps "
                        "(default: none)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--out-dir", required=True, help="where the worker writes its JSON")
    p.add_argument("--netns", action="store_true",
                   help="this worker runs in its own network namespace: read eth0's counters")
    p.add_argument("--num-servers", type=int, default=1,
                   help="servers of the job (default 1)")
    p.add_argument("--root-netns-pid", type=int, default=None,
                   help="a process in the root network namespace (the bench itself), to "
                        "read the links' receive-side tbf counters through (default: "
                        "none, no drop counts)")
    p.add_argument("--profile-iters", type=int, default=0,
                   help="iterations profiled with MXNet's profiler after the timed ones "
                        "(default 0)")
    p.add_argument("--emulate-compute", type=float, default=0.0, metavar="MS",
                   help="replace forward/backward by engine waits totalling MS ms per "
                        "iteration, releasing each layer's gradients in reverse order "
                        "(mxnet_cpsgd.bench.emulate); 0 (default): real compute")
    p.add_argument("--placement", default="separate", choices=("separate", "colocated"),
                   help="how the job's nodes sit on the emulated hosts, for the counters "
                        "(default separate)")
    p.add_argument("--num-hosts", type=int, default=None,
                   help="emulated hosts (namespaces) of the job, for the tbf drop counters "
                        "(default: one per node)")
    p.add_argument("--setup", default=None,
                   help="a Python file run in every worker after importing mxnet_cpsgd, "
                        "before the store is created (default: none)")
    return p


# ------------------------------------------------------------------- main

def _store_class(algorithm):
    """The registered store class (a --setup file may have registered more)."""
    import mxnet as mx
    cls = mx.kv.KVStoreBase.kv_registry.get(algorithm)
    if cls is None or getattr(cls, "policy_class", None) is None:
        raise SystemExit("bench worker: %r is not a registered mxnet_cpsgd store" % algorithm)
    return cls


def _any_store_class(algorithm):
    import mxnet as mx
    cls = mx.kv.KVStoreBase.kv_registry.get(algorithm)
    if cls is None:
        raise SystemExit("bench worker: %r is not a registered store" % algorithm)
    return cls


def is_allreduce(cls) -> bool:
    """Whether a store class is an all-reduce (Horovod) store: ``horovod`` and
    the compressors built on it (they run as Horovod/Gloo jobs, not ps-lite)."""
    if getattr(cls, "policy_class", None) is not None:
        return False
    try:
        from mxnet_cpsgd.stores.allreduce.horovod import Horovod
        if issubclass(cls, Horovod):
            return True
    except ImportError:
        pass
    module = getattr(cls, "__module__", "")
    return module.startswith(("mxnet_cpsgd.stores.allreduce", "mxnet_cpsgd.compressors"))


def store_defaults(cls) -> dict:
    """The knobs a store class accepts, with their defaults ({} for none):
    a parameter-server store's policy's, an all-reduce compressor's."""
    policy = getattr(cls, "policy_class", None)
    if policy is not None:
        return dict(policy.defaults)
    knob_defaults = getattr(cls, "knob_defaults", None)
    if knob_defaults is not None:
        return dict(knob_defaults())
    compressor = getattr(cls, "compressor_class", None)
    return dict(getattr(compressor, "defaults", None) or {})


def _variant_knobs(args) -> dict:
    return json.loads(args.knobs) if args.knobs else {}


def _knobs(algorithm, args):
    """The bench-wide knobs the store uses, then the variant's own (which win)."""
    defaults = _store_class(algorithm).policy_class.defaults
    knobs = {}
    if "threshold" in defaults:
        knobs["threshold"] = args.threshold
    # a knob that is off by default (None: BIT-SGD's ablation knobs) stays off
    if defaults.get("correction_period", None) is not None:
        knobs["correction_period"] = args.correction_period
    if "warmup_steps" in defaults and defaults["warmup_steps"] is not None:
        knobs["warmup_steps"] = args.algo_warmup_steps
    knobs.update(_variant_knobs(args))
    return knobs


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except BaseException:  # noqa: B902
        # Leave at once: a normal interpreter exit would run ps-lite's Finalize,
        # whose barrier waits forever for the other workers (blocked in this
        # round), so the job would hang until the launcher's job timeout.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _main(args):
    # The launcher's worker-index hint shares the MXNET_CPSGD_ prefix that the
    # store's configuration reads (and rejects unknown names of); keep it aside.
    worker_index = os.environ.pop("MXNET_CPSGD_WORKER_INDEX", None)
    import mxnet as mx

    import mxnet_cpsgd  # noqa: F401  (registers the stores)

    if args.setup:
        # e.g. a prototype that patches a store class, for an A/B comparison
        runpy.run_path(args.setup, run_name="cpsgd_bench_setup")

    store, barrier_kv, knobs = _create_store(mx, args)
    work = _Training(mx, args, store, barrier_kv)

    t_setup = time.perf_counter()
    work.iterate(args.warmup_iters)
    warmup_s = time.perf_counter() - t_setup

    window = _timed_window(mx, args, work)

    hwm, rss = memory_kb()  # before profiling, which allocates for its records
    profile = None
    if args.profile_iters > 0:
        profile = _profile(mx, args, work.rank, work.iterate, work.barrier)

    record = _record(args, work, worker_index, knobs, warmup_s, window,
                     (hwm, rss), profile)
    _write_record(args, work.rank, record)
    if work.allreduce:
        mx.nd.waitall()
        sys.stdout.flush()
        sys.stderr.flush()
        store._hvd.shutdown()
        os._exit(0)
    _fast_exit(mx, work.native_kv())


def _create_store(mx, args):
    """(store or None, the bare dist_sync store of the compute-only job or None,
    the knobs the store got)."""
    if args.algorithm == COMPUTE_ONLY:
        barrier_kv = mx.kv.create("dist_sync")
        store = None
        knobs = {}
    elif args.algorithm == STOCK_SYNC:
        # MXNet's own store, for comparison: the server sums the workers'
        # gradients, so trainer.step gets the global batch
        store = mx.kv.create("dist_sync")
        barrier_kv = None
        knobs = {}
    elif is_allreduce(_any_store_class(args.algorithm)):
        # the store's constructor waits for the job's rendezvous (init_horovod)
        cls = _any_store_class(args.algorithm)
        knobs = {}
        if "correction_period" in store_defaults(cls):
            # CP-SGD around a compressor: the bench-wide CP knobs, as for cpsgd
            knobs = {"correction_period": args.correction_period,
                     "warmup_steps": args.algo_warmup_steps}
        knobs.update(_variant_knobs(args))
        store = cls(knobs)
        barrier_kv = None
    else:
        knobs = _knobs(args.algorithm, args)
        store = _store_class(args.algorithm)(knobs)
        barrier_kv = None
    return store, barrier_kv, knobs


class _Training:
    """The model, its Trainer on the store and the synthetic batch: what one
    iteration runs, and the barrier between the workers."""

    def __init__(self, mx, args, store, barrier_kv):
        from mxnet import gluon
        from mxnet_cpsgd.training import models

        self.mx, self.store, self.barrier_kv = mx, store, barrier_kv
        shape, classes = WORKLOADS[args.model]
        self.allreduce = store is not None and is_allreduce(type(store))
        self.rank = int((barrier_kv or store).rank)

        self.net = models.get_model(args.model, classes=classes)
        self.emulated = None
        if args.emulate_compute > 0:
            from mxnet_cpsgd.bench.emulate import EmulatedCompute
            self.num_params = models.initialize(self.net, shape, [mx.cpu()],
                                                hybridize=False, seed=0)
            self.emulated = EmulatedCompute(self.net, shape, args.batch_size,
                                            args.emulate_compute, seed=1 + self.rank)
        else:
            self.num_params = models.initialize(self.net, shape, [mx.cpu()], seed=0)
        self.trainer = gluon.Trainer(self.net.collect_params(), "sgd",
                                     {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4},
                                     kvstore=store)
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        rng = mx.nd.random
        mx.random.seed(1 + self.rank)
        self.data = rng.normal(shape=(args.batch_size,) + shape)
        self.label = mx.nd.array([i % classes for i in range(args.batch_size)])
        mx.nd.waitall()

        self.num_workers = int((barrier_kv or store).num_workers)
        self.step_batch = args.batch_size * (self.num_workers
                                             if args.algorithm == STOCK_SYNC else 1)

    def native_kv(self):
        """The MXNet KVStore underneath (a PolicyStore wraps one in ``_kv``)."""
        if self.store is None:
            return self.barrier_kv
        return getattr(self.store, "_kv", None) or self.store

    def barrier(self):
        self.mx.nd.waitall()
        if self.allreduce:
            flag = self.mx.nd.ones((1,))
            self.store._hvd.allreduce_(flag, name="cpsgd-bench.barrier")
            flag.wait_to_read()
        else:
            self.native_kv()._barrier()

    def iterate(self, count, times=None, step_times=None, link_bytes=None, stall_marks=None):
        from mxnet import autograd
        prev = time.perf_counter()
        for _ in range(count):
            if self.emulated is not None:
                loss = self.emulated.iteration()
            else:
                with autograd.record():
                    loss = self.loss_fn(self.net(self.data), self.label)
                loss.backward()
            before_step = time.perf_counter()
            self.trainer.step(self.step_batch)
            after_step = time.perf_counter()
            loss.wait_to_read()
            now = time.perf_counter()
            if times is not None:
                times.append(now - prev)
                step_times.append(after_step - before_step)
            if link_bytes is not None:
                # this host's link counters at the iteration's end (two sysfs reads):
                # the bytes of each iteration, by round, come from their differences
                link_bytes.append(read_counters())
            if stall_marks is not None:
                stall_marks.append(read_stall_counters())
            prev = now


def _timed_window(mx, args, work):
    """The timed iterations between two barriers, with every counter read on
    either side of them (bytes, drops, CPU)."""
    rank = work.rank
    # separate placement: the servers' own links; colocated: a worker's eth0 is
    # its host's link, which its server shares
    servers = (server_namespaces(args.num_servers)
               if (args.netns and rank == 0 and args.placement == "separate"
                   and not work.allreduce) else [])
    peers = job_peers() if rank == 0 and not work.allreduce else {}
    work.barrier()
    before = read_counters() if args.netns else None
    server_before = read_server_counters(servers) if servers else None
    job = job_namespaces()[0] if (args.netns and rank == 0 and args.root_netns_pid) else None
    num_nodes = args.num_hosts or (1 + args.num_servers + work.num_workers)
    drops_before = read_drops(job, num_nodes, args.root_netns_pid) if job else None
    peer_cpu_before = {pid: cpu_seconds(pid) for pid in peers}
    system_before = system_cpu_seconds()
    cpu_before = cpu_seconds()
    work.barrier()
    times, step_times = [], []
    link_marks = [before] if args.netns else None
    stall_marks, start_unix, start = [read_stall_counters()], time.time(), time.perf_counter()
    work.iterate(args.iters, times, step_times, link_marks, stall_marks)
    loop_s = time.perf_counter() - start
    mx.nd.waitall()
    drained_s = time.perf_counter() - start
    work.barrier()
    cpu_after = cpu_seconds()
    system_after = system_cpu_seconds()
    after = read_counters() if args.netns else None
    server_after = read_server_counters(servers) if servers else None
    drops_after = read_drops(job, num_nodes, args.root_netns_pid) if job else None
    peer_cpu = {}
    for pid, role in peers.items():
        now = cpu_seconds(pid)
        if now is not None and peer_cpu_before.get(pid) is not None:
            peer_cpu.setdefault(role, 0.0)
            peer_cpu[role] += now - peer_cpu_before[pid]
    return {"times": times, "step_times": step_times, "loop_s": loop_s,
            "drained_s": drained_s, "before": before, "after": after,
            "start_unix": start_unix, "link_marks": link_marks, "stall_marks": stall_marks,
            "server_before": server_before, "server_after": server_after,
            "cpu": (cpu_before, cpu_after),
            "peer_cpu": peer_cpu, "system": (system_before, system_after),
            "drops": (drops_before, drops_after)}


def _differences(marks, field):
    return [b[field] - a[field] for a, b in zip(marks, marks[1:])]


def _record(args, work, worker_index, knobs, warmup_s, window, memory, profile):
    """The worker's JSON record (worker-<rank>.json)."""
    rank, emulated = work.rank, work.emulated
    before, after, link_marks = window["before"], window["after"], window["link_marks"]
    server_before, server_after = window["server_before"], window["server_after"]
    cpu_before, cpu_after = window["cpu"]
    system_before, system_after = window["system"]
    drops_before, drops_after = window["drops"]
    hwm, rss = memory
    return {
        "rank": rank,
        "worker_index": int(worker_index) if worker_index is not None else rank,
        "algorithm": args.algorithm,
        "knobs": knobs,
        "model": args.model,
        "batch_size": args.batch_size,
        "num_params": work.num_params,
        "param_bytes": 4 * work.num_params,
        "warmup_iters": args.warmup_iters,
        "warmup_s": warmup_s,
        "iters": args.iters,
        "iter_times_s": window["times"],
        # wall clock at the window's start, to line iterations up with other logs
        "window_start_unix": window["start_unix"],
        # Python time inside trainer.step (the engine runs asynchronously)
        "step_call_s": window["step_times"],
        "loop_s": window["loop_s"],
        "drained_s": window["drained_s"],
        "tx_bytes": after[0] - before[0] if args.netns else None,
        "rx_bytes": after[1] - before[1] if args.netns else None,
        # per timed iteration: bytes this host's link sent / received between the
        # moments the previous and this iteration's loss became readable
        "iter_tx_bytes": _differences(link_marks, 0) if link_marks else None,
        "iter_rx_bytes": _differences(link_marks, 1) if link_marks else None,
        # per timed iteration: this namespace's TCP retransmission timeouts and
        # retransmitted segments, and the whole machine's busy CPU seconds
        "iter_tcp_timeouts": _differences(window["stall_marks"], 0),
        "iter_tcp_retrans": _differences(window["stall_marks"], 1),
        "iter_machine_busy_s": _differences(window["stall_marks"], 2),
        "server_bytes": ([{"tx": a[0] - b[0], "rx": a[1] - b[1]}
                          for b, a in zip(server_before, server_after)]
                         if server_before and server_after else None),
        # CPU seconds over the timed window (from barrier to barrier): this
        # worker's process, and (rank 0 only) the servers' and the scheduler's
        "cpu_s": cpu_after - cpu_before,
        "peer_cpu_s": window["peer_cpu"] if rank == 0 else None,
        # the whole machine's busy CPU seconds over the same window
        "system_busy_s": system_after[0] - system_before[0],
        "system_total_s": system_after[1] - system_before[1],
        # packets dropped by the emulated links' tbf queues (all nodes, window)
        "tbf_drops": ({k: drops_after[k] - drops_before[k] for k in drops_after}
                      if drops_before and drops_after else None),
        "vmhwm_kb": hwm,
        "vmrss_kb": rss,
        "profile": profile,
        "emulate_compute_ms": args.emulate_compute,
        "emulated_layers": emulated.describe() if emulated is not None else None,
        "placement": args.placement,
        "allreduce": work.allreduce,
        "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",
                                                   "MXNET_CPU_WORKER_NTHREADS")},
    }


def _write_record(args, rank, record):
    path = os.path.join(args.out_dir, "worker-%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    times = record["iter_times_s"]
    print("bench worker %d: %s median %.1f ms over %d iterations"
          % (rank, args.algorithm, 1e3 * sorted(times)[len(times) // 2] if times else 0,
             len(times)))


def _fast_exit(mx, kv):
    """Leave the job now: finalize ps-lite, then exit without interpreter teardown.

    Freeing the native store runs ps-lite's Finalize (a barrier with the other
    workers; rank 0 then stops the servers).  The servers exit right after it,
    and the launcher fails a job whose server exits while a worker still runs
    for more than a few seconds -- which an ordinary interpreter and MXNet
    engine teardown can exceed on a loaded machine.  Everything this process
    produced is written before this point.
    """
    mx.nd.waitall()
    sys.stdout.flush()
    sys.stderr.flush()
    mx.base.check_call(mx.base._LIB.MXKVStoreFree(kv.handle))
    os._exit(0)


def _profile(mx, args, rank, iterate, barrier):
    """Profile ``--profile-iters`` iterations; returns the trace path and clock anchor."""
    path = os.path.join(args.out_dir, "profile-%d.json" % rank)
    mx.profiler.set_config(profile_all=True, filename=path, aggregate_stats=False)
    barrier()
    mx.profiler.set_state("run")
    domain = mx.profiler.Domain("cpsgd-bench")
    # clock anchor: the same instant on the wall clock and on the profiler's clock
    anchor_wall_us = time.time() * 1e6
    mx.profiler.Marker(domain, "bench-anchor").mark("process")
    starts = []
    for _ in range(args.profile_iters):
        starts.append(time.time() * 1e6)
        iterate(1)
    mx.nd.waitall()
    end_wall_us = time.time() * 1e6
    mx.profiler.set_state("stop")
    mx.profiler.dump(finished=True)
    return {"file": os.path.basename(path), "anchor_wall_us": anchor_wall_us,
            "iteration_starts_wall_us": starts, "end_wall_us": end_wall_us}


if __name__ == "__main__":
    sys.exit(main())
