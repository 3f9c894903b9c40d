"""Sample the TCP sockets of a running cpsgd-bench job's hosts, to see what a stall waits for.

    python reports/perf/tcp_sampler.py OUT.jsonl [--interval 0.25] [--max-seconds 3600]
    python reports/perf/tcp_sampler.py --stalls OUT.jsonl RESULTS_DIR/runs/RUN [--min-ms 150]
    python reports/perf/tcp_sampler.py --stalls OUT.jsonl NAME-iterations.json:RUN

(--stalls also reads OUT.jsonl.gz.)

Sampling: every --interval seconds, for each network namespace that holds a
ps-lite worker (DMLC_ROLE=worker; with colocated placement its host, the
server's sockets included), reads /proc/PID/net/tcp (files only, no process
started) and writes one JSON line: the wall clock and, per host, the established
sockets with bytes not yet acknowledged (tx_queue) or in retransmission backoff
(``retrnsmt`` > 0: how many RTOs in a row fired without an acknowledgement),
with their ports, unacknowledged bytes, RTOs in a row, RTO and congestion
window; from the long runs on also sockets with bytes received but not yet read by
the process (``unread``), the pending timer (1 retransmission or loss probe, 4
zero-window probe) and the unanswered zero-window probes.  Stops when no worker is
left (after one was seen) or after --max-seconds.

--stalls: every timed iteration of RUN (marked where its slowest worker took at
least --min-ms, emulated: divided by the run's dilation), lined up with the
samples taken from the first worker's start of it to the last one's end (needs
the workers' window_start_unix): how many sockets at most were in backoff at
once, the socket with the most RTOs in a row (ports, RTO, unacknowledged
bytes, congestion window), and the longest *hold* seen in it: one socket's
unacknowledged bytes staying the same, above 0, from sample to sample (no
acknowledgement came and nothing was written), in seconds real, and when it
ended, in seconds real after the first worker finished the iteration (negative:
before).  A socket waiting for its first RTO after a lost segment has no RTO
in a row yet and shows only as a hold.  Samples written before holds were
recorded (only sockets in backoff) show none.  From the long runs on, also the
most bytes one socket had received but its process not yet read, and how many
sockets at once waited on a zero-window probe (their peer's receive window closed).
"""
import argparse
import functools
import glob
import gzip
import importlib.util
import json
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


@functools.lru_cache(maxsize=None)
def _probes():
    """mxnet_cpsgd/bench/probes.py (standard library only), loaded from its file: the
    package's __init__ imports MXNet, which a sampler beside a running job need not."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                        "mxnet_cpsgd", "bench", "probes.py")
    spec = importlib.util.spec_from_file_location("bench_probes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker_hosts():
    """netns (the /proc/PID/ns/net link) -> pid of one running ps-lite worker in it."""
    found = {}
    for pid, env in _probes().process_environments():
        if env.get(b"DMLC_ROLE") != b"worker":
            continue
        try:
            netns = os.readlink("/proc/%d/ns/net" % pid)
        except OSError:
            continue
        found.setdefault(netns, pid)
    return found


def backoff_sockets(pid):
    """Established sockets of pid's namespace with unacknowledged bytes or at least
    one unanswered RTO."""
    out = []
    try:
        with open("/proc/%d/net/tcp" % pid) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if f[3] != "01":  # established
            continue
        retransmits = int(f[6], 16)
        tx_queue, rx_queue = (int(x, 16) for x in f[4].split(":"))
        timer = int(f[5].split(":")[0], 16)
        if retransmits == 0 and tx_queue == 0 and rx_queue == 0 and timer != 4:
            continue
        # timer 1: retransmission (or loss probe), 4: zero-window probe; after uid the
        # unanswered zero-window probes; after inode: refcount, pointer, rto, ato,
        # quick/pingpong, cwnd, ssthresh
        out.append({"local": int(f[1].split(":")[1], 16), "remote": int(f[2].split(":")[1], 16),
                    "rtos": retransmits, "unacked": tx_queue, "unread": rx_queue,
                    "timer": timer, "probes": int(f[8]),
                    "rto_ms": 1e3 * int(f[12]) / HZ, "cwnd": int(f[15])})
    return out


def sample(out_path, interval, max_seconds):
    seen = False
    end = time.time() + max_seconds
    with open(out_path, "w") as out:
        while time.time() < end:
            hosts = worker_hosts()
            if not hosts and seen:
                break
            seen = seen or bool(hosts)
            row = {"t": time.time(), "hosts": {}}
            for netns, pid in hosts.items():
                sockets = backoff_sockets(pid)
                if sockets:
                    row["hosts"][netns] = sockets
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(interval)


def load_samples(path):
    """The samples of a file that :func:`sample` wrote (gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def stalls(samples_path, run_dir, min_ms, scale=None):
    samples = load_samples(samples_path)
    path, run = (run_dir.rsplit(":", 1) if ":" in os.path.basename(run_dir)
                 else (run_dir, None))
    if os.path.isfile(path):  # NAME-iterations.json[:RUN], kept by steady_rate.py
        with open(path) as f:
            saved = json.load(f)
        workers = saved["runs"][run or sorted(saved["runs"])[0]]
        scale = scale or float(saved["time_scale"])
    else:
        workers = [json.load(open(p)) for p in glob.glob(os.path.join(run_dir, "worker-*.json"))]
    results = os.path.join(run_dir, "..", "..", "results.json")
    if scale is None:
        scale = 1.0
        if os.path.exists(results):
            scale = float(json.load(open(results))["config"].get("time_scale") or 1.0)
    if not all(w.get("window_start_unix") for w in workers):
        sys.exit("the run's workers did not record window_start_unix")
    n = min(len(w["iter_times_s"]) for w in workers)
    # an iteration's span: the earliest start and latest end over the workers
    spans = []
    for i in range(n):
        starts = [w["window_start_unix"] + sum(w["iter_times_s"][:i]) for w in workers]
        ends = [w["window_start_unix"] + sum(w["iter_times_s"][:i + 1]) for w in workers]
        slowest = max(1e3 * w["iter_times_s"][i] / scale for w in workers)
        spans.append((i, min(starts), max(ends), slowest, min(ends)))
    holds = socket_holds(samples)
    print("| i | slowest worker ms | samples | sockets in backoff (most) | most RTOs in a row "
          "| that socket: ports local > remote, RTO ms, unacked bytes, cwnd "
          "| longest hold s (real), its end s after the first worker's end "
          "| most unread bytes on one socket (ports) | sockets with a zero-window probe "
          "pending (most at once) |")
    print("|---:|---:|---:|---:|---:|---|---|---|---:|")
    for i, start, end, slowest, first_end in spans:
        inside = [s for s in samples if start <= s["t"] <= end]
        most, where, count = 0, "-", 0
        for s in inside:
            count = max(count, sum(1 for v in s["hosts"].values() for k in v if k["rtos"]))
            for sockets in s["hosts"].values():
                for k in sockets:
                    if k["rtos"] > most:
                        most = k["rtos"]
                        where = "%d > %d, %.0f, %d, %d" % (k["local"], k["remote"], k["rto_ms"],
                                                         k["unacked"], k["cwnd"])
        mark = " (stall)" if slowest >= min_ms else ""
        overlapping = [(t1 - t0, t1) for t0, t1, _ in holds if t0 <= end and t1 >= start]
        hold = "-"
        if overlapping:
            length, hold_end = max(overlapping)
            hold = "%.2f, %+.2f" % (length, hold_end - first_end)
        # recorded from the long runs on: '-' for older samples
        recorded = any("unread" in k for s in inside for v in s["hosts"].values() for k in v)
        unread, probing = "-", "-"
        if recorded:
            socks = [k for s in inside for v in s["hosts"].values() for k in v]
            top = max(socks, key=lambda k: k.get("unread", 0))
            unread = ("%d (%d > %d)" % (top["unread"], top["local"], top["remote"])
                      if top.get("unread") else "0")
            probing = max(sum(1 for v in s["hosts"].values() for k in v
                              if k.get("timer") == 4) for s in inside)
        print("| %d%s | %.1f | %d | %d | %d | %s | %s | %s | %s |" % (
            i, mark, slowest, len(inside), count, most, where, hold, unread, probing))


def socket_holds(samples):
    """(first, last, socket) for every run of samples in which one socket, (host, local
    port, remote port), kept the same unacknowledged bytes above 0, over two samples or
    more: first and last are the run's first and last sample times."""
    current, holds = {}, []
    for s in samples:
        seen = {}
        for host, sockets in s["hosts"].items():
            for k in sockets:
                if k["unacked"] > 0:
                    seen[(host, k["local"], k["remote"])] = k["unacked"]
        for name, (first, last, unacked) in list(current.items()):
            if seen.get(name) != unacked:
                if last > first:
                    holds.append((first, last, name))
                del current[name]
        for name, unacked in seen.items():
            if name in current:
                current[name] = (current[name][0], s["t"], unacked)
            else:
                current[name] = (s["t"], s["t"], unacked)
    holds.extend((first, last, name) for name, (first, last, _) in current.items()
                 if last > first)
    return holds


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the JSON-lines file to write (or read, with --stalls)")
    p.add_argument("run_dir", nargs="?", help="with --stalls: RESULTS_DIR/runs/RUN")
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--max-seconds", type=float, default=3600)
    p.add_argument("--stalls", action="store_true")
    p.add_argument("--min-ms", type=float, default=150.0)
    p.add_argument("--time-scale", type=float, default=None,
                   help="with --stalls: the run's dilation (default: its results.json's)")
    args = p.parse_args()
    if args.stalls:
        stalls(args.out, args.run_dir, args.min_ms, args.time_scale)
    else:
        sample(args.out, args.interval, args.max_seconds)


if __name__ == "__main__":
    main()
