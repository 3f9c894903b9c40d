"""Sample the memory of a running cpsgd-bench and of the whole machine.

    python reports/perf/job_memory.py BENCH_PID [--every 5] > memory.tsv

Every --every seconds until BENCH_PID exits: the summed resident memory (VmRSS)
of BENCH_PID and all its descendants (launcher, scheduler, servers, workers),
how many they are, the machine's used memory (MemTotal - MemAvailable, other
users' jobs included), and the largest peak resident memory (VmHWM) of one worker
and of one server process (by their DMLC_ROLE).  The last line is the maxima.
Reads /proc only.
"""
import argparse
import os
import time


def children_map():
    kids = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(pid))
    return kids


def role_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"DMLC_ROLE="):
                    return item.split(b"=", 1)[1].decode()
    except OSError:
        pass
    return None


def tree_rss_kb(root):
    """(summed VmRSS, processes, {role: largest VmHWM}) of root and its descendants."""
    kids = children_map()
    todo, total, count, peaks = [root], 0, 0, {}
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, []))
        try:
            with open("/proc/%d/status" % pid) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if "VmRSS" not in fields:
            continue
        total += int(fields["VmRSS"].split()[0])
        count += 1
        role = role_of(pid)
        if role in ("worker", "server"):
            peaks[role] = max(peaks.get(role, 0), int(fields["VmHWM"].split()[0]))
    return total, count, peaks


def machine_used_kb():
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return info["MemTotal"] - info["MemAvailable"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pid", type=int)
    p.add_argument("--every", type=float, default=5.0)
    args = p.parse_args()
    peak_tree = peak_machine = peak_count = 0
    peak_role = {"worker": 0, "server": 0}
    print("time\tjob_rss_mb\tprocesses\tmachine_used_mb\tworker_hwm_mb\tserver_hwm_mb",
          flush=True)
    while os.path.exists("/proc/%d" % args.pid):
        rss, count, peaks = tree_rss_kb(args.pid)
        used = machine_used_kb()
        peak_tree, peak_machine = max(peak_tree, rss), max(peak_machine, used)
        peak_count = max(peak_count, count)
        for role in peak_role:
            peak_role[role] = max(peak_role[role], peaks.get(role, 0))
        print("%s\t%.0f\t%d\t%.0f\t%.0f\t%.0f" % (
            time.strftime("%H:%M:%S", time.gmtime()), rss / 1024, count, used / 1024,
            peaks.get("worker", 0) / 1024, peaks.get("server", 0) / 1024), flush=True)
        time.sleep(args.every)
    print("max\t%.0f\t%d\t%.0f\t%.0f\t%.0f" % (
        peak_tree / 1024, peak_count, peak_machine / 1024, peak_role["worker"] / 1024,
        peak_role["server"] / 1024))


if __name__ == "__main__":
    main()
