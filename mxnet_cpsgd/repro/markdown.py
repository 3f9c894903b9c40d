"""The report's text: number formats, Markdown tables, the automatic findings,
figure names.
"""
import re
from typing import Dict, Iterable, List, Optional, Sequence

from .summary import FAILED_POINTS, Group, MATCH_POINTS, TeTcTable, setting_keys, setting_name


# ----------------------------------------------------------------------------
# Markdown

def fmt_pct(v: Optional[float], std: Optional[float] = None) -> str:
    """0.91234 -> '91.23'; with std -> '91.23 +- 0.10'; None -> 'n/a'."""
    if v is None:
        return "n/a"
    text = "%.2f" % (100.0 * v)
    if std is not None:
        text += " +- %.2f" % (100.0 * std)
    return text


def fmt_num(v: Optional[float], digits: int = 2, std: Optional[float] = None) -> str:
    if v is None:
        return "n/a"
    text = "%.*f" % (digits, v)
    if std is not None:
        text += " +- %.*f" % (digits, std)
    return text


def fmt_signed(v: Optional[float]) -> str:
    return "n/a" if v is None else "%+.2f" % v


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]],
             align: Optional[Sequence[str]] = None) -> str:
    """A GitHub Markdown table (align: 'l' or 'r' per column)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def accuracy_markdown(rows: Sequence[Dict[str, object]],
                      timing_only: Iterable[str] = ()) -> str:
    """The final-accuracy table; rows of ``timing_only`` experiments show their
    times but '-' for every accuracy and loss."""
    timing_only = set(timing_only)
    header = ["experiment", "run", "M", "network", "seeds", "epochs", "final val acc %",
              "best val acc %", "final train acc %", "final train loss",
              "vs SSGD (points)", "Te (s)", "Tc (s)"]
    body = []
    for r in rows:
        if r["experiment"] in timing_only:
            acc = ["-"] * 5
        else:
            acc = [fmt_pct(r["final_val_acc"], r["final_val_acc_std"]),
                   fmt_pct(r["best_val_acc"]), fmt_pct(r["final_train_acc"]),
                   fmt_num(r["final_train_loss"], 4, r["final_train_loss_std"]),
                   fmt_signed(r["delta_vs_ssgd"])]
        body.append([r["experiment"], r["label"], r["num_workers"], r["rate"] or "loopback",
                     r["seeds"], r["epochs"]] + acc + [fmt_num(r["te"]), fmt_num(r["tc"])])
    return md_table(header, body, ["l", "l", "r", "l"] + ["r"] * (len(header) - 4))


def te_tc_markdown(table: TeTcTable) -> str:
    header = [""] + table.columns
    body = [[row] + [fmt_num(table.cells.get((row, c))) for c in table.columns]
            for row in table.rows]
    return md_table(header, body)


def te_tc_relative_markdown(table: TeTcTable, base: str = "SSGD") -> Optional[str]:
    """Te and Tc divided by the ``base`` column's, same layout (None without base)."""
    if base not in table.columns:
        return None
    body = []
    for row in table.rows:
        b = table.cells.get((row, base))
        cells = []
        for c in table.columns:
            v = table.cells.get((row, c))
            cells.append("%.2f" % (v / b) if v is not None and b else "n/a")
        body.append([row] + cells)
    return md_table(["/ %s" % base] + table.columns, body)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


def figure_name(kind: str, exp: str, m: int, rate: Optional[str]) -> str:
    return "%s-%s-M%d-%s.png" % (kind, _slug(exp), m, _slug(rate or "loopback"))

def findings(groups: Sequence[Group], accuracy: Optional[Iterable[str]] = None) -> List[str]:
    """Automatic checks of the paper's claims on these logs, as Markdown bullets.

    Args:
        groups: from :func:`group_runs`.
        accuracy: experiments whose accuracy is checked (None: all).
    """
    lines = []
    accuracy = None if accuracy is None else set(accuracy)
    for exp, m, rate in setting_keys(groups):
        check_acc = accuracy is None or exp in accuracy
        gs = {g.label: g for g in groups
              if (g.experiment, g.num_workers, g.rate) == (exp, m, rate)}
        where = setting_name(exp, m, rate)
        for g in gs.values():
            loss = g.mean_series("train_loss")
            if check_acc and len(loss) > 1 and loss[-1][1] > loss[0][1]:
                lines.append("%s: %s did not converge: its training loss rose from %.4f "
                             "(epoch 1) to %.4f (epoch %d); final val acc %s%%."
                             % (where, g.label, loss[0][1], loss[-1][1], loss[-1][0] + 1,
                                fmt_pct(g.mean("final_val_acc"))))
        ssgd = next((g for g in gs.values() if g.algorithm == "ssgd"), None)
        bit = next((g for g in gs.values() if g.algorithm == "bitsgd"), None)
        if check_acc and ssgd is not None and ssgd.epochs > 1:
            base = ssgd.mean("final_val_acc")
            for g in gs.values():
                if g is ssgd or base is None:
                    continue
                acc = g.mean("final_val_acc")
                if acc is None:
                    continue
                gap = 100.0 * (acc - base)
                # a gap of means, not a test: "equal" is for the paired table's TOST
                if round(gap, 6) >= -MATCH_POINTS:
                    verdict = ("mean within %.1f points below S-SGD or above (a gap of "
                               "means, not an equivalence test)" % MATCH_POINTS)
                elif gap < -FAILED_POINTS:
                    verdict = "did NOT train (more than %.0f points below S-SGD)" % FAILED_POINTS
                else:
                    verdict = "mean more than %.1f points below S-SGD" % MATCH_POINTS
                lines.append("%s: %s final val acc %.2f%% vs S-SGD %.2f%% (%+.2f points): %s."
                             % (where, g.label, 100 * acc, 100 * base, gap, verdict))
        if bit is not None and bit.mean("te"):
            for g in gs.values():
                if g.algorithm == "cpsgd" and g.mean("te") is not None:
                    ratio = g.mean("te") / bit.mean("te")
                    lines.append("%s: %s Te = %.2f x BIT-SGD's (%s; the paper reports about "
                                 "0.7x at 56 Gbps on 16-32 GPUs)."
                                 % (where, g.label, ratio,
                                    "%.0f%% faster" % (100 * (1 - ratio)) if ratio < 1
                                    else "%.0f%% slower" % (100 * (ratio - 1))))
    return lines
