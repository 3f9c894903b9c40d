"""Tables of reports/perf/exchange-bound-point.md from cpsgd-bench results.json files.

    python reports/perf/exchange_bound_table.py RESULTS_JSON [RESULTS_JSON ...]
    python reports/perf/exchange_bound_table.py --across RESULTS_JSON [RESULTS_JSON ...]

Per file (one invocation) and rate: every algorithm's mean ms/iter with its
efficiency (the invocation's compute-only time / ms per iteration), the transfer
bound and the CPU floor's share; then the ratios the targets are about (cp-X / X,
cp-X / horovod, cpsgd / horovod) and the best any store could reach there
(compute / X).  With --across: two tables (the balanced point and the
exchange-bound point), one column per worker count;
several files of one worker count (invocations on different occasions, which
must share the dilation) share its column, each cell holding every file's figure
in the order given ("a / b", "-" where one did not run it).  A worker count's
balanced point is the fastest rate among its files and its exchange-bound point the
slowest; a file may hold one of the two (a scaling invocation at the balanced rate
only) or both; a third rate is refused.

A file without a compute-only job (cpsgd-bench --no-compute-only) has no
efficiencies and no "compute / X": those show "-" (the times stay), and a line
on stderr names the file.
"""
import json
import re
import sys

ORDER = ["ssgd", "bitsgd", "cpsgd", "horovod", "fp16", "cpsgd_fp16", "powersgd",
         "cpsgd_powersgd"]
RATIOS = [("cpsgd_fp16", "fp16"), ("cpsgd_fp16", "horovod"),
          ("cpsgd_powersgd", "powersgd"), ("cpsgd_powersgd", "horovod"),
          ("cpsgd", "horovod"), ("cpsgd", "bitsgd")]
#: the algorithms whose "compute / X" is the best any store could reach against X
BEST_OF = ("horovod", "fp16", "powersgd")


def rate_key(rate):
    """Bits per second of a tc rate ("90mbit", "25gbit"); 0 for anything else.  (The
    package's parser would import MXNet, which this script does without.)"""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else 0.0


def load(path):
    """(result, {(rate, algorithm): row}, its rates from the fastest to the slowest)."""
    with open(path) as f:
        result = json.load(f)
    if result.get("compute_ms") is None:
        print("exchange_bound_table.py: no compute-only job in %s: its efficiencies and "
              "'best possible' rows are '-'" % path, file=sys.stderr)
    rows = [r for r in result["rows"] if r["algorithm"] != "compute"]
    rates = sorted({r["rate"] for r in rows}, key=rate_key, reverse=True)
    return result, {(r["rate"], r["algorithm"]): r for r in rows}, rates


def measured(by, rate, alg):
    r = by.get((rate, alg))
    return r if r and r.get("mean_ms") is not None else None


def fmt(value, spec):
    return spec % value if value is not None else "-"


def cell(by, rate, alg, compute):
    r = measured(by, rate, alg)
    if not r:
        return "-"
    return "%.1f (%s)" % (r["mean_ms"], fmt(None if compute is None else compute / r["mean_ms"],
                                            "%.2f"))


def ratio(by, rate, a, b):
    ra, rb = measured(by, rate, a), measured(by, rate, b)
    return "%.2f" % (ra["mean_ms"] / rb["mean_ms"]) if ra and rb else "-"


def best(by, rate, x, compute):
    r = measured(by, rate, x)
    return "%.2f" % (compute / r["mean_ms"]) if r and compute is not None else "-"


def main(paths):
    for path in paths:
        result, by, rates = load(path)
        compute = result["compute_ms"]
        workers = result["config"]["num_workers"]
        print("### %s (%s workers, compute only %s, load %s -> %s)\n" % (
            path, workers, fmt(compute, "%.1f ms"),
            "/".join("%.2f" % x for x in result["load_start"]),
            "/".join("%.2f" % x for x in result["load_end"])))
        print("| algorithm | " + " | ".join(
            "%s: ms/iter (eff.) | bound ms | CPU floor" % rate for rate in rates) + " |")
        print("|---|" + "---:|---:|---:|" * len(rates))
        for alg in ORDER:
            cells = []
            for rate in rates:
                r = measured(by, rate, alg)
                cells += ([cell(by, rate, alg, compute),
                           "%.1f" % (r.get("transfer_bound_ms") or 0),
                           "%.0f %%" % (100 * (r.get("cpu_floor_fraction") or 0))]
                          if r else ["-", "-", "-"])
            if any(c != "-" for c in cells):
                print("| %s | %s |" % (alg, " | ".join(cells)))
        print("\n| ratio | " + " | ".join(rates) + " |")
        print("|---|" + "---:|" * len(rates))
        for a, b in RATIOS:
            print("| %s / %s | %s |" % (a, b, " | ".join(ratio(by, rate, a, b)
                                                        for rate in rates)))
        for x in BEST_OF:
            print("| best possible: compute / %s | %s |" % (x, " | ".join(
                best(by, rate, x, compute) for rate in rates)))
        print()


def joined(values):
    """One cell of a worker count's files: "a / b", or "-" when none has a value."""
    return " / ".join(values) if any(v != "-" for v in values) else "-"


def grouped(paths):
    """[(workers, [load(path) of that worker count's files, in the order given],
    [balanced rate, exchange-bound rate])]: a worker count's balanced point is the
    fastest rate of its files, its exchange-bound point the slowest; a file may hold
    one of them or both (a one-rate file counts where its rate is).  Exits when
    the files of one worker count hold more than two rates or differ in dilation."""
    groups = {}
    for path in paths:
        res, by, rates = load(path)
        groups.setdefault(res["config"]["num_workers"], []).append((path, (res, by, rates)))
    out = []
    for n, members in groups.items():
        first_path, (first, _, _) = members[0]
        for path, (res, _, _) in members[1:]:
            if res["config"].get("time_scale") != first["config"].get("time_scale"):
                sys.exit("exchange_bound_table.py: %d-worker files differ in time_scale "
                         "(%s, %s): one column holds one point" % (n, first_path, path))
        rates = sorted({rate for _, (_, _, r) in members for rate in r}, key=rate_key,
                       reverse=True)
        if len(rates) > 2:
            sys.exit("exchange_bound_table.py: %d-worker files differ in rates (%s: %s): "
                     "one column holds one point, a balanced and an exchange-bound rate"
                     % (n, ", ".join(path for path, _ in members), ", ".join(rates)))
        out.append((n, [col for _, col in members], [rates[0], rates[-1]]))
    return out


def group_cell(cols, rate, alg):
    """ms/iter of every file ("a / b") and, in brackets, each one's efficiency."""
    rows = [measured(by, rate, alg) for _, by, _ in cols]
    if not any(rows):
        return "-"
    return "%s (%s)" % (
        " / ".join(fmt(r and r["mean_ms"], "%.1f") for r in rows),
        " / ".join(fmt(res["compute_ms"] / r["mean_ms"] if r and res["compute_ms"] is not None
                       else None, "%.2f") for r, (res, _, _) in zip(rows, cols)))


def across(paths):
    groups = grouped(paths)
    for point, idx in (("balanced point", 0), ("exchange-bound point", -1)):
        head = ["%s workers (%s, x%g)" % (n, rates[idx], cols[0][0]["config"]["time_scale"])
                for n, cols, rates in groups]
        print("### %s\n" % point.capitalize())
        print("| algorithm | " + " | ".join(head) + " |")
        print("|---|" + "---:|" * len(groups))
        # a file without this point's rate has no compute-only time for it either
        print("| compute only | " + " | ".join(
            joined([fmt(res["compute_ms"] if rates[idx] in file_rates else None, "%.1f")
                    for res, _, file_rates in cols])
            for _, cols, rates in groups) + " |")
        for alg in ORDER:
            print("| %s | %s |" % (alg, " | ".join(group_cell(cols, rates[idx], alg)
                                                  for _, cols, rates in groups)))
        for a, b in RATIOS:
            print("| %s / %s | %s |" % (a, b, " | ".join(
                joined([ratio(by, rates[idx], a, b) for _, by, _ in cols])
                for _, cols, rates in groups)))
        for x in BEST_OF:
            print("| best possible: compute / %s | %s |" % (x, " | ".join(
                joined([best(by, rates[idx], x, res["compute_ms"]) for res, by, _ in cols])
                for _, cols, rates in groups)))
        print()
    if any(len(cols) > 1 for _, cols, _ in groups):
        print("a / b: the files of a worker count in the order given ('-': that file did "
              "not run it at this point)")


if __name__ == "__main__":
    if sys.argv[1] == "--across":
        across(sys.argv[2:])
    else:
        main(sys.argv[1:])
