"""What a job's nodes listen on, and what a stranger's connection does to a job
(docs/launcher.md, "Security model"), on real loopback ps-lite jobs.

ps-lite's traffic carries no authentication: anyone who reaches a node's port
can talk to it.  These tests pin down what the launcher promises: a
one-machine job listens on 127.0.0.1 only, and bytes from a stranger are
either ignored or end the job with one line naming the node, never a hang.
The multi-host counterpart (nodes listen on their host's cluster address
only) is in tests/test_cluster.py.
"""
import os
import socket
import struct
import sys
import threading
import time

import pytest
from procs import MARK_VAR, TimedStream, listening, marked_processes, processes_with_env

from mxnet_cpsgd.launch import run_job

try:  # a generous per-test bound where pytest-timeout is installed
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(180)]
except ImportError:
    pytestmark = []

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
BOUND_S = 60

# Store up, wait for the test's go (a file), then five more dist_sync rounds
# whose sums are checked: the job still works after what the test did.
KV_WAIT_THEN_ROUNDS = r"""
import os, time, mxnet as mx
kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.zeros((2, 3)))
mx.nd.waitall()
kv._barrier()
print("store up", flush=True)
while not os.path.exists(os.environ["GO_FILE"]):
    time.sleep(0.1)
out = mx.nd.zeros((2, 3))
for i in range(5):
    kv.push(3, mx.nd.ones((2, 3)) * (kv.rank + 1))
    kv.pull(3, out=out)
    out.wait_to_read()
n = kv.num_workers
assert (out.asnumpy() == n * (n + 1) / 2).all(), out.asnumpy()
print("rounds ok", flush=True)
"""


def role_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = dict(i.split(b"=", 1) for i in f.read().split(b"\0") if b"=" in i)
    except OSError:
        return None
    return env.get(b"DMLC_ROLE", b"").decode() or None


def start_job(tmp_path, mark):
    """The job in a thread; returns (stream, holder, thread, go_file)."""
    (tmp_path / "kv.py").write_text(KV_WAIT_THEN_ROUNDS)
    go = tmp_path / "go"
    stream, holder = TimedStream(), {}
    env = dict(NODE_ENV, GO_FILE=str(go), **{MARK_VAR: mark})

    def run():
        holder["result"] = run_job([sys.executable, str(tmp_path / "kv.py")], 2, 1, env=env,
                                   timeout=10, job_timeout=150, stall_timeout=5,
                                   stream=stream)
        holder["ended"] = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while stream.count("store up") < 2 and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    assert stream.count("store up") == 2, "\n".join(line for _, line in stream.lines)
    return stream, holder, thread, go


def test_one_machine_job_listens_on_loopback_only(tmp_path, mark):
    stream, holder, thread, go = start_job(tmp_path, mark)
    try:
        seen = {}
        for pid in marked_processes(mark):
            for address, port in listening(pid):
                seen.setdefault(role_of(pid), []).append(address)
    finally:
        go.touch()
        thread.join(BOUND_S + 30)
    assert sorted(seen) == ["scheduler", "server", "worker"], seen
    assert {a for addresses in seen.values() for a in addresses} == {"127.0.0.1"}, seen
    assert holder["result"].returncode == 0, holder["result"].output[-3000:]
    assert marked_processes(mark) == []


def _zmtp_greeting():
    """A ZMTP 3.0 greeting with the NULL mechanism (what any ZeroMQ peer sends first)."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32


def _zmtp_ready():
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    return b"\x04" + bytes([len(body)]) + body


def _garbage():
    """4 KiB of fixed pseudo-random bytes (not starting with 0xff, ZMTP 3's mark)."""
    state, out = 12345, bytearray()
    while len(out) < 4096:
        state = (1103515245 * state + 12345) % 2 ** 31
        out.append(state >> 16 & 0xFF)
    out[0] = 0x42
    return bytes(out)


#: what the stranger sends; whether ps-lite ignores it (seen here with MXNet
#: 1.9.1's bundled libzmq and ps-lite) or the node aborts (then the launcher
#: must end the job with one line naming it)
SENDS = {
    "http request": ([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"], "ignored"),
    "half a zmtp greeting": ([_zmtp_greeting()[:30]], "ignored"),
    "zmtp frame cut short": ([_zmtp_greeting(), _zmtp_ready(), b"\x00\x40\x08\x96"], "ignored"),
    "random bytes": ([_garbage()], "aborts"),
    "zmtp frame, no ps-lite message": ([_zmtp_greeting(), _zmtp_ready(), b"\x00\x02\x08\x96"],
                                       "aborts"),
}


@pytest.mark.parametrize("target,what", [("scheduler", what) for what in sorted(SENDS)]
                         + [("server", "random bytes"), ("server", "http request")])
def test_stranger_connection(tmp_path, mark, what, target):
    """Connect to the node's port from outside the job, send, close; then the
    workers do five more rounds.  Either nothing happened (the job succeeds)
    or the node aborted and the job ended with one line naming it."""
    chunks, expected = SENDS[what]
    stream, holder, thread, go = start_job(tmp_path, mark)
    try:
        pids = [p for p in marked_processes(mark) if role_of(p) == target]
        assert len(pids) == 1, pids
        ports = [port for _, port in listening(pids[0])]
        assert len(ports) == 1, ports
        with socket.create_connection(("127.0.0.1", ports[0]), timeout=5) as sock:
            sent = time.monotonic()
            for chunk in chunks:
                sock.sendall(chunk)
                time.sleep(0.2)
        time.sleep(1.0)
    finally:
        go.touch()
        thread.join(BOUND_S + 60)
    assert not thread.is_alive(), "job still running:\n" + "\n".join(
        line for _, line in stream.lines[-30:])
    result = holder["result"]
    print("%s to the %s: %s, job ended %.1f s after sending" % (
        what, target, result.failure or "job finished successfully", holder["ended"] - sent))
    if expected == "ignored":
        assert result.returncode == 0, result.output[-3000:]
        assert stream.count("rounds ok") == 2
    else:
        name = "scheduler" if target == "scheduler" else "server 0"
        assert result.failure == (
            "%s exited with signal SIGABRT after a fatal error: ../3rdparty/ps-lite/src/"
            "van.cc:520: Check failed: pb.ParseFromArray(meta_buf, buf_size): failed to parse "
            "string into protobuf; stopping the job" % name), result.output[-3000:]
        assert holder["ended"] - sent < BOUND_S
    assert processes_with_env(**{MARK_VAR: mark}) == []


HOROVOD_WAIT = r"""
import os, time
import horovod.mxnet as hvd
import mxnet as mx
hvd.init()
total = hvd.allreduce(mx.nd.ones((2,)) * (hvd.rank() + 1), average=False)
print("allreduce %s" % total.asnumpy()[0], flush=True)
while not os.path.exists(os.environ["GO_FILE"]):
    time.sleep(0.1)
"""


def _horovod_available():
    try:
        import horovod.mxnet  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return False
    return True


@pytest.mark.skipif(not _horovod_available(), reason="horovod.mxnet not installed")
def test_one_machine_allreduce_job_listens_on_loopback_only(tmp_path, mark):
    """A Horovod/Gloo job: the rendezvous service listens on 127.0.0.1 only
    (the workers' Gloo pairs listen on nothing once connected)."""
    (tmp_path / "hvd.py").write_text(HOROVOD_WAIT)
    go, stream, holder = tmp_path / "go", TimedStream(), {}
    env = dict(NODE_ENV, GO_FILE=str(go), **{MARK_VAR: mark})
    thread = threading.Thread(target=lambda: holder.update(result=run_job(
        [sys.executable, str(tmp_path / "hvd.py")], 2, env=env, timeout=10, job_timeout=150,
        stream=stream, allreduce=True)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while stream.count("allreduce 3.0") < 2 and time.monotonic() < deadline \
                and thread.is_alive():
            time.sleep(0.05)
        assert stream.count("allreduce 3.0") == 2, "\n".join(line for _, line in stream.lines)
        addresses = {a for pid in marked_processes(mark) for a, _ in listening(pid)}
    finally:
        go.touch()
        thread.join(BOUND_S + 30)
    assert addresses == {"127.0.0.1"}, addresses
    assert holder["result"].returncode == 0, holder["result"].output[-3000:]
    assert marked_processes(mark) == []
