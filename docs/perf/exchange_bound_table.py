"""Tables of docs/perf/exchange-bound-point.md from cpsgd-bench results.json files.

    python docs/perf/exchange_bound_table.py RESULTS_JSON [RESULTS_JSON ...]
    python docs/perf/exchange_bound_table.py --across RESULTS_JSON [RESULTS_JSON ...]

Per file (one invocation) and rate: every algorithm's mean ms/iter with its
efficiency (the invocation's compute-only time / ms per iteration), the transfer
bound and the CPU floor's share; then the ratios the targets are about (cp-X / X,
cp-X / horovod, cpsgd / horovod) and the best any store could reach there
(compute / X).  With --across: two tables (each file's faster rate = balanced
point, its slower rate = exchange-bound point), one column per file.

A file without a compute-only job (cpsgd-bench --no-compute-only) has no
efficiencies and no "compute / X": those show "-" (the times stay), and a line
on stderr names the file.
"""
import json
import sys

ORDER = ["ssgd", "bitsgd", "cpsgd", "horovod", "fp16", "cpsgd_fp16", "powersgd",
         "cpsgd_powersgd"]
RATIOS = [("cpsgd_fp16", "fp16"), ("cpsgd_fp16", "horovod"),
          ("cpsgd_powersgd", "powersgd"), ("cpsgd_powersgd", "horovod"),
          ("cpsgd", "horovod"), ("cpsgd", "bitsgd")]
#: the algorithms whose "compute / X" is the best any store could reach against X
BEST_OF = ("horovod", "fp16", "powersgd")


def rate_key(rate):
    return float(rate.rstrip("mbit")) if rate.endswith("mbit") else 0.0


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


def across(paths):
    cols = [load(path) for path in paths]
    for point, idx in (("balanced point", 0), ("exchange-bound point", -1)):
        head = ["%s (%s, x%g)" % ("%s workers" % res["config"]["num_workers"], rates[idx],
                                   res["config"]["time_scale"])
                for res, by, rates in cols]
        print("### %s\n" % point.capitalize())
        print("| algorithm | " + " | ".join(head) + " |")
        print("|---|" + "---:|" * len(cols))
        print("| compute only | " + " | ".join(fmt(res["compute_ms"], "%.1f")
                                               for res, _, _ in cols) + " |")
        for alg in ORDER:
            print("| %s | %s |" % (alg, " | ".join(cell(by, rates[idx], alg, res["compute_ms"])
                                                  for res, by, rates in cols)))
        for a, b in RATIOS:
            print("| %s / %s | %s |" % (a, b, " | ".join(ratio(by, rates[idx], a, b)
                                                        for res, by, rates in cols)))
        for x in BEST_OF:
            print("| best possible: compute / %s | %s |" % (x, " | ".join(
                best(by, rates[idx], x, res["compute_ms"]) for res, by, rates in cols)))
        print()


if __name__ == "__main__":
    if sys.argv[1] == "--across":
        across(sys.argv[2:])
    else:
        main(sys.argv[1:])
