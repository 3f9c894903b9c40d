"""Benchmark the algorithms' time per iteration over emulated networks.

Usage::

    cpsgd-bench [--model cifar_resnet20_v1] [-n 2] [-s 1] [--batch-size 32]
        [--rates none,1gbit,100mbit] [--algorithms ssgd,bitsgd,odsgd,cpsgd]
        [--iters 30] [--warmup-iters 10] [--timeline] [--out-dir DIR]

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
  iterations of bitsgd and cpsgd one above the other).

Rates: ``none`` runs every node in its own network namespace on a bridge with
links so fast (``--unshaped-rate``, default 100gbit) that tbf never queues, so
bytes can still be counted; ``loopback`` runs on 127.0.0.1 like a plain
launcher job (no byte counts); any tc rate (``100mbit``, ``1gbit``) shapes
both directions of every node's link.  Namespaces need root; without it
``none`` falls back to ``loopback`` and shaped rates are skipped.

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
  the bytes it carried per iteration: max over every worker's up/down link
  and every server's up/down link (servers' counters read by worker 0) of
  bytes x 8 / rate.
* peak RSS: VmHWM of the worker processes, the largest over workers.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

from mxnet_cpsgd.cluster import launch, netem
from mxnet_cpsgd.bench.worker import COMPUTE_ONLY, STOCK_SYNC, WORKLOADS

MODEL_ALIASES = {
    "lenet": "lenet", "lenet5": "lenet",
    "resnet20": "cifar_resnet20_v1", "cifar_resnet20_v1": "cifar_resnet20_v1",
    "inception-bn": "cifar_inception_bn", "inception_bn": "cifar_inception_bn",
    "cifar_inception_bn": "cifar_inception_bn",
    "resnet50": "resnet50_v1", "resnet50_v1": "resnet50_v1",
}
DEFAULT_ALGORITHMS = "ssgd,bitsgd,odsgd,cpsgd"
UNSHAPED = ("none", "loopback")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "MKL_NUM_THREADS": "1"}
# targets of docs/performance.md
TARGET_VS_BITSGD = 0.70
TARGET_VS_SSGD = 0.60
TARGET_VS_BOUND = 1.10
TARGET_RSS = 1.20
NOISE = 1.05
NETWORK_BOUND = 1.20  # bitsgd is network-bound where shaping makes it >= this x slower


class BenchError(RuntimeError):
    """Bad arguments or nothing could run."""


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


# ------------------------------------------------------------------- helpers

def parse_list(text: str) -> List[str]:
    return [t.strip().lower() for t in text.split(",") if t.strip()]


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


def _rate_sort_key(rate):
    bps = rate_bps(rate)
    return (1, 0.0) if bps is None else (0, bps)


def _median(values):
    return statistics.median(values) if values else float("nan")


def _fmt(value, spec="%.1f", missing="-"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return spec % value


# --------------------------------------------------------------------- runs

def run_one(args, rate: str, algorithm: str, run_dir: str, use_netns: bool,
            stream, profile: bool = True) -> dict:
    """One launcher job; returns the run's record (workers' JSON + job outcome)."""
    os.makedirs(run_dir, exist_ok=True)
    command = [sys.executable, "-m", "mxnet_cpsgd.bench.worker",
               "--model", args.model, "--algorithm", algorithm,
               "--batch-size", str(args.batch_size), "--iters", str(args.iters),
               "--warmup-iters", str(args.warmup_iters),
               "--algo-warmup-steps", str(args.algo_warmup_steps),
               "--threshold", str(args.threshold),
               "--correction-period", str(args.correction_period),
               "--num-servers", str(args.num_servers), "--out-dir", run_dir]
    if use_netns:
        command += ["--netns", "--root-netns-pid", str(os.getpid())]
    if args.worker_setup:
        command += ["--setup", os.path.abspath(args.worker_setup)]
    if args.timeline and profile and algorithm != COMPUTE_ONLY:
        command += ["--profile-iters", str(args.timeline_iters)]
    emulate = None
    if use_netns:
        emulate = args.unshaped_rate if rate in UNSHAPED else rate
    if algorithm == COMPUTE_ONLY:
        emulate = args.unshaped_rate if use_netns else None  # nothing to shape
    env = dict(THREAD_ENV)
    env["MXNET_CPU_WORKER_NTHREADS"] = str(args.engine_threads)
    load_before = os.getloadavg()
    started = time.time()
    try:
        result = launch.run_job(command, args.num_workers, args.num_servers, env=env,
                                timeout=30, job_timeout=args.job_timeout,
                                emulate_network=emulate,
                                log_dir=os.path.join(run_dir, "logs"), stream=stream)
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
        tail = "\n".join(result.output.splitlines()[-15:])
        failure = "%s\n%s" % (failure, tail)
    return {"rate": rate, "algorithm": algorithm, "emulate_network": emulate,
            "run_dir": run_dir, "failure": failure, "returncode": result.returncode,
            "elapsed_s": elapsed, "load_before": list(load_before),
            "load_after": list(os.getloadavg()), "workers": workers}


def summarize(run: dict, num_servers: int) -> dict:
    """The table row of one run (None values where not measured)."""
    row = {"rate": run["rate"], "algorithm": run["algorithm"], "failure": run["failure"],
           "load_before": run["load_before"], "load_after": run["load_after"]}
    workers = run["workers"]
    if run["failure"] or not workers:
        return row
    per_worker_ms = [[1e3 * t for t in w["iter_times_s"]] for w in workers]
    medians = [_median(ts) for ts in per_worker_ms]
    row["median_ms"] = statistics.mean(medians)
    row["min_ms"] = min(min(ts) for ts in per_worker_ms)
    row["max_ms"] = max(max(ts) for ts in per_worker_ms)
    # throughput: the timed window up to the moment everything it issued had
    # finished (waitall), divided by the iterations; mean over workers
    row["mean_ms"] = statistics.mean(1e3 * w["drained_s"] / w["iters"] for w in workers)
    row["step_call_ms"] = statistics.mean(_median([1e3 * t for t in w.get("step_call_s") or []])
                                          for w in workers)
    row["worker_median_ms"] = medians
    row["samples_per_s_per_worker"] = workers[0]["batch_size"] / (row["mean_ms"] / 1e3)
    row["param_bytes"] = workers[0]["param_bytes"]
    row["num_params"] = workers[0]["num_params"]
    window_s = statistics.mean(w["drained_s"] for w in workers)
    if all(w.get("cpu_s") is not None for w in workers):
        row["worker_cpu_ms_per_iter"] = statistics.mean(1e3 * w["cpu_s"] / w["iters"]
                                                        for w in workers)
        peer = next((w["peer_cpu_s"] for w in workers if w.get("peer_cpu_s")), None)
        row["server_cpu_ms_per_iter"] = (1e3 * peer.get("server", 0.0) / workers[0]["iters"]
                                         if peer else None)
        total = sum(w["cpu_s"] for w in workers) + (sum(peer.values()) if peer else 0.0)
        row["cpu_busy_cores"] = total / window_s if window_s else None
        # what this machine's cores need for one iteration of the whole job
        row["cpu_floor_ms"] = 1e3 * total / workers[0]["iters"] / (os.cpu_count() or 1)
        system = [w.get("system_busy_s") for w in workers if w.get("peer_cpu_s")]
        if system and system[0] is not None and window_s:
            # everything else the machine did meanwhile (other jobs, kernel work)
            row["other_cpu_cores"] = max(0.0, system[0] - total) / window_s
    drops = next((w["tbf_drops"] for w in workers if w.get("tbf_drops")), None)
    if drops is not None:
        row["tbf_drops_per_iter"] = (drops["send"] + drops["receive"]) / workers[0]["iters"]
    row["peak_rss_mb"] = max(w["vmhwm_kb"] or 0 for w in workers) / 1024.0
    row["mean_peak_rss_mb"] = statistics.mean((w["vmhwm_kb"] or 0) for w in workers) / 1024.0
    iters = workers[0]["iters"]
    if all(w.get("tx_bytes") is not None for w in workers):
        tx = [w["tx_bytes"] / iters for w in workers]
        rx = [w["rx_bytes"] / iters for w in workers]
        row["tx_bytes_per_iter"] = statistics.mean(tx)
        row["rx_bytes_per_iter"] = statistics.mean(rx)
        row["bytes_per_iter"] = statistics.mean(t + r for t, r in zip(tx, rx))
        links = {"worker %d up" % w["rank"]: t for w, t in zip(workers, tx)}
        links.update({"worker %d down" % w["rank"]: r for w, r in zip(workers, rx)})
        server = next((w["server_bytes"] for w in workers if w.get("server_bytes")), None)
        if server:
            for j, s in enumerate(server):
                links["server %d up" % j] = s["tx"] / iters
                links["server %d down" % j] = s["rx"] / iters
            row["server_counters"] = "measured"
        else:
            # every worker talks only to the servers (and, negligibly, the scheduler)
            links["servers up (estimated)"] = sum(rx) / num_servers
            links["servers down (estimated)"] = sum(tx) / num_servers
            row["server_counters"] = "estimated from workers' counters"
        row["link_bytes_per_iter"] = links
        busiest = max(links, key=links.get)
        row["busiest_link"] = busiest
        bps = rate_bps(run["rate"])
        if bps is not None:
            row["transfer_bound_ms"] = 1e3 * links[busiest] * 8 / bps
    return row


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


def combine_repeats(rows: List[dict]) -> List[dict]:
    """One row per (rate, algorithm): the median over repeats of each number.

    min/max are over all repeats; ``repeat_mean_ms`` lists each repeat's
    mean; failed repeats are left out (``failed_repeats`` counts them).
    """
    groups: Dict[tuple, List[dict]] = {}
    for row in rows:
        groups.setdefault((row["rate"], row["algorithm"]), []).append(row)
    combined = []
    for (rate, algorithm), group in groups.items():
        good = [r for r in group if r.get("mean_ms") is not None]
        if not good:
            combined.append(group[0])
            continue
        row = {"rate": rate, "algorithm": algorithm, "failure": None,
               "repeats": len(good), "failed_repeats": len(group) - len(good),
               "repeat_mean_ms": [r["mean_ms"] for r in good],
               "load_before": [r["load_before"] for r in good],
               "load_after": [r["load_after"] for r in good]}
        for key in good[0]:
            if key in row:
                continue
            values = [r.get(key) for r in good]
            if key == "min_ms":
                row[key] = min(values)
            elif key == "max_ms":
                row[key] = max(values)
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool)
                     for v in values):
                row[key] = statistics.median(values)
            else:
                row[key] = values[0] if len(good) == 1 else values
        combined.append(row)
    return combined


def add_ratios(rows: List[dict], compute_ms: Optional[float]) -> None:
    by_key = {(r["rate"], r["algorithm"]): r for r in rows}
    for row in rows:
        t = row.get("mean_ms")
        if t is None:
            continue
        for ref in ("ssgd", "bitsgd"):
            other = by_key.get((row["rate"], ref), {}).get("mean_ms")
            row["vs_" + ref] = t / other if other else None
            other_rss = by_key.get((row["rate"], ref), {}).get("peak_rss_mb")
            row["rss_vs_" + ref] = row["peak_rss_mb"] / other_rss if other_rss else None
        row["vs_compute"] = t / compute_ms if compute_ms else None
        bound = row.get("transfer_bound_ms")
        row["vs_bound"] = t / bound if bound else None
        floor = max(compute_ms or 0.0, bound or 0.0)
        row["floor_ms"] = floor or None
        row["vs_floor"] = t / floor if floor else None
        machine = max(row.get("cpu_floor_ms") or 0.0, bound or 0.0)
        row["vs_machine_floor"] = t / machine if machine else None


def check_targets(rows: List[dict], compute_ms: Optional[float]) -> List[dict]:
    """The performance targets of docs/performance.md, per rate, for cpsgd."""
    by_key = {(r["rate"], r["algorithm"]): r for r in rows}
    checks = []
    # bitsgd is network-bound at a rate where that rate makes it NETWORK_BOUND
    # times slower than without shaping (or, with no unshaped run, than compute-only)
    unshaped_bit = next((by_key[(r, "bitsgd")].get("mean_ms") for r in UNSHAPED
                         if (r, "bitsgd") in by_key), None) or compute_ms
    for row in rows:
        if row["algorithm"] != "cpsgd" or row.get("mean_ms") is None:
            continue
        rate = row["rate"]
        bit = by_key.get((rate, "bitsgd"), {}).get("mean_ms")
        ssgd = by_key.get((rate, "ssgd"), {}).get("mean_ms")
        net_bound = bool(bit and unshaped_bit and rate not in UNSHAPED
                         and bit >= NETWORK_BOUND * unshaped_bit)

        def add(name, value, limit, applies=True):
            checks.append({"rate": rate, "target": name, "value": value, "limit": limit,
                           "applies": applies,
                           "met": None if (value is None or not applies) else value <= limit})
        add("cpsgd/bitsgd (network-bound for bitsgd)", row.get("vs_bitsgd"),
            TARGET_VS_BITSGD, net_bound)
        add("cpsgd/ssgd (network-bound for bitsgd)", row.get("vs_ssgd"),
            TARGET_VS_SSGD, net_bound)
        add("cpsgd/max(compute-only, transfer bound)", row.get("vs_floor"), TARGET_VS_BOUND)
        add("cpsgd/ssgd (never worse beyond noise)", row.get("vs_ssgd"), NOISE,
            ssgd is not None)
        add("cpsgd peak RSS / ssgd", row.get("rss_vs_ssgd"), TARGET_RSS)
    return checks


# ------------------------------------------------------------------- output

TIME_COLUMNS = [
    ("rate", "rate", "%s"), ("algorithm", "algorithm", "%s"),
    ("mean_ms", "ms/iter", "%.1f"), ("median_ms", "median", "%.1f"),
    ("min_ms", "min", "%.1f"), ("max_ms", "max", "%.1f"),
    ("samples_per_s_per_worker", "samples/s/worker", "%.1f"),
    ("vs_ssgd", "/ssgd", "%.2f"), ("vs_bitsgd", "/bitsgd", "%.2f"),
    ("vs_compute", "/compute", "%.2f"), ("transfer_bound_ms", "bound ms", "%.1f"),
    ("vs_bound", "/bound", "%.2f"), ("vs_floor", "/max(compute,bound)", "%.2f"),
    ("vs_machine_floor", "/max(CPU floor,bound)", "%.2f"),
]
RESOURCE_COLUMNS = [
    ("rate", "rate", "%s"), ("algorithm", "algorithm", "%s"),
    ("tx_kb", "KB sent/iter/worker", "%.1f"), ("rx_kb", "KB recv/iter/worker", "%.1f"),
    ("tbf_drops_per_iter", "drops/iter", "%.1f"),
    ("step_call_ms", "step() ms", "%.1f"),
    ("worker_cpu_ms_per_iter", "worker CPU ms/iter", "%.0f"),
    ("server_cpu_ms_per_iter", "server CPU ms/iter", "%.0f"),
    ("cpu_floor_ms", "CPU floor ms", "%.0f"),
    ("cpu_busy_cores", "cores busy", "%.2f"), ("other_cpu_cores", "other load", "%.2f"),
    ("peak_rss_mb", "peak RSS MB", "%.0f"), ("rss_vs_ssgd", "RSS/ssgd", "%.2f"),
]
COLUMNS = TIME_COLUMNS + RESOURCE_COLUMNS[2:]


def markdown_table(rows: List[dict], columns=None) -> str:
    columns = columns or TIME_COLUMNS
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(columns))) + "|"]
    for row in rows:
        if row.get("failure"):
            lines.append("| %s | %s | failed: %s |" % (
                row["rate"], row["algorithm"], row["failure"].splitlines()[0]))
            continue
        cells = []
        for key, _, spec in columns:
            value = row.get(key)
            if key in ("tx_kb", "rx_kb"):
                raw = row.get(key[:2] + "_bytes_per_iter")
                value = raw / 1e3 if raw is not None else None
            cells.append(_fmt(value, spec) if not isinstance(value, str) else value)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(result: dict) -> str:
    cfg = result["config"]
    out = ["# cpsgd-bench results", "",
           "Command: `%s`" % result["command"], "",
           "Model %s, %d workers, %d server(s), batch %d per worker, %d timed iterations "
           "after %d discarded (algorithm warm-up %d steps), threshold %g, correction "
           "period %d; started %s; load average (1/5/15 min) at start %s, at end %s." % (
               cfg["model"], cfg["num_workers"], cfg["num_servers"], cfg["batch_size"],
               cfg["iters"], cfg["warmup_iters"], cfg["algo_warmup_steps"], cfg["threshold"],
               cfg["correction_period"], result["started"],
               "/".join("%.2f" % x for x in result["load_start"]),
               "/".join("%.2f" % x for x in result["load_end"])), ""]
    out.append(markdown_table(result["rows"], TIME_COLUMNS))
    out += ["", markdown_table(result["rows"], RESOURCE_COLUMNS)]
    out += ["", "ms/iter: the timed window (up to the moment all work it issued had "
            "finished) divided by the timed iterations, mean over workers: the throughput "
            "figure that every ratio uses; median: mean over workers of each worker's "
            "median iteration (an iteration = the gap between two consecutive losses "
            "becoming readable); with --repeats every column is the median over the "
            "rounds; min/max: over all "
            "workers' timed iterations; step() = Python time inside trainer.step "
            "(median; the engine works asynchronously meanwhile); KB = 1000 bytes counted on the worker's own "
            "interface (Ethernet frames: payload plus TCP/IP and ps-lite overhead); "
            "bound = busiest link direction's bytes per iteration x 8 / rate; "
            "worker CPU = CPU time (user+system, all threads) of one worker process per "
            "timed iteration, mean over workers; server CPU = all servers' CPU time per "
            "iteration; CPU floor = CPU time of workers, servers and scheduler per "
            "iteration divided by the machine's cores (the time per iteration this "
            "machine cannot beat however the work overlaps); cores busy = CPU time of workers, servers and scheduler over the "
            "timed window divided by its length (this machine has %s cores); other load = "
            "the rest of the machine's busy CPU time (other processes, kernel work "
            "such as softirq networking) over the same window, in cores; "
            "drops/iter = packets the emulated links' tbf queues dropped per timed iteration "
            "(all nodes, both directions; a dropped packet may be a 64 KB GSO segment); "
            "peak RSS = largest worker VmHWM. `none` = %s." % (result["cpu_count"],
                                                               cfg["none_mode"]), ""]
    if result["checks"]:
        out += ["## Targets (cpsgd)", "", "| rate | target | value | limit | met |",
                "|---|---|---:|---:|---|"]
        for c in result["checks"]:
            met = "n/a" if not c["applies"] else ("-" if c["met"] is None else
                                                  ("yes" if c["met"] else "**no**"))
            out.append("| %s | %s | %s | %.2f | %s |" % (
                c["rate"], c["target"], _fmt(c["value"], "%.2f"), c["limit"], met))
        out.append("")
    if result.get("timelines"):
        out += ["## Timelines", ""]
        for t in result["timelines"]:
            out.append("- %s: %s" % (t["label"], t["path"]))
        out.append("")
    return "\n".join(out)


def plot(result: dict, out_path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("mean_ms") is not None
            and r["algorithm"] != COMPUTE_ONLY]
    rates = sorted({r["rate"] for r in rows}, key=_rate_sort_key)
    shaped = [rate_bps(r) / 1e6 for r in rates if rate_bps(r) is not None]
    top = max(shaped) if shaped else 1000.0
    def x_of(rate):
        bps = rate_bps(rate)
        return bps / 1e6 if bps is not None else top * 4
    fig, ax = plt.subplots(figsize=(8, 5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        pts = sorted((x_of(r["rate"]), r) for r in rows if r["algorithm"] == algorithm)
        xs = [p[0] for p in pts]
        ys = [p[1]["mean_ms"] for p in pts]
        spread = [p[1].get("repeat_mean_ms") or [p[1]["mean_ms"]] for p in pts]
        lo = [y - min(sp) for y, sp in zip(ys, spread)]
        hi = [max(sp) - y for y, sp in zip(ys, spread)]
        line = ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=algorithm)
        bounds = [(p[0], p[1].get("transfer_bound_ms")) for p in pts
                  if p[1].get("transfer_bound_ms")]
        if bounds:
            ax.plot([b[0] for b in bounds], [b[1] for b in bounds], ls=":", lw=1,
                    color=line[0].get_color())
    if result.get("compute_ms"):
        ax.axhline(result["compute_ms"], color="black", ls="--",
                   label="compute-only (%.0f ms)" % result["compute_ms"])
    ax.set_xscale("log")
    ticks = [x_of(r) for r in rates]
    ax.set_xticks(ticks)
    ax.set_xticklabels([r for r in rates])
    ax.minorticks_off()
    ax.set_xlabel("link rate per node and direction (log scale)")
    ax.set_ylabel("time per iteration, ms (mean; bars: spread over rounds)")
    cfg = result["config"]
    ax.set_title("%s, %d workers + %d server(s), batch %d/worker\n"
                 "dotted: transfer bound of the same colour's measured bytes" % (
                     cfg["model"], cfg["num_workers"], cfg["num_servers"], cfg["batch_size"]),
                 fontsize=10)
    ymax = max([max(r.get("repeat_mean_ms") or [r["mean_ms"]]) for r in rows]
               + [r.get("transfer_bound_ms") or 0 for r in rows]
               + [result.get("compute_ms") or 0])
    ax.set_ylim(0, ymax * 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def build_timelines(result: dict, runs: List[dict], out_dir: str) -> List[dict]:
    from mxnet_cpsgd.bench import timeline

    made = []
    tdir = os.path.join(out_dir, "timeline")
    os.makedirs(tdir, exist_ok=True)
    by_rate: Dict[str, Dict[str, dict]] = {}
    for run in runs:
        workers = [{"rank": w["rank"],
                    "trace": os.path.join(run["run_dir"], w["profile"]["file"]),
                    "iteration_starts_us": w["profile"]["iteration_starts_wall_us"]}
                   for w in run["workers"] if w.get("profile")]
        if run["failure"] or not workers or not all(os.path.exists(w["trace"])
                                                    for w in workers):
            continue
        path = os.path.join(tdir, "%s-%s.trace.json" % (run["rate"], run["algorithm"]))
        timeline.merge_traces(workers, path, title="%s @ %s" % (run["algorithm"], run["rate"]))
        ops = timeline.load_ops(workers[0]["trace"])
        overlap = timeline.comm_overlap(ops)
        made.append({"label": "%s @ %s merged trace" % (run["algorithm"], run["rate"]),
                     "path": os.path.relpath(path, out_dir), "overlap": overlap})
        by_rate.setdefault(run["rate"], {})[run["algorithm"]] = {"workers": workers}
    for rate, algos in by_rate.items():
        chosen = [a for a in ("bitsgd", "cpsgd") if a in algos]
        chosen += [a for a in algos if a not in chosen][:max(0, 2 - len(chosen))]
        panels = [{"label": "%s @ %s" % (a, rate), "workers": algos[a]["workers"]}
                  for a in chosen]
        path = os.path.join(out_dir, "timeline-%s.png" % rate)
        timeline.plot_timelines(panels, path, title="%s: %d profiled iterations" % (
            result["config"]["model"], result["config"]["timeline_iters"]))
        made.append({"label": "%s @ %s plot" % (" vs ".join(chosen), rate),
                     "path": os.path.relpath(path, out_dir)})
    return made


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
    p.add_argument("-s", "--num-servers", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--rates", default="none,1gbit,100mbit",
                   help="comma-separated: none (namespaces, unshaped), loopback, or tc "
                        "rates such as 50mbit,1gbit (default none,1gbit,100mbit)")
    p.add_argument("--algorithms", default=DEFAULT_ALGORITHMS,
                   help="comma-separated store names (default %s); '%s' adds MXNet's own "
                        "dist_sync store as a baseline" % (DEFAULT_ALGORITHMS, STOCK_SYNC))
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
                        "profiler; merged traces and a bitsgd/cpsgd PNG per rate")
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
    p.add_argument("--verbose", action="store_true", help="print the workers' output")
    p.add_argument("--no-progress", action="store_true")
    return p


def _validate(args):
    args.model = MODEL_ALIASES.get(args.model.lower(), args.model)
    if args.model not in WORKLOADS:
        raise BenchError("unknown model %r; known: %s" % (args.model, ", ".join(
            sorted(set(MODEL_ALIASES)))))
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
    known = sorted(name for name, cls in mx.kv.KVStoreBase.kv_registry.items()
                   if getattr(cls, "policy_class", None) is not None)
    args.algorithm_list = parse_list(args.algorithms)
    unknown = [a for a in args.algorithm_list if a not in known and a != STOCK_SYNC]
    if unknown or not args.algorithm_list:
        raise BenchError("unknown algorithm(s) %s; known: %s"
                         % (", ".join(unknown) or "(none given)",
                            ", ".join(known + [STOCK_SYNC])))
    args.rate_list = parse_list(args.rates)
    if not args.rate_list:
        raise BenchError("--rates is empty")
    for rate in args.rate_list:
        if rate not in UNSHAPED:
            netem.parse_rate(rate)
    netem.parse_rate(args.unshaped_rate)


def analyse(runs: List[dict], num_servers: int):
    """Table rows (one per rate and algorithm, ratios added) and compute-only ms."""
    rows = combine_repeats([summarize(r, num_servers) for r in runs])
    compute_row = next((r for r in rows if r["algorithm"] == COMPUTE_ONLY), None)
    compute_ms = compute_row.get("mean_ms") if compute_row else None
    if compute_row is not None:
        compute_row["rate"] = "-"
    add_ratios(rows, compute_ms)
    return rows, compute_ms


def write_outputs(result: dict, out_dir: str) -> str:
    """results.json, results.md and time_vs_rate.png; returns the Markdown."""
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    report = markdown_report(result)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(report + "\n")
    if any(r.get("mean_ms") is not None and r["algorithm"] != COMPUTE_ONLY
           for r in result["rows"]):
        plot(result, os.path.join(out_dir, "time_vs_rate.png"))
    return report


def rerender(path: str, out_dir: Optional[str]) -> int:
    """Recompute the tables, checks and plot of a results.json (e.g. after
    changing how they are derived); the measured runs are not touched."""
    with open(path) as f:
        result = json.load(f)
    result["rows"], result["compute_ms"] = analyse(result["runs"],
                                                   result["config"]["num_servers"])
    result["checks"] = check_targets(result["rows"], result["compute_ms"])
    result["rerendered"] = datetime.datetime.now().isoformat(timespec="seconds")
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
    try:
        _validate(args)
    except (BenchError, netem.NetemError) as err:
        parser.error(str(err))
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

    rows, compute_ms = analyse(runs, args.num_servers)
    config = {k: getattr(args, k) for k in (
        "model", "num_workers", "num_servers", "batch_size", "iters", "warmup_iters",
        "algo_warmup_steps", "threshold", "correction_period", "timeline", "repeats",
        "timeline_iters", "unshaped_rate", "engine_threads")}
    config.update({"rates": rates, "algorithms": args.algorithm_list, "none_mode": none_mode,
                   "thread_env": dict(THREAD_ENV,
                                      MXNET_CPU_WORKER_NTHREADS=str(args.engine_threads))})
    result = {
        "command": "cpsgd-bench " + " ".join(argv),
        "code": code_fingerprint(),
        "started": started, "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "load_start": load_start, "load_end": list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "config": config, "compute_ms": compute_ms, "rows": rows,
        "checks": check_targets(rows, compute_ms),
        "interrupted": bool(interrupted),
        "runs": runs,
    }
    if args.timeline:
        result["timelines"] = build_timelines(result, runs, out_dir)
    report = write_outputs(result, out_dir)
    if not args.keep_raw:
        # the raw profiler traces are large and merged under timeline/ already
        for run in runs:
            for name in os.listdir(run["run_dir"]) if os.path.isdir(run["run_dir"]) else []:
                if name.startswith("profile-") and name.endswith(".json"):
                    os.remove(os.path.join(run["run_dir"], name))
    print(report)
    print("results in %s" % os.path.abspath(out_dir))
    if interrupted:
        return interrupted
    failed = [r for r in runs if r["failure"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
