"""Run the test suite as two pytest processes side by side (scripts/run_tests.sh).

One lane runs the tests that build emulated hosts (marker ``hosts``, listed in
tests/tiers.py), one at a time, because they share namespace addresses, sshd and
the Slurm and MPI daemons; the other lane runs every other test (loopback jobs
and unit tests).  Many host tests wait on purpose (a link down, a stall timeout,
a daemon restarting) while loopback jobs compute, so two lanes finish in about
two thirds of one lane's time on two cores.

Usage: python scripts/test_lanes.py PYTHON [MARKER_EXPR]
    Each lane's lines are printed as they come, prefixed with the lane's name;
    the exit status is the first failing lane's (0 when both pass).  Ctrl-C or
    SIGTERM interrupts both lanes once (pytest then tears its tests down) and
    waits for them.
"""
import signal
import subprocess
import sys
import threading
import time

#: seconds a lane gets to tear its tests down after an interrupt, then SIGKILL
INTERRUPT_GRACE_S = 60


def lane_command(python, name, tier):
    selection = "hosts" if name == "hosts" else "not hosts"
    if tier:
        selection = "(%s) and %s" % (tier, selection)
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15",
            "tests", "-m", selection]


def relay(name, proc, lock):
    for line in proc.stdout:
        with lock:
            sys.stdout.write("%-8s| %s" % (name, line))
            sys.stdout.flush()


def main(argv):
    if not 1 <= len(argv) <= 2:
        sys.exit("usage: python scripts/test_lanes.py PYTHON [MARKER_EXPR]")
    python, tier = argv[0], (argv[1] if len(argv) == 2 else "")
    lock, lanes, started = threading.Lock(), {}, time.monotonic()
    # handled here, so the lanes start with SIGINT at its default even where this
    # script was started with it ignored (nohup, `&` in a script): pytest needs it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("hosts", "loopback"):
        # a process group of its own: a terminal's Ctrl-C reaches the lane once,
        # from here, not twice (a second SIGINT would cut pytest's teardown short)
        proc = subprocess.Popen(lane_command(python, name, tier), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1,
                                process_group=0)
        reader = threading.Thread(target=relay, args=(name, proc, lock), daemon=True)
        reader.start()
        lanes[name] = (proc, reader)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        for proc, _ in lanes.values():
            proc.wait()
    except KeyboardInterrupt:
        # pytest tears its tests down on SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for proc, _ in lanes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        for proc, _ in lanes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print("test lanes interrupted", flush=True)
        return 130
    for _, reader in lanes.values():
        reader.join(10)
    codes = {name: proc.returncode for name, (proc, _) in lanes.items()}
    # 5: no test selected, which a tier may leave a lane with
    failed = [name for name, code in codes.items() if code not in (0, 5)]
    print("test lanes: %s in %.0f s (%s)" % (
        "failed: " + ", ".join(failed) if failed else "both passed",
        time.monotonic() - started,
        ", ".join("%s exit %d" % item for item in codes.items())), flush=True)
    return codes[failed[0]] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
