"""The watchdog that runs every remote node of ``cpsgd-launch -H`` (see
:mod:`.ssh` for what it does and how the launcher talks to it).

:data:`WATCHDOG` is Python source, standard library only, run on the remote
host as ``python -c WATCHDOG GRACE HEARTBEAT ARGV...``; it must not import
mxnet (the node's DMLC_ROLE is in its environment).
"""

#: watchdog lines on the channel's stderr start with this
PROTOCOL_MARK = "\x1fcpsgd-remote "

WATCHDOG = r"""
import os, signal, subprocess, sys, threading, time
M = "\x1fcpsgd-remote "
def say(*words):
    try:
        os.write(2, (M + " ".join(str(w) for w in words) + "\n").encode())
    except OSError:
        pass
grace, heartbeat, argv = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
try:
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                             start_new_session=True)
except OSError as err:
    print("cannot start %s: %s" % (argv[0], err), flush=True)
    say("exit", 127)
    os._exit(127)
say("pid", child.pid)
last = [time.monotonic()]
lock = threading.Lock()
def group(sig):
    try:
        os.killpg(child.pid, sig)
    except OSError:
        pass
def stop(why):
    with lock:
        group(signal.SIGTERM)
        group(signal.SIGCONT)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                os.killpg(child.pid, 0)
            except OSError:
                break
            time.sleep(0.05)
        group(signal.SIGKILL)
        say("stopped", why)
        os._exit(128 + signal.SIGTERM)
def control():
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            stop("ssh_session_ended")
        last[0] = time.monotonic()
        word = line.strip()
        if word == b"TERM":
            group(signal.SIGTERM)
            group(signal.SIGCONT)
        elif word == b"KILL":
            group(signal.SIGKILL)
def watch():
    while True:
        time.sleep(min(1.0, heartbeat / 4))
        if time.monotonic() - last[0] > heartbeat:
            stop("no_heartbeat")
def states():
    seen = None
    while True:
        try:
            with open("/proc/%d/stat" % child.pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        state = state if state in ("T", "D") else "-"
        if state != seen:
            say("state", state)
            seen = state
        time.sleep(0.25)
for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(signum, lambda s, f: threading.Thread(target=stop, args=("signal_%d" % s,)).start())
threading.Thread(target=control, daemon=True).start()
if heartbeat > 0:
    threading.Thread(target=watch, daemon=True).start()
threading.Thread(target=states, daemon=True).start()
code = child.wait()
with lock:
    group(signal.SIGKILL)
    sys.stdout.flush()
    say("exit", code)
    os._exit(code if code >= 0 else 128 - code)
"""
