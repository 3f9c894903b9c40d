"""The report's section on ``kind: bench`` experiments: cpsgd-bench's
``results.json`` files read as JSON (the layer rules keep ``repro`` from
importing ``bench``), tables in the paper's layout, the published table and
its ratios beside ours, and for a sweep the ratios against the swept value.

Numbers (docs/performance.md, "What each number means"):

- ms/iter: the bench's throughput figure, the timed window (until everything
  it issued has finished) divided by the timed iterations, mean over workers;
  with ``--repeats`` the median over rounds;
- compute-only: the same workers training with no kvstore;
- transfer bound: the busiest link direction's bytes per iteration x 8 / rate
  (shaped rates only);
- ratios ``A/B``: A's ms/iter over B's in the same bench invocation; the
  published ratio is the same quotient of the reference table's cells.
"""
import glob
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..cluster import netem
from .bench_runs import BENCH, INVOCATION_META
from .markdown import md_table

COMPUTE_ONLY = "compute"   # the bench's compute-only row (mxnet_cpsgd.bench.worker)


@dataclass
class Point:
    """One (invocation, rate): the ms/iter of every label and the bench's rows.

    Args:
        num_workers: M.
        sweep_value: the swept flag's value (None: no sweep).
        rate: the link rate of these rows.
        rows: label -> the bench's table row (results.json ``rows``).
        compute_ms: compute-only ms/iter of the invocation.
    """
    num_workers: int
    sweep_value: object
    rate: str
    rows: Dict[str, dict]
    compute_ms: Optional[float]

    def ms(self, label: str) -> Optional[float]:
        row = self.rows.get(label) or {}
        return None if row.get("failure") else row.get("mean_ms")

    def name(self, sweep_flag: Optional[str], several_rates: bool) -> str:
        parts = ["M=%d" % self.num_workers]
        if sweep_flag is not None:
            parts.append("%s %s" % (sweep_flag, _fmt_value(self.sweep_value)))
        if several_rates:
            parts.append(self.rate)
        return ", ".join(parts)


@dataclass
class BenchExperiment:
    """A bench experiment's measured points and what the spec says of it."""
    name: str
    labels: List[str]
    points: List[Point]
    invocations: List[dict]
    results: List[dict]
    sweep_flag: Optional[str] = None
    reference: Optional[Dict[str, object]] = None
    compare: List[List[str]] = field(default_factory=list)
    description: Optional[str] = None

    @property
    def several_rates(self) -> bool:
        return len({p.rate for p in self.points}) > 1


def _fmt_value(value) -> str:
    if isinstance(value, float) and value == int(value):
        return "%d" % value
    return str(value)


def _fmt(value, spec="%.1f") -> str:
    return "n/a" if value is None else spec % value


def rate_mbit(rate: str) -> Optional[float]:
    """Mbit/s of a tc rate (cpsgd-bench's syntax), None for none/loopback."""
    try:
        return netem.parse_rate(str(rate)) / 1e6
    except netem.NetemError:
        return None


def _rate_key(rate: str) -> Tuple[int, float]:
    """Shaped rates from fast to slow, then none/loopback."""
    mbit = rate_mbit(rate)
    return (1, 0.0) if mbit is None else (0, -mbit)


def load(root: str, meta: Optional[Dict[str, object]] = None) -> List[BenchExperiment]:
    """Every bench experiment under ``root/bench`` (spec order from reproduce.json's
    experiments, which also give reference and comparisons; otherwise each
    invocation.json's)."""
    invocations = []
    for path in glob.glob(os.path.join(root, BENCH, "*", "*", INVOCATION_META)):
        with open(path) as f:
            inv = json.load(f)
        inv["_dir"] = os.path.dirname(path)
        invocations.append(inv)
    invocations.sort(key=lambda i: (i.get("order", 1 << 30), i["_dir"]))
    spec_exps = {e.get("name"): e for e in (meta or {}).get("experiments") or []
                 if e.get("kind") == BENCH}
    names = [n for n in spec_exps if any(i.get("experiment") == n for i in invocations)]
    names += [n for n in dict.fromkeys(i.get("experiment") for i in invocations)
              if n not in names]
    out = []
    for name in names:
        invs = [i for i in invocations if i.get("experiment") == name]
        spec = spec_exps.get(name, {})
        first = invs[0]
        labels = list(spec.get("labels") or first.get("labels") or [])
        points, results = [], []
        for inv in invs:
            result = _read_results(inv["_dir"])
            if result is None:
                continue
            results.append(result)
            by_rate: Dict[str, Dict[str, dict]] = {}
            for row in result.get("rows") or []:
                if row["algorithm"] == COMPUTE_ONLY:
                    continue
                by_rate.setdefault(row["rate"], {})[row["algorithm"]] = row
            for rate in sorted(by_rate, key=_rate_key):
                points.append(Point(int(inv.get("num_workers") or
                                        result["config"]["num_workers"]),
                                    inv.get("sweep_value"), rate, by_rate[rate],
                                    result.get("compute_ms")))
        for label in (l for p in points for l in p.rows):
            if label not in labels:
                labels.append(label)
        out.append(BenchExperiment(
            name=name, labels=labels, points=points, invocations=invs, results=results,
            sweep_flag=first.get("sweep_flag"),
            reference=spec.get("reference", first.get("reference")),
            compare=list(spec.get("compare", first.get("compare")) or []),
            description=spec.get("description")))
    return out


def _read_results(directory: str) -> Optional[dict]:
    path = os.path.join(directory, "results.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------
# numbers

def reference_row(reference: Optional[Dict[str, object]], num_workers: int
                  ) -> Optional[Dict[str, Optional[float]]]:
    """The published row for M workers as column -> value: the row whose name says
    ``M=<M>`` (a ``Te`` row before a ``Tc`` one), None if there is none."""
    if not reference:
        return None
    found = []
    for name, values in reference_rows(reference):
        m = re.search(r"M\s*=\s*(\d+)", str(name))
        if m and int(m.group(1)) == num_workers:
            found.append((0 if "tc" not in str(name).lower() else 1, str(name), values))
    if not found:
        return None
    _, _, values = min(found, key=lambda f: f[0])
    return dict(zip(reference["columns"], values))


def reference_rows(reference: Dict[str, object]) -> List[Tuple[str, list]]:
    """The published rows in the spec's order, as (name, values): ``rows`` is a
    mapping in a spec and a list of pairs once written to JSON (whose keys
    json.dump sorts)."""
    rows = reference.get("rows") or {}
    return list(rows.items()) if isinstance(rows, dict) else [tuple(r) for r in rows]


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ratio_rows(exp: BenchExperiment) -> List[Dict[str, object]]:
    """Per point and compared pair: our ratio and the published one.

    Returns:
        dicts with ``point`` (its name), ``num_workers``, ``sweep_value``, ``rate``,
        ``pair`` ("A/B"), ``ours``, ``published`` (None where not available).
    """
    rows = []
    for p in exp.points:
        ref = reference_row(exp.reference, p.num_workers) or {}
        for a, b in exp.compare:
            rows.append({"point": p.name(exp.sweep_flag, exp.several_rates),
                         "num_workers": p.num_workers, "sweep_value": p.sweep_value,
                         "rate": p.rate, "pair": "%s/%s" % (a, b),
                         "ours": ratio(p.ms(a), p.ms(b)),
                         "published": ratio(ref.get(a), ref.get(b))})
    return rows


# ----------------------------------------------------------------------------
# Markdown and figures

def markdown(exps: Sequence[BenchExperiment], out_dir: str, plots: bool = True
             ) -> Tuple[List[str], List[str]]:
    """The report's bench section: (Markdown lines, figure file names)."""
    md: List[str] = ["## Benchmarks (cpsgd-bench)", "",
                     "Measured by `cpsgd-bench` (docs/performance.md), one invocation per "
                     "number of workers M (and swept value). **ms/iter** = the bench's "
                     "timed window (until all work it issued had finished) / timed "
                     "iterations, mean over workers (with `--repeats`: median over "
                     "rounds); **compute-only** = the same workers with no kvstore; "
                     "**bound** = the busiest link direction's bytes per iteration x 8 / "
                     "rate (shaped rates only); **KB/iter busiest link** = that link "
                     "direction's bytes per iteration (KB = 1000 bytes, Ethernet frames "
                     "counted on the emulated hosts' links); a ratio A/B = A's ms/iter / "
                     "B's in the same invocation, the published one the same quotient of "
                     "the published table (seconds per epoch: the ratio is what compares).",
                     ""]
    figures: List[str] = []
    for exp in exps:
        md += ["### %s" % exp.name, ""]
        if exp.description:
            md += [str(exp.description).strip(), ""]
        md += _setup_lines(exp)
        if not exp.points:
            md += ["No invocation has results yet.", ""]
        else:
            md += ["Time per iteration (ms/iter), paper layout:", "",
                   layout_table(exp), ""]
            if exp.reference:
                md += ["Published:", "", _reference_table(exp.reference), ""]
            rr = ratio_rows(exp)
            if rr:
                md += ["Ratios, ours beside the published:", "", ratio_table(exp, rr), ""]
            md += ["Per run: ms/iter, compute-only, transfer bound and bytes:", "",
                   details_table(exp), ""]
            if plots and rr and _sweep_x(exp) is not None:
                fname = "bench-sweep-%s.png" % re.sub(r"[^A-Za-z0-9_.-]+", "-", exp.name)
                plot_sweep(exp, rr, os.path.join(out_dir, fname))
                figures.append(fname)
                md += ["![%s: ratios against %s](%s)" % (exp.name, _sweep_x(exp)[0], fname),
                       ""]
        md += ["Invocations:", "", invocations_table(exp), ""]
    return md, figures


def _setup_lines(exp: BenchExperiment) -> List[str]:
    if not exp.results:
        return []
    cfg = exp.results[0].get("config") or {}
    compute = ("emulated accelerator, %g ms forward+backward per iteration"
               % cfg["emulate_compute"] if cfg.get("emulate_compute")
               else "real compute on this machine's CPU")
    if exp.sweep_flag == "emulate-compute":
        compute = "emulated accelerator, forward+backward time per iteration swept (below)"
    sweep = (" Swept: `--%s` %s." % (exp.sweep_flag, ", ".join(
        _fmt_value(p) for p in dict.fromkeys(pt.sweep_value for pt in exp.points)))
        if exp.sweep_flag else "")
    variants = "; ".join(
        "%s = %s%s" % (v["label"], v["store"], "".join(" %s=%s" % kv
                                                        for kv in v["knobs"].items()))
        for v in cfg.get("variants") or [])
    return ["Model %s, batch %s per worker, %s placement, %s; %s timed iterations after %s "
            "discarded (algorithms' warm-up %s steps), threshold %s, correction period %s "
            "unless a run sets its own.%s" % (
                cfg.get("model"), cfg.get("batch_size"), cfg.get("placement"), compute,
                cfg.get("iters"), cfg.get("warmup_iters"), cfg.get("algo_warmup_steps"),
                cfg.get("threshold"), cfg.get("correction_period"), sweep), "",
            "Runs: %s." % variants if variants else "", ""]


def layout_table(exp: BenchExperiment) -> str:
    header = [""] + exp.labels + ["compute-only"]
    body = [[p.name(exp.sweep_flag, exp.several_rates)] +
            [_fmt(p.ms(l)) for l in exp.labels] + [_fmt(p.compute_ms)] for p in exp.points]
    return md_table(header, body)


def _reference_table(ref: Dict[str, object]) -> str:
    body = [[row] + ["n/a" if v is None else "%g" % v for v in values]
            for row, values in reference_rows(ref)]
    return md_table([""] + list(ref.get("columns") or []), body)


def ratio_table(exp: BenchExperiment, rows: Sequence[Dict[str, object]]) -> str:
    pairs = ["%s/%s" % (a, b) for a, b in exp.compare]
    header = [""] + [h for pair in pairs for h in ("%s ours" % pair, "%s published" % pair)]
    body = []
    for point in dict.fromkeys(r["point"] for r in rows):
        cells = {r["pair"]: r for r in rows if r["point"] == point}
        body.append([point] + [c for pair in pairs for c in (
            _fmt(cells[pair]["ours"], "%.2f"), _fmt(cells[pair]["published"], "%.2f"))])
    return md_table(header, body)


def details_table(exp: BenchExperiment) -> str:
    header = ["", "run", "ms/iter", "/compute-only", "bound ms", "/max(compute,bound)",
              "KB/iter busiest link", "busiest link", "KB sent/iter/worker", "CPU floor ms",
              "other load (cores)"]
    body = []
    for p in exp.points:
        for label in exp.labels:
            row = p.rows.get(label)
            if row is None:
                continue
            name = p.name(exp.sweep_flag, exp.several_rates)
            if row.get("failure"):
                body.append([name, label, "failed: %s" % str(row["failure"]).splitlines()[0]
                             .replace("|", "/")[:80]] + [""] * (len(header) - 3))
                continue
            kb = lambda key: (None if row.get(key) is None else row[key] / 1e3)  # noqa: E731
            body.append([name, label, _fmt(row.get("mean_ms")),
                         _fmt(ratio(row.get("mean_ms"), p.compute_ms), "%.2f"),
                         _fmt(row.get("transfer_bound_ms")),
                         _fmt(row.get("vs_floor"), "%.2f"),
                         _fmt(kb("max_link_bytes_per_iter"), "%.0f"),
                         row.get("busiest_link") or "n/a",
                         _fmt(kb("tx_bytes_per_iter"), "%.0f"),
                         _fmt(row.get("cpu_floor_ms"), "%.0f"),
                         _fmt(row.get("other_cpu_cores"), "%.2f")])
    return md_table(header, body, ["l", "l"] + ["r"] * 5 + ["l"] + ["r"] * 3)


def invocations_table(exp: BenchExperiment) -> str:
    body = [[i.get("invocation_id"), i.get("status"),
             "%.0f" % i["wall_time"] if isinstance(i.get("wall_time"), (int, float)) else "n/a",
             "`%s`" % i.get("command_text", ""),
             (i.get("failure") or "").replace("|", "/")[:120]] for i in exp.invocations]
    return md_table(["invocation", "status", "wall (s)", "command (output relative to OUT)",
                     "note"], body, ["l", "l", "r", "l", "l"])


def _sweep_x(exp: BenchExperiment) -> Optional[Tuple[str, callable]]:
    """The x axis of the sweep plot: (label, point -> x), None without a sweep."""
    if exp.sweep_flag is not None and len({p.sweep_value for p in exp.points}) > 1:
        try:
            [float(p.sweep_value) for p in exp.points]
        except (TypeError, ValueError):
            if all(rate_mbit(p.rate) for p in exp.points):  # sweep: {rates: [...]}
                return "link rate (Mbit/s)", lambda p: rate_mbit(p.rate)
            return None
        unit = " (ms)" if exp.sweep_flag == "emulate-compute" else ""
        return "--%s%s" % (exp.sweep_flag, unit), lambda p: float(p.sweep_value)
    if exp.several_rates and all(rate_mbit(p.rate) for p in exp.points):
        return "link rate (Mbit/s)", lambda p: rate_mbit(p.rate)
    return None


def plot_sweep(exp: BenchExperiment, rows: Sequence[Dict[str, object]], path: str) -> None:
    """The compared ratios against the swept value, one line per (pair, M); the
    published ratio of the same pair and M as a horizontal dashed line."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    xlabel, x_of = _sweep_x(exp)
    xs = {p.name(exp.sweep_flag, exp.several_rates): x_of(p) for p in exp.points}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = list(dict.fromkeys((r["pair"], r["num_workers"]) for r in rows))
    for i, (pair, m) in enumerate(keys):
        color = colors[i % len(colors)]
        pts = sorted((xs[r["point"]], r["ours"]) for r in rows
                     if (r["pair"], r["num_workers"]) == (pair, m) and r["ours"] is not None)
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=color,
                    label="%s, M=%d (ours)" % (pair, m))
        published = next((r["published"] for r in rows
                          if (r["pair"], r["num_workers"]) == (pair, m)
                          and r["published"] is not None), None)
        if published is not None:
            ax.axhline(published, color=color, ls="--", lw=1,
                       label="%s, M=%d published (%.2f)" % (pair, m, published))
    ax.axhline(1.0, color="black", lw=0.5)
    if xlabel.startswith("link rate"):
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ratio of ms/iter")
    ax.set_title("%s: compared ratios against %s" % (exp.name, xlabel), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
