"""What a benchmark writes: Markdown tables and report, the time-vs-rate plot and
the timelines of ``--timeline``.
"""
import os
from typing import Dict, List

from mxnet_cpsgd.bench.worker import COMPUTE_ONLY

from .results import CPU_FLOOR_WARN, cpu_floor_warnings
from .runs import fmt_value, rate_sort_key, rate_bps, reference_labels


# ------------------------------------------------------------------- output

TIME_COLUMNS = [
    ("rate", "rate", "%s"), ("algorithm", "algorithm", "%s"),
    ("mean_ms", "ms/iter", "%.1f"), ("median_ms", "median", "%.1f"),
    ("vs_horovod", "/horovod", "%.2f"), ("vs_bitsgd", "/bitsgd", "%.2f"),
    ("vs_ssgd", "/ssgd", "%.2f"), ("floor_ms", "max(compute,bound) ms", "%.1f"),
    ("vs_floor", "/max(compute,bound)", "%.2f"),
    ("transfer_bound_ms", "bound ms", "%.1f"), ("max_link_kb", "KB/iter busiest link dir.",
                                                 "%.0f"),
    ("busiest_link", "busiest link", "%s"),
    ("vs_compute", "/compute", "%.2f"), ("min_ms", "min", "%.1f"), ("max_ms", "max", "%.1f"),
    ("vs_machine_floor", "/max(CPU floor,bound)", "%.2f"),
]
RESOURCE_COLUMNS = [
    ("rate", "rate", "%s"), ("algorithm", "algorithm", "%s"),
    ("tx_kb", "KB sent/iter/worker", "%.1f"), ("rx_kb", "KB recv/iter/worker", "%.1f"),
    ("tbf_drops_per_iter", "drops/iter", "%.1f"),
    ("step_call_ms", "step() ms", "%.1f"),
    ("worker_cpu_ms_per_iter", "worker CPU ms/iter", "%.0f"),
    ("server_cpu_ms_per_iter", "server CPU ms/iter", "%.0f"),
    ("cpu_floor_ms", "CPU floor ms", "%.0f"), ("cpu_floor_pct", "CPU floor/iter", "%.0f%%"),
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
            elif key == "cpu_floor_pct":
                raw = row.get("cpu_floor_fraction")
                value = 100 * raw if raw is not None else None
            elif key == "max_link_kb":
                raw = row.get("max_link_bytes_per_iter")
                value = raw / 1e3 if raw is not None else None
            cells.append(fmt_value(value, spec) if not isinstance(value, str) else value)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dilation_note(cfg: dict) -> str:
    """How a result's times relate to the clock ('' when not dilated)."""
    scale = cfg.get("time_scale") or 1
    if scale == 1:
        return ""
    return ("**Dilated x%g**: every job ran %g times slower (emulated compute x %g, link "
            "rates / %g, delays x %g); every time below is the measured time divided by "
            "%g." % ((scale,) * 6))


def markdown_report(result: dict) -> str:
    cfg = result["config"]
    placement = cfg.get("placement", "separate")
    compute = ("emulated compute: %g ms forward+backward per iteration (engine waits, "
               "gradients released layer by layer in reverse order)" % cfg["emulate_compute"]
               if cfg.get("emulate_compute") else "real compute on the CPU")
    out = ["# cpsgd-bench results", "",
           "Command: `%s`" % result["command"], "",
           "Placement %s (%s); %s." % (placement, {
               "colocated": "one emulated host per worker running that worker and one "
                            "server, the scheduler on host 0",
               "separate": "every node on its own emulated host"}.get(placement, placement),
               compute),
           "Shaped links' queue: %s." % {
               "fifo": "fifo (one tbf FIFO per link direction)",
               "fair": "fair (the TCP flows of a link direction share its rate: htb "
                       "with 64 leaf classes by destination port)"}.get(
               cfg.get("queue", "fifo"), cfg.get("queue"))
           + (" TCP congestion control of the emulated hosts: %s." % cfg["tcp_congestion"]
              if cfg.get("tcp_congestion") else ""), "",
           "Model %s, %d workers, %d server(s), batch %d per worker, %d timed iterations "
           "after %d discarded (algorithm warm-up %d steps), threshold %g, correction "
           "period %d; started %s; load average (1/5/15 min) at start %s, at end %s." % (
               cfg["model"], cfg["num_workers"], cfg["num_servers"], cfg["batch_size"],
               cfg["iters"], cfg["warmup_iters"], cfg["algo_warmup_steps"], cfg["threshold"],
               cfg["correction_period"], result["started"],
               "/".join("%.2f" % x for x in result["load_start"]),
               "/".join("%.2f" % x for x in result["load_end"])), ""]
    if dilation_note(cfg):
        out += [dilation_note(cfg), ""]
    variants = [v for v in cfg.get("variants") or [] if v["knobs"] or v["label"] != v["store"]]
    if variants:
        out += ["Algorithm variants (their knobs override the ones above): " + "; ".join(
            "%s = %s%s" % (v["label"], v["store"], "".join(
                " %s=%s" % kv for kv in v["knobs"].items()))
            for v in variants) + ".", ""]
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
            "machine cannot beat however the work overlaps); CPU floor/iter = CPU floor / "
            "ms/iter (above %.0f %% the cores rather than the algorithm may set the time); "
            "cores busy = CPU time of workers, servers and scheduler over the "
            "timed window divided by its length (this machine has %s cores); other load = "
            "the rest of the machine's busy CPU time (other processes, kernel work "
            "such as softirq networking) over the same window, in cores; "
            "drops/iter = packets the emulated links' queues dropped per timed iteration "
            "(all nodes, both directions; a dropped packet may be a 64 KB GSO segment); "
            "peak RSS = largest worker VmHWM. `none` = %s." % (
                100 * CPU_FLOOR_WARN, result["cpu_count"], cfg["none_mode"]), ""]
    warnings = cpu_floor_warnings(result["rows"])
    if warnings:
        out += ["**Warning**: CPU floor above %.0f %% of the iteration:" % (
            100 * CPU_FLOOR_WARN), ""] + ["- " + w for w in warnings] + [""]
    if result["checks"]:
        out += ["## Targets (cpsgd)", "",
                "| rate | uncompressed bound / compute | target | value | limit | met |",
                "|---|---:|---|---:|---:|---|"]
        for c in result["checks"]:
            met = "n/a" if not c["applies"] else ("-" if c["met"] is None else
                                                  ("yes" if c["met"] else "**no**"))
            out.append("| %s | %s | %s | %s | %.2f | %s |" % (
                c["rate"], fmt_value(c.get("balance"), "%.2f"), c["target"],
                fmt_value(c["value"], "%.2f"), c["limit"], met))
        out += ["", "n/a: the target is not meant for this rate or configuration (the "
                "emulated-compute targets hold where the uncompressed exchange's transfer "
                "bound is within 1.5x of the compute time, with --placement colocated; the "
                "real-compute ones at 100mbit and 50mbit, colocated); the value is shown "
                "anyway."]
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
    rates = sorted({r["rate"] for r in rows}, key=rate_sort_key)
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
    ax.set_title("%s, %d workers + %d server(s), batch %d/worker, %s placement, %s\n"
                 "dotted: transfer bound of the same colour's measured bytes" % (
                     cfg["model"], cfg["num_workers"], cfg["num_servers"], cfg["batch_size"],
                     cfg.get("placement", "separate"),
                     "emulated compute %g ms" % cfg["emulate_compute"]
                     if cfg.get("emulate_compute") else "real compute")
                 + (" (times dilated x%g, divided back)" % cfg["time_scale"]
                    if (cfg.get("time_scale") or 1) != 1 else ""),
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


def build_timelines(result: dict, runs: List[dict], out_dir: str,
                    plots: bool = True) -> List[dict]:
    """Merged traces per run and (``plots``: matplotlib installed) one PNG per rate."""
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
    refs = reference_labels(result["config"].get("variants"))
    for rate, algos in (by_rate.items() if plots else ()):
        chosen = [refs.get(a, a) for a in ("bitsgd", "cpsgd", "horovod")
                  if refs.get(a, a) in algos]
        chosen += [a for a in algos if a not in chosen][:max(0, 3 - len(chosen))]
        panels = [{"label": "%s @ %s" % (a, rate), "workers": algos[a]["workers"]}
                  for a in chosen]
        path = os.path.join(out_dir, "timeline-%s.png" % rate)
        timeline.plot_timelines(panels, path, title="%s: %d profiled iterations" % (
            result["config"]["model"], result["config"]["timeline_iters"]))
        made.append({"label": "%s @ %s plot" % (" vs ".join(chosen), rate),
                     "path": os.path.relpath(path, out_dir)})
    return made


def one_rate_each(results: List[dict]) -> bool:
    """Whether every result ran one rate (e.g. a rate per worker count chosen so
    that the exchange matches the compute): then a row's label is its algorithm."""
    return all(len(r["config"].get("rates") or [None]) == 1 for r in results)


def timed_rows(result: dict, one_rate: bool):
    """(label, row) of each algorithm's timed row of one result (the compute-only
    job left out); the label is ``algorithm`` or, with several rates,
    ``algorithm @ rate``."""
    for row in result["rows"]:
        if row.get("mean_ms") is None or row["algorithm"] == COMPUTE_ONLY:
            continue
        yield (row["algorithm"] if one_rate else "%s @ %s" % (row["algorithm"], row["rate"]),
               row)


def _scaling_points(results: List[dict]) -> Dict[str, List[tuple]]:
    """label -> sorted [(workers, row, compute_ms)] over several results (labels
    as :func:`timed_rows` gives them)."""
    points: Dict[str, List[tuple]] = {}
    one_rate = one_rate_each(results)
    for result in results:
        n = result["config"]["num_workers"]
        for label, row in timed_rows(result, one_rate):
            points.setdefault(label, []).append((n, row, result.get("compute_ms")))
    for pts in points.values():
        pts.sort(key=lambda p: p[0])
    return points


def scaling_table(results: List[dict]) -> str:
    """Markdown: per algorithm and worker count, ms/iteration, scaling efficiency
    (compute-only time / iteration time), the transfer bound and the CPU floor's
    share of the iteration, from several results.json (one per worker count)."""
    lines = ["| algorithm | workers | rate | ms/iter | median | max | efficiency | bound ms | "
             "/max(compute,bound) | CPU floor/iter | dilated |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, pts in _scaling_points(results).items():
        for n, row, compute in pts:
            lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | x%g |" % (
                label, n, row["rate"], fmt_value(row["mean_ms"]), fmt_value(row.get("median_ms")),
                fmt_value(row.get("max_ms")),
                fmt_value(compute / row["mean_ms"] if compute else None, "%.2f"),
                fmt_value(row.get("transfer_bound_ms")), fmt_value(row.get("vs_floor"), "%.2f"),
                fmt_value(100 * row["cpu_floor_fraction"]
                          if row.get("cpu_floor_fraction") is not None else None, "%.0f%%"),
                row.get("time_scale") or 1))
    return "\n".join(lines)
