"""From runs to table rows: one row per run, the median over repeats, ratios to
compute-only and to the other algorithms, and the targets of docs/performance.md.
"""
import os
import statistics
from typing import Dict, List, Optional

from mxnet_cpsgd.bench.worker import COMPUTE_ONLY

from .runs import median_of, rate_bps, reference_labels

# cpsgd's speed targets, the "Targets (cpsgd)" table (docs/performance.md)
EMULATED_VS_BITSGD = 0.75     # emulated compute, transfer ~ compute
EMULATED_VS_HOROVOD = 0.75
EMULATED_VS_BOUND = 1.15      # x max(compute, transfer bound)
REAL_VS_BITSGD = 0.85         # real compute, colocated, 100mbit and 50mbit
REAL_VS_HOROVOD = 0.80
REAL_RATES = ("100mbit", "50mbit")
TARGET_RSS = 1.20
NOISE = 1.05
#: the rate is "balanced" where the uncompressed all-reduce's transfer bound is
#: within this factor of the compute time
BALANCE = 1.5


#: above this fraction of an iteration the CPU floor (this machine's cores)
#: rather than the algorithm may set the time: the bench warns
CPU_FLOOR_WARN = 0.10


def summarize(run: dict, num_servers: int) -> dict:
    """The table row of one run (None values where not measured).

    A dilated run (``run['time_scale']`` D > 1 ran D times slower) has every
    time (iterations, CPU time per iteration) divided by D; bytes per iteration
    are what they are, and the transfer bound uses the undilated rate.
    """
    row = {"rate": run["rate"], "algorithm": run["algorithm"],
           "store": run.get("store", run["algorithm"]), "failure": run["failure"],
           "load_before": run["load_before"], "load_after": run["load_after"],
           "time_scale": float(run.get("time_scale") or 1.0)}
    workers = run["workers"]
    if run["failure"] or not workers:
        return row
    # seconds measured -> milliseconds reported (dilated: divided by D)
    ms = 1e3 / row["time_scale"]
    per_worker_ms = [[ms * t for t in w["iter_times_s"]] for w in workers]
    medians = [median_of(ts) for ts in per_worker_ms]
    row["median_ms"] = statistics.mean(medians)
    row["min_ms"] = min(min(ts) for ts in per_worker_ms)
    row["max_ms"] = max(max(ts) for ts in per_worker_ms)
    # throughput: the timed window up to the moment everything it issued had
    # finished (waitall), divided by the iterations; mean over workers
    row["mean_ms"] = statistics.mean(ms * w["drained_s"] / w["iters"] for w in workers)
    row["step_call_ms"] = statistics.mean(median_of([ms * t for t in w.get("step_call_s") or []])
                                          for w in workers)
    row["workermedian_of_ms"] = medians
    row["samples_per_s_per_worker"] = workers[0]["batch_size"] / (row["mean_ms"] / 1e3)
    row["param_bytes"] = workers[0]["param_bytes"]
    row["num_params"] = workers[0]["num_params"]
    window_s = statistics.mean(w["drained_s"] for w in workers)
    if all(w.get("cpu_s") is not None for w in workers):
        row["worker_cpu_ms_per_iter"] = statistics.mean(ms * w["cpu_s"] / w["iters"]
                                                        for w in workers)
        peer = next((w["peer_cpu_s"] for w in workers if w.get("peer_cpu_s")), None)
        row["server_cpu_ms_per_iter"] = (ms * peer.get("server", 0.0) / workers[0]["iters"]
                                         if peer else None)
        total = sum(w["cpu_s"] for w in workers) + (sum(peer.values()) if peer else 0.0)
        row["cpu_busy_cores"] = total / window_s if window_s else None
        # what this machine's cores need for one iteration of the whole job
        row["cpu_floor_ms"] = ms * total / workers[0]["iters"] / (os.cpu_count() or 1)
        # the share of an iteration this machine's cores need at the least
        row["cpu_floor_fraction"] = row["cpu_floor_ms"] / row["mean_ms"]
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
        colocated = run.get("placement") == "colocated"
        allreduce = bool(run.get("allreduce"))
        node = "host" if colocated else "worker"
        links = {"%s %d up" % (node, w["rank"]): t for w, t in zip(workers, tx)}
        links.update({"%s %d down" % (node, w["rank"]): r for w, r in zip(workers, rx)})
        server = next((w["server_bytes"] for w in workers if w.get("server_bytes")), None)
        if colocated or allreduce or run["algorithm"] == COMPUTE_ONLY:
            # colocated: a worker's link is its host's, which its server shares;
            # all-reduce: no servers
            row["server_counters"] = "none (on the hosts' links)" if colocated else "none"
        elif server:
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
        if all(w.get("iter_tx_bytes") for w in workers):
            # per timed iteration, the most bytes any host's link carried one way
            # (a colocated host's link carries its worker's and its server's traffic)
            row["busiest_link_bytes_by_iter"] = [
                max(max(w["iter_tx_bytes"][i], w["iter_rx_bytes"][i]) for w in workers)
                for i in range(min(len(w["iter_tx_bytes"]) for w in workers))]
        row["max_link_bytes_per_iter"] = max(links.values())
        busiest = max(links, key=links.get)
        row["busiest_link"] = busiest
        bps = rate_bps(run["rate"])
        if bps is not None:
            row["transfer_bound_ms"] = 1e3 * links[busiest] * 8 / bps
    return row

def cpu_floor_warnings(rows: List[dict]) -> List[str]:
    """One line per row whose CPU floor is above :data:`CPU_FLOOR_WARN` of its
    iteration (its time may be this machine's, not the algorithm's)."""
    lines = []
    for row in rows:
        fraction = row.get("cpu_floor_fraction")
        if fraction is not None and fraction > CPU_FLOOR_WARN:
            lines.append("%s @ %s: CPU floor %.0f %% of the iteration (> %.0f %%): this "
                         "machine's cores may set its time; dilate more (--time-scale)"
                         % (row["algorithm"], row["rate"], 100 * fraction,
                            100 * CPU_FLOOR_WARN))
    return lines


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
        row = {"rate": rate, "algorithm": algorithm, "store": good[0].get("store", algorithm),
               "failure": None,
               "repeats": len(good), "failed_repeats": len(group) - len(good),
               "repeat_mean_ms": [r["mean_ms"] for r in good],
               "load_before": [r["load_before"] for r in good],
               "load_after": [r["load_after"] for r in good]}
        for key in good[0]:
            if key in row:
                continue
            values = [r.get(key) for r in good]
            if all(v is None for v in values):
                row[key] = None  # not measured (e.g. server CPU of an all-reduce store)
                continue
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


def add_ratios(rows: List[dict], compute_ms: Optional[float],
               variants: Optional[List[dict]] = None) -> None:
    """Ratios of every row to compute-only, its bounds and the same rate's
    ssgd, bitsgd and horovod rows.

    Args:
        rows: table rows (changed in place).
        compute_ms: the compute-only job's ms/iter (None: not measured).
        variants: ``config['variants']``: ``vs_bitsgd`` etc. divide by the first
            variant of that store without knobs (None: by the row named so).
    """
    by_key = {(r["rate"], r["algorithm"]): r for r in rows}
    refs = reference_labels(variants)
    for row in rows:
        t = row.get("mean_ms")
        if t is None:
            continue
        for ref in ("ssgd", "bitsgd", "horovod"):
            label = refs.get(ref, ref)
            other = by_key.get((row["rate"], label), {}).get("mean_ms")
            row["vs_" + ref] = t / other if other else None
            other_rss = by_key.get((row["rate"], label), {}).get("peak_rss_mb")
            row["rss_vs_" + ref] = row["peak_rss_mb"] / other_rss if other_rss else None
        row["vs_compute"] = t / compute_ms if compute_ms else None
        bound = row.get("transfer_bound_ms")
        row["vs_bound"] = t / bound if bound else None
        floor = max(compute_ms or 0.0, bound or 0.0)
        row["floor_ms"] = floor or None
        row["vs_floor"] = t / floor if floor else None
        machine = max(row.get("cpu_floor_ms") or 0.0, bound or 0.0)
        row["vs_machine_floor"] = t / machine if machine else None


def check_targets(rows: List[dict], compute_ms: Optional[float],
                  config: Optional[dict] = None) -> List[dict]:
    """cpsgd's speed targets, per rate (``applies`` says where a
    target is meant to hold; the value is reported everywhere)."""
    config = config or {}
    emulated = bool(config.get("emulate_compute"))
    colocated = config.get("placement", "separate") == "colocated"
    variants = config.get("variants")
    refs = reference_labels(variants)
    label = {name: refs.get(name, name) for name in ("cpsgd", "ssgd", "horovod")}
    by_key = {(r["rate"], r["algorithm"]): r for r in rows}
    checks = []
    for row in rows:
        if row["algorithm"] != label["cpsgd"] or row.get("mean_ms") is None:
            continue
        rate = row["rate"]
        ssgd = by_key.get((rate, label["ssgd"]), {}).get("mean_ms")
        # the uncompressed exchange's transfer bound against the compute time
        ref = (by_key.get((rate, label["horovod"])) or by_key.get((rate, label["ssgd"]))
               or {})
        balance = (ref.get("transfer_bound_ms") / compute_ms
                   if ref.get("transfer_bound_ms") and compute_ms else None)
        balanced = balance is not None and 1 / BALANCE <= balance <= BALANCE

        def add(name, value, limit, applies=True):
            checks.append({"rate": rate, "target": name, "value": value, "limit": limit,
                           "applies": applies, "balance": balance,
                           "met": None if (value is None or not applies) else value <= limit})
        if emulated:
            where = "emulated compute, colocated, transfer ~ compute"
            applies = colocated and balanced
            add("cpsgd/bitsgd (%s)" % where, row.get("vs_bitsgd"), EMULATED_VS_BITSGD, applies)
            add("cpsgd/horovod (%s)" % where, row.get("vs_horovod"), EMULATED_VS_HOROVOD,
                applies)
            add("cpsgd/max(compute, transfer bound) (%s)" % where, row.get("vs_floor"),
                EMULATED_VS_BOUND, applies)
        else:
            where = "real compute, colocated, %s" % "/".join(REAL_RATES)
            applies = colocated and rate in REAL_RATES
            add("cpsgd/bitsgd (%s)" % where, row.get("vs_bitsgd"), REAL_VS_BITSGD, applies)
            add("cpsgd/horovod (%s)" % where, row.get("vs_horovod"), REAL_VS_HOROVOD, applies)
        add("cpsgd/ssgd (never worse beyond noise)", row.get("vs_ssgd"), NOISE,
            ssgd is not None)
        add("cpsgd peak RSS / ssgd", row.get("rss_vs_ssgd"), TARGET_RSS)
    return checks


def analyse(runs: List[dict], num_servers: int, variants: Optional[List[dict]] = None):
    """Table rows (one per rate and algorithm, ratios added) and compute-only ms.

    Args:
        runs: the runs' records (results.json ``runs``).
        num_servers: servers of the job (for estimated server links).
        variants: ``config['variants']`` (see :func:`add_ratios`).
    """
    rows = combine_repeats([summarize(r, num_servers) for r in runs])
    compute_row = next((r for r in rows if r["algorithm"] == COMPUTE_ONLY), None)
    compute_ms = compute_row.get("mean_ms") if compute_row else None
    if compute_row is not None:
        compute_row["rate"] = "-"
    add_ratios(rows, compute_ms, variants)
    return rows, compute_ms
