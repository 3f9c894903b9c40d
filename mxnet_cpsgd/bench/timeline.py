"""Merge the workers' MXNet profiler traces and draw compute vs communication.

Every benchmark worker profiles a few iterations with ``mx.profiler``
(``profile_all=True``) and dumps a Chrome-trace JSON.  MXNet writes each
operator as a ``B``/``E`` pair with epoch-based microsecond timestamps
(verified on 1.9.1: the ``bench-anchor`` marker a worker emits lands within
tens of microseconds of ``time.time()``), so traces of processes on one
machine share a clock.  :func:`merge_traces` turns the pairs into complete
(``X``) events, gives every worker its own ``pid`` and puts KVStore operations
(which are asynchronous and overlap each other) on as many "lanes" as needed
so that no two events of a lane overlap.  :func:`plot_timelines` draws a few
iterations of several runs (e.g. bitsgd and cpsgd) one above the other.

Operator classes (by MXNet's operator names):

========== =============================================================
forward    the hybridized network's bulked forward ops and the loss ops
backward   names containing ``_backward`` (``emulated_backward``: an emulated
           layer of ``--emulate-compute``, ``emulated_forward`` likewise)
update     optimizer ops (``sgd_update``, ``sgd_mom_update``, ``multi_*``)
quantize   ``QuantizeCPU`` / ``Dequantize*`` (MXNet's 2-bit compression)
push       ``KVStoreDist*Push`` (from issue until the server's reply); for the
           all-reduce stores, Horovod's collectives (both directions at once)
pull       ``KVStoreDist*Pull`` (from issue until the weights arrived)
copy       ``CopyCPU2CPU``, ``ImperativeBulk`` and other small ops
========== =============================================================
"""
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

COLORS = {
    "forward": "#4c72b0",
    "backward": "#dd8452",
    "update": "#55a868",
    "quantize": "#c44e52",
    "push": "#8172b3",
    "pull": "#937860",
    "copy": "#bbbbbb",
}
_LOSS_OPS = ("log_softmax", "softmax", "pick", "mean", "_mul_scalar", "SoftmaxOutput",
             "softmax_cross_entropy")
_IGNORED = ("DeleteVariable", "WaitForVar", "SetValueOp")


def classify(name: str) -> Optional[str]:
    """The class of an MXNet profiler operator name (None: not drawn)."""
    if name.startswith("KVStore"):
        if "Pull" in name:
            return "pull"
        if "Push" in name:
            return "push"
        return "push"
    low = name.lower()
    if "horovod" in low or "allreduce" in low or "allgather" in low:
        return "push"  # an all-reduce store's collective (both directions at once)
    if name == "emulated_forward":
        return "forward"
    if name == "emulated_backward":
        return "backward"
    if "Quantize" in name or "Dequantize" in name:
        return "quantize"
    if name in _IGNORED:
        return None
    if "_backward" in name:
        return "backward"
    if "sgd" in name.lower() or name.endswith("_update"):
        return "update"
    if name in _LOSS_OPS:
        return "forward"
    if "," in name or name in ("Convolution", "FullyConnected", "BatchNorm", "Activation",
                               "Pooling", "elemwise_add", "Flatten"):
        return "forward"
    return "copy"


def load_ops(path: str) -> List[dict]:
    """Operator intervals of one MXNet trace file.

    Returns:
        dicts with ``name``, ``start`` and ``end`` (microseconds, epoch based),
        ``pid`` and ``tid`` (as MXNet wrote them) and ``kind`` (see
        :func:`classify`), sorted by start.
    """
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ops = []
    pending: Dict[Tuple, List[dict]] = {}
    for ev in events:
        if ev.get("cat") != "operator" or ev.get("ph") not in ("B", "E"):
            continue
        key = (ev.get("pid"), ev.get("tid"), ev.get("name"))
        if ev["ph"] == "B":
            pending.setdefault(key, []).append(ev)
        else:
            stack = pending.get(key)
            if not stack:
                continue
            begin = stack.pop()
            ops.append({"name": ev["name"], "start": float(begin["ts"]),
                        "end": float(ev["ts"]), "pid": ev.get("pid"), "tid": ev.get("tid"),
                        "kind": classify(ev["name"])})
    ops.sort(key=lambda o: o["start"])
    return ops


def _lanes(intervals: Sequence[dict]) -> List[int]:
    """Greedy interval partitioning: a lane index per interval (sorted by start)."""
    ends: List[float] = []
    lanes = []
    for op in intervals:
        for i, end in enumerate(ends):
            if end <= op["start"]:
                ends[i] = op["end"]
                lanes.append(i)
                break
        else:
            ends.append(op["end"])
            lanes.append(len(ends) - 1)
    return lanes


def merge_traces(workers: Sequence[dict], out_path: str, title: str = "") -> dict:
    """Write one Chrome-trace JSON with every worker's operators.

    Args:
        workers: per worker ``{'rank': r, 'trace': path, 'iteration_starts_us':
            [...] (optional)}``.
        out_path: the merged trace.
        title: shown as the process names' prefix.

    Returns:
        summary: ``{'events': n, 'workers': m}``.
    """
    events = []
    count = 0
    for worker in sorted(workers, key=lambda w: w["rank"]):
        pid = int(worker["rank"])
        ops = load_ops(worker["trace"])
        events.append({"ph": "M", "pid": pid, "name": "process_name",
                       "args": {"name": "%sworker %d" % (title + " " if title else "", pid)}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index",
                       "args": {"sort_index": pid}})
        tids: Dict[str, int] = {}

        def tid_of(label):
            if label not in tids:
                tids[label] = len(tids)
                events.append({"ph": "M", "pid": pid, "tid": tids[label],
                               "name": "thread_name", "args": {"name": label}})
                events.append({"ph": "M", "pid": pid, "tid": tids[label],
                               "name": "thread_sort_index", "args": {"sort_index": tids[label]}})
            return tids[label]

        compute = [o for o in ops if o["kind"] not in ("push", "pull")]
        threads = {}
        for op in compute:
            threads.setdefault((op["pid"], op["tid"]), len(threads))
        for op in compute:
            label = "engine thread %d" % threads[(op["pid"], op["tid"])]
            events.append(_complete(op, pid, tid_of(label)))
        for kind in ("push", "pull"):
            comm = [o for o in ops if o["kind"] == kind]
            for op, lane in zip(comm, _lanes(comm)):
                events.append(_complete(op, pid, tid_of("kvstore %s %d" % (kind, lane))))
        for i, ts in enumerate(worker.get("iteration_starts_us") or []):
            events.append({"ph": "i", "s": "p", "pid": pid, "tid": 0, "ts": ts,
                           "name": "iteration %d" % i, "cat": "cpsgd-bench"})
        count += len(ops)
    with open(out_path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return {"events": count, "workers": len(workers)}


def _complete(op, pid, tid):
    return {"ph": "X", "name": op["name"], "cat": op["kind"] or "other", "pid": pid,
            "tid": tid, "ts": op["start"], "dur": max(0.0, op["end"] - op["start"])}


def _union(intervals: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    merged: List[List[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def comm_overlap(ops: Sequence[dict]) -> dict:
    """How much of the communication time overlaps forward/backward compute.

    Returns:
        ``{'comm_ms', 'compute_ms', 'overlap_ms', 'overlap_fraction'}`` where
        comm is the union of push and pull intervals and compute the union of
        forward and backward intervals.
    """
    comm = _union([(o["start"], o["end"]) for o in ops if o["kind"] in ("push", "pull")])
    comp = _union([(o["start"], o["end"]) for o in ops if o["kind"] in ("forward", "backward")])
    overlap = 0.0
    j = 0
    for s, e in comm:
        while j < len(comp) and comp[j][1] <= s:
            j += 1
        k = j
        while k < len(comp) and comp[k][0] < e:
            overlap += min(e, comp[k][1]) - max(s, comp[k][0])
            k += 1
    comm_total = sum(e - s for s, e in comm)
    return {"comm_ms": comm_total / 1e3, "compute_ms": sum(e - s for s, e in comp) / 1e3,
            "overlap_ms": overlap / 1e3,
            "overlap_fraction": overlap / comm_total if comm_total else 0.0}


def plot_timelines(runs: Sequence[dict], out_path: str, title: str = "",
                   max_workers: int = 2) -> None:
    """Draw a few profiled iterations of several runs, one panel per run.

    Args:
        runs: per run ``{'label': 'cpsgd @ 100mbit', 'workers': [{'rank': r,
            'trace': path, 'iteration_starts_us': [...]}, ...]}``.
        out_path: PNG path.
        title: figure title.
        max_workers: workers drawn per run (lowest ranks).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(runs), 1, figsize=(14, 1.2 + 2.3 * len(runs) * max_workers / 2),
                             squeeze=False)
    rows_per_worker = ("compute", "push", "pull")
    for ax, run in zip(axes[:, 0], runs):
        workers = sorted(run["workers"], key=lambda w: w["rank"])[:max_workers]
        loaded = [(w, load_ops(w["trace"])) for w in workers]
        starts = [w.get("iteration_starts_us") or [] for w in workers]
        t0 = min([s[0] for s in starts if s] + [min((o["start"] for o in ops), default=0)
                                                  for _, ops in loaded if ops])
        yticks, ylabels = [], []
        row = 0
        for (worker, ops) in loaded:
            for lane in rows_per_worker:
                y = -(row * 1.0)
                yticks.append(y + 0.4)
                ylabels.append("w%d %s" % (worker["rank"], lane))
                if lane == "compute":
                    for kind in ("copy", "update", "quantize", "forward", "backward"):
                        spans = _union([(o["start"], o["end"]) for o in ops if o["kind"] == kind])
                        ax.broken_barh([((s - t0) / 1e3, max((e - s) / 1e3, 0.05))
                                        for s, e in spans], (y, 0.8), color=COLORS[kind])
                else:
                    spans = _union([(o["start"], o["end"]) for o in ops if o["kind"] == lane])
                    ax.broken_barh([((s - t0) / 1e3, max((e - s) / 1e3, 0.05))
                                    for s, e in spans], (y, 0.8), color=COLORS[lane])
                row += 1
        for ts in (workers[0].get("iteration_starts_us") or []) if workers else []:
            ax.axvline((ts - t0) / 1e3, color="black", lw=0.6, ls=":")
        ov = comm_overlap(loaded[0][1]) if loaded else {}
        label = run["label"]
        if ov:
            label += "   (worker %d: %.0f%% of push/pull time overlaps forward/backward)" % (
                loaded[0][0]["rank"], 100 * ov["overlap_fraction"])
        ax.set_title(label, fontsize=10, loc="left")
        ax.set_yticks(yticks)
        ax.set_yticklabels(ylabels, fontsize=8)
        ax.set_xlabel("ms since the first profiled iteration began (dotted: worker %d's "
                      "iteration starts)" % (workers[0]["rank"] if workers else 0))
        ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=k) for k, c in COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


__all__ = ["classify", "load_ops", "merge_traces", "plot_timelines", "comm_overlap", "COLORS"]
