"""How long a parameter-server store's exchange takes per iteration, from a timeline.

Reads the merged trace that ``cpsgd-bench --timeline`` writes
(``<out-dir>/timeline/<rate>-<store>.trace.json``) and prints, per worker and
profiled iteration (times undilated, ms):

- window: from the first push issued to the last pull (or push-pull) completed;
- first ack: median time until the server answered the pushes issued first;
- last ack: from the last push issued (the end of the backward pass) to the last
  push answered (the server answers a push once every worker has pushed that key
  and the update ran);
- tail: from that answer to the last pull completed;
- start: when the worker issued its first push (for the spread across workers).

Usage: python reports/perf/exchange_window.py TRACE_JSON TIME_SCALE
"""
import json
import statistics
import sys

PUSH = ("KVStoreDistCompressedPush", "KVStoreDistDefaultPush",
        "KVStoreDistDefaultStoragePushPull")
PULL = ("KVStoreDistDefaultStoragePull",)
GAP_MS = 20.0  # pushes further apart than this (undilated) start a new iteration


def iterations(path, time_scale):
    scale = time_scale * 1e3  # trace microseconds -> undilated milliseconds
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("name") in PUSH + PULL]
    rows = []
    for pid in sorted({e["pid"] for e in events}):
        mine = sorted((e for e in events if e["pid"] == pid), key=lambda e: e["ts"])
        pushes = [e for e in mine if e["name"] in PUSH]
        pulls_all = [e for e in mine if e["name"] in PULL]
        groups = [[pushes[0]]]
        for a, b in zip(pushes, pushes[1:]):
            if (b["ts"] - a["ts"]) / scale > GAP_MS:
                groups.append([b])
            else:
                groups[-1].append(b)
        size = max(len(g) for g in groups)
        groups = [g for g in groups if len(g) == size]  # whole iterations only
        for i, group in enumerate(groups):
            first = min(e["ts"] for e in group)
            last_issue = max(e["ts"] for e in group)
            last_ack = max(e["ts"] + e["dur"] for e in group)
            following = groups[i + 1][0]["ts"] if i + 1 < len(groups) else float("inf")
            pulls = [e for e in pulls_all if first <= e["ts"] < following]
            done = max([e["ts"] + e["dur"] for e in pulls] + [last_ack])
            early = [e["dur"] / scale for e in group if (e["ts"] - first) / scale < 1.0]
            rows.append({"worker": pid, "start": first / scale,
                         "window": (done - first) / scale,
                         "first_ack": statistics.median(early),
                         "last_ack": (last_ack - last_issue) / scale,
                         "tail": (done - last_ack) / scale,
                         "keys": len(group)})
    return rows


def start_spreads(rows, within_ms=100.0):
    """Spread of the workers' iteration starts, one figure per profiled iteration."""
    ordered = sorted(rows, key=lambda r: r["start"])
    clusters = [[ordered[0]]]
    for r in ordered[1:]:
        if r["start"] - clusters[-1][0]["start"] > within_ms:
            clusters.append([r])
        else:
            clusters[-1].append(r)
    return [max(r["start"] for r in c) - min(r["start"] for r in c) for c in clusters]


def main(argv):
    rows = iterations(argv[1], float(argv[2]))
    print("| figure (ms, undilated) | min | median | max |")
    print("|---|---:|---:|---:|")
    for key, label in (("window", "exchange window: first push issued to last pull done"),
                       ("first_ack", "answer to the first pushes of an iteration"),
                       ("last_ack", "last push answered, after the last push was issued"),
                       ("tail", "last pull done, after that answer")):
        values = [r[key] for r in rows]
        print("| %s | %.1f | %.1f | %.1f |" % (label, min(values), statistics.median(values),
                                              max(values)))
    print()
    print("Spread of the workers' iteration starts, per profiled iteration: %s ms; "
          "%d worker-iterations, %d keys pushed per iteration."
          % (", ".join("%.1f" % s for s in start_spreads(rows)), len(rows), rows[0]["keys"]))


if __name__ == "__main__":
    main(sys.argv)
