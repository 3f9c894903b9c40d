"""One benchmark job: the settings every run shares, small parsers, starting a
(rate, algorithm) job through the launcher (in an emulated network when there
is one) and collecting what its workers wrote; the code fingerprint of a result.
"""
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mxnet_cpsgd.cluster import launch, netem, netspec
from mxnet_cpsgd.bench.worker import COMPUTE_ONLY


MODEL_ALIASES = {
    "lenet": "lenet", "lenet5": "lenet",
    "resnet20": "cifar_resnet20_v1", "cifar_resnet20_v1": "cifar_resnet20_v1",
    "inception-bn": "cifar_inception_bn", "inception_bn": "cifar_inception_bn",
    "cifar_inception_bn": "cifar_inception_bn",
    "resnet50": "resnet50_v1", "resnet50_v1": "resnet50_v1",
}
DEFAULT_ALGORITHMS = "ssgd,bitsgd,odsgd,cpsgd,horovod"
UNSHAPED = ("none", "loopback")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "MKL_NUM_THREADS": "1"}


class BenchError(RuntimeError):
    """Bad arguments or nothing could run."""


# ------------------------------------------------------------------- helpers

def parse_list(text: str) -> List[str]:
    return [t.strip().lower() for t in text.split(",") if t.strip()]


#: what a variant's label may contain (it names files and table rows)
LABEL_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class Variant:
    """One entry of ``--algorithms``: a table label, the store it runs and the
    knobs it sets (over the bench-wide ``--threshold`` etc.).

    Args:
        label: the name in every table, file name and plot (``k5``).
        store: the registered store name (``cpsgd``).
        knobs: store knob -> value (validated, typed), e.g. ``{'correction_period': 5}``.
    """
    label: str
    store: str
    knobs: Dict[str, object] = field(default_factory=dict)

    def spec(self) -> str:
        """The variant as ``--algorithms`` syntax (a plain name when it is one)."""
        if self.label == self.store and not self.knobs:
            return self.store
        return "%s=%s" % (self.label, ":".join(
            [self.store] + ["%s=%s" % kv for kv in self.knobs.items()]))

    def as_dict(self) -> dict:
        return {"label": self.label, "store": self.store, "knobs": dict(self.knobs)}


def parse_variants(text: str) -> List[Variant]:
    """``--algorithms`` syntax into variants, knob values still strings.

    Entries are comma-separated; each is a plain store name (``ssgd``, its
    label is the name, lower-cased as before) or ``LABEL=STORE[:KNOB=VALUE...]``
    (``k5=cpsgd:correction_period=5``; the label keeps its case).

    Raises:
        BenchError: a malformed entry, a label used twice.
    """
    variants: List[Variant] = []
    for entry in (t.strip() for t in text.split(",")):
        if not entry:
            continue
        head, _, rest = entry.partition(":")
        if "=" not in head:
            if rest:
                raise BenchError("--algorithms %r: knobs need a label, e.g. "
                                 "mylabel=%s" % (entry, entry))
            variants.append(Variant(entry.lower(), entry.lower()))
            continue
        label, _, store = head.partition("=")
        label, store = label.strip(), store.strip().lower()
        if not LABEL_RE.match(label):
            raise BenchError("--algorithms %r: a label is letters, digits and _ . + - "
                             "only, got %r" % (entry, label))
        if not store:
            raise BenchError("--algorithms %r: no store after %r=" % (entry, label))
        knobs: Dict[str, object] = {}
        for item in (rest.split(":") if rest else []):
            name, eq, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not eq or not name or not value.strip():
                raise BenchError("--algorithms %r: %r is not KNOB=VALUE" % (entry, item))
            if name in knobs:
                raise BenchError("--algorithms %r: knob %s given twice" % (entry, name))
            knobs[name] = value.strip()
        variants.append(Variant(label, store, knobs))
    labels = [v.label for v in variants]
    twice = sorted({l for l in labels if labels.count(l) > 1})
    if twice:
        raise BenchError("--algorithms: label(s) used twice: %s" % ", ".join(twice))
    return variants


def reference_labels(variants) -> Dict[str, str]:
    """Store name -> the label of the first variant that runs it without knobs
    (the row that ratios such as ``/bitsgd`` divide by).  ``variants``: Variant
    objects or their dicts (a results.json's ``config['variants']``); None or
    empty (a results.json from before variants): every name is its own label."""
    refs: Dict[str, str] = {}
    for v in variants or ():
        v = v if isinstance(v, dict) else v.as_dict()
        if not v["knobs"]:
            refs.setdefault(v["store"], v["label"])
    return refs


def rate_bps(rate: str) -> Optional[float]:
    """Bits per second of a rate, None for an unshaped one."""
    if rate in UNSHAPED:
        return None
    return netem.parse_rate(rate)


def netns_available() -> bool:
    try:
        netem.check_available()
        return True
    except netem.NetemError:
        return False


def rate_sort_key(rate):
    bps = rate_bps(rate)
    return (1, 0.0) if bps is None else (0, bps)


def median_of(values):
    return statistics.median(values) if values else float("nan")


def fmt_value(value, spec="%.1f", missing="-"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return spec % value


# --------------------------------------------------------------------- runs

def run_one(args, rate: str, algorithm: str, run_dir: str, use_netns: bool,
            stream, profile: bool = True) -> dict:
    """One launcher job; returns the run's record (workers' JSON + job outcome).

    Args:
        args: the bench's parsed arguments (``args.variants``: label -> Variant).
        rate: the link rate (or none/loopback).
        algorithm: a variant's label (or ``compute``): its store and knobs come
            from ``args.variants``; a label not found there is a plain store name.
        run_dir: where the workers write their JSON and the nodes their logs.
        use_netns: run in emulated hosts (network namespaces).
        stream: where the nodes' output goes as it comes (None: only the logs).
        profile: profile ``--timeline-iters`` iterations when ``--timeline``.
    """
    os.makedirs(run_dir, exist_ok=True)
    variant = getattr(args, "variants", {}).get(algorithm) or Variant(algorithm, algorithm)
    command = [sys.executable, "-m", "mxnet_cpsgd.bench.worker",
               "--model", args.model, "--algorithm", variant.store,
               "--batch-size", str(args.batch_size), "--iters", str(args.iters),
               "--warmup-iters", str(args.warmup_iters),
               "--algo-warmup-steps", str(args.algo_warmup_steps),
               "--threshold", str(args.threshold),
               "--correction-period", str(args.correction_period),
               "--num-servers", str(args.num_servers), "--out-dir", run_dir]
    if variant.knobs:
        command += ["--knobs", json.dumps(variant.knobs)]
    allreduce = variant.store in getattr(args, "allreduce_algorithms", ())
    placement = getattr(args, "placement", "separate")
    emulate_ms = getattr(args, "emulate_compute", 0.0) or 0.0
    # time dilation: the job runs D times slower (compute x D, rates / D); the
    # analysis divides what it measured by D (results.summarize)
    scale = float(getattr(args, "time_scale", 1.0) or 1.0)
    num_hosts, _ = launch.host_of_nodes(args.num_workers, args.num_servers, placement,
                                        allreduce)
    command += ["--placement", placement, "--num-hosts", str(num_hosts)]
    if emulate_ms > 0:
        command += ["--emulate-compute", repr(emulate_ms * scale)]
    if use_netns:
        command += ["--netns", "--root-netns-pid", str(os.getpid())]
    if args.worker_setup:
        command += ["--setup", os.path.abspath(args.worker_setup)]
    if args.timeline and profile and algorithm != COMPUTE_ONLY:
        command += ["--profile-iters", str(args.timeline_iters)]
    emulate = None
    if use_netns:
        emulate = args.unshaped_rate if rate in UNSHAPED else rate
        if rate not in UNSHAPED and getattr(args, "queue", "fifo") != "fifo":
            emulate += "," + args.queue
        if rate not in UNSHAPED:
            emulate = netem.dilate_spec(emulate, scale)
    if algorithm == COMPUTE_ONLY:
        emulate = args.unshaped_rate if use_netns else None  # nothing to shape
    env = dict(THREAD_ENV)
    env["MXNET_CPU_WORKER_NTHREADS"] = str(args.engine_threads)
    if allreduce:
        # Gloo gives up after 30 s by default; a loaded machine can take longer
        # to import MXNet in one worker than in another
        env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")
        if scale != 1 and "HOROVOD_CYCLE_TIME" not in os.environ:
            # Horovod's background loop runs a control round every cycle (1 ms by
            # default): dilated, the same cycles per iteration (measured at 2
            # workers, ResNet-20: 1.33 instead of 1.13 MB per iteration at D = 10
            # with the cycle left at 1 ms)
            env["HOROVOD_CYCLE_TIME"] = "%g" % scale
    load_before = os.getloadavg()
    started = time.time()
    try:
        result = launch.run_job(command, args.num_workers, args.num_servers, env=env,
                                timeout=30, job_timeout=args.job_timeout,
                                emulate_network=emulate,
                                log_dir=os.path.join(run_dir, "logs"), stream=stream,
                                placement=placement, allreduce=allreduce)
    except (launch.LaunchError, netem.NetemError) as err:
        # nothing of this job runs any more (run_job cleans up before raising)
        result = launch.JobResult(1, "", "could not start the job: %s" % err)
    elapsed = time.time() - started
    workers = []
    for rank in range(args.num_workers):
        path = os.path.join(run_dir, "worker-%d.json" % rank)
        if os.path.exists(path):
            with open(path) as f:
                workers.append(json.load(f))
    failure = result.failure
    if failure is None and len(workers) != args.num_workers:
        failure = "only %d of %d workers wrote results" % (len(workers), args.num_workers)
    if failure is not None:
        failure = "%s\n%s" % (failure, failure_tail(result.output, failure))
    return {"rate": rate, "algorithm": algorithm, "store": variant.store,
            "knobs": dict(variant.knobs), "emulate_network": emulate,
            "fair_leaf_limit": os.environ.get(netspec.FAIR_LEAF_LIMIT_ENV),
            "placement": placement, "allreduce": allreduce, "emulate_compute_ms": emulate_ms,
            "time_scale": scale, "horovod_cycle_time_ms": env.get("HOROVOD_CYCLE_TIME"),
            "num_hosts": num_hosts,
            "run_dir": run_dir, "failure": failure, "returncode": result.returncode,
            "elapsed_s": elapsed, "load_before": list(load_before),
            "load_after": list(os.getloadavg()), "workers": workers}


def failure_tail(output: str, failure: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a failed job's output, preceded by the last lines
    of the node the failure names ("worker 1 exited with signal SIGSEGV") when those
    are not among them: the node that died is often not the one that printed last."""
    all_lines = output.splitlines()
    tail = all_lines[-lines:]
    named = re.match(r"((?:worker|server|rendezvous) \d+|scheduler)\b", failure)
    if named:
        prefix = "[%s] " % named.group(1)
        own = [line for line in all_lines if line.startswith(prefix)][-lines:]
        own = [line for line in own if line not in tail]
        if own:
            tail = own + ["..."] + tail
    return "\n".join(tail)


def code_fingerprint() -> dict:
    """sha256 (first 12 hex digits) of the files that decide what a store does,
    so that results can be matched to the code that produced them."""
    import hashlib
    import mxnet_cpsgd
    import kvstore_ext
    found = {}
    for package in (mxnet_cpsgd, kvstore_ext):
        root = os.path.dirname(package.__file__)
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    with open(path, "rb") as f:
                        digest = hashlib.sha256(f.read()).hexdigest()[:12]
                    found[os.path.relpath(path, os.path.dirname(root))] = digest
    return found
