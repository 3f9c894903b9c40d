"""Tables of docs/perf/exchange-bound-point.md from cpsgd-bench results.json files.

    python docs/perf/exchange_bound_table.py RESULTS_JSON [RESULTS_JSON ...]
    python docs/perf/exchange_bound_table.py --across RESULTS_JSON [RESULTS_JSON ...]

Per file (one invocation) and rate: every algorithm's mean ms/iter with its
efficiency (the invocation's compute-only time / ms per iteration), the transfer
bound and the CPU floor's share; then the ratios the targets are about (cp-X / X,
cp-X / horovod, cpsgd / horovod) and the best any store could reach there
(compute / X).  With --across: two tables (each file's faster rate = balanced
point, its slower rate = exchange-bound point), one column per file.
"""
import json
import sys

ORDER = ["ssgd", "bitsgd", "cpsgd", "horovod", "fp16", "cpsgd_fp16", "powersgd",
         "cpsgd_powersgd"]
RATIOS = [("cpsgd_fp16", "fp16"), ("cpsgd_fp16", "horovod"),
          ("cpsgd_powersgd", "powersgd"), ("cpsgd_powersgd", "horovod"),
          ("cpsgd", "horovod"), ("cpsgd", "bitsgd")]


def rate_key(rate):
    return float(rate.rstrip("mbit")) if rate.endswith("mbit") else 0.0


def main(paths):
    for path in paths:
        result = json.load(open(path))
        rows = [r for r in result["rows"] if r["algorithm"] != "compute"]
        compute = result["compute_ms"]
        workers = result["config"]["num_workers"]
        print("### %s (%s workers, compute only %.1f ms, load %s -> %s)\n" % (
            path, workers, compute, "/".join("%.2f" % x for x in result["load_start"]),
            "/".join("%.2f" % x for x in result["load_end"])))
        rates = sorted({r["rate"] for r in rows}, key=rate_key, reverse=True)
        print("| algorithm | " + " | ".join(
            "%s: ms/iter (eff.) | bound ms | CPU floor" % rate for rate in rates) + " |")
        print("|---|" + "---:|---:|---:|" * len(rates))
        by = {(r["rate"], r["algorithm"]): r for r in rows}
        for alg in ORDER:
            cells = []
            for rate in rates:
                r = by.get((rate, alg))
                if not r or r.get("mean_ms") is None:
                    cells += ["-", "-", "-"]
                    continue
                cells += ["%.1f (%.2f)" % (r["mean_ms"], compute / r["mean_ms"]),
                          "%.1f" % (r.get("transfer_bound_ms") or 0),
                          "%.0f %%" % (100 * (r.get("cpu_floor_fraction") or 0))]
            if any(c != "-" for c in cells):
                print("| %s | %s |" % (alg, " | ".join(cells)))
        print("\n| ratio | " + " | ".join(rates) + " |")
        print("|---|" + "---:|" * len(rates))
        for a, b in RATIOS:
            cells = []
            for rate in rates:
                ra, rb = by.get((rate, a)), by.get((rate, b))
                ok = ra and rb and ra.get("mean_ms") and rb.get("mean_ms")
                cells.append("%.2f" % (ra["mean_ms"] / rb["mean_ms"]) if ok else "-")
            print("| %s / %s | %s |" % (a, b, " | ".join(cells)))
        for x in ("horovod", "fp16", "powersgd"):
            cells = []
            for rate in rates:
                r = by.get((rate, x))
                cells.append("%.2f" % (compute / r["mean_ms"]) if r and r.get("mean_ms") else "-")
            print("| best possible: compute / %s | %s |" % (x, " | ".join(cells)))
        print()


def cell(by, rate, alg, compute):
    r = by.get((rate, alg))
    if not r or r.get("mean_ms") is None:
        return "-"
    return "%.1f (%.2f)" % (r["mean_ms"], compute / r["mean_ms"])


def ratio(by, rate, a, b):
    ra, rb = by.get((rate, a)), by.get((rate, b))
    return "%.2f" % (ra["mean_ms"] / rb["mean_ms"]) if ra and rb else "-"


def across(paths):
    cols = []
    for path in paths:
        result = json.load(open(path))
        rows = [r for r in result["rows"] if r["algorithm"] != "compute"]
        rates = sorted({r["rate"] for r in rows}, key=rate_key, reverse=True)
        cols.append((result, {(r["rate"], r["algorithm"]): r for r in rows}, rates))
    for point, idx in (("balanced point", 0), ("exchange-bound point", -1)):
        head = ["%s (%s, x%g)" % ("%s workers" % res["config"]["num_workers"], rates[idx],
                                   res["config"]["time_scale"])
                for res, by, rates in cols]
        print("### %s\n" % point.capitalize())
        print("| algorithm | " + " | ".join(head) + " |")
        print("|---|" + "---:|" * len(cols))
        print("| compute only | " + " | ".join("%.1f" % res["compute_ms"] for res, _, _ in cols) + " |")
        for alg in ORDER:
            print("| %s | %s |" % (alg, " | ".join(cell(by, rates[idx], alg, res["compute_ms"])
                                                  for res, by, rates in cols)))
        for a, b in RATIOS:
            print("| %s / %s | %s |" % (a, b, " | ".join(ratio(by, rates[idx], a, b)
                                                        for res, by, rates in cols)))
        for x in ("horovod", "fp16", "powersgd"):
            print("| best possible: compute / %s | %s |" % (x, " | ".join(
                ("%.2f" % (res["compute_ms"] / by[(rates[idx], x)]["mean_ms"]))
                if (rates[idx], x) in by else "-" for res, by, rates in cols)))
        print()


if __name__ == "__main__":
    if sys.argv[1] == "--across":
        across(sys.argv[2:])
    else:
        main(sys.argv[1:])
