"""The rendezvous service of Horovod/Gloo jobs (mxnet_cpsgd.cluster.rendezvous),
on a real service process and raw sockets: a request that arrives slowly (as on a
slow, dilated or loaded link) is answered, not dropped, and the listening socket
holds more pending connections than Python's default of 5."""
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from mxnet_cpsgd.cluster.nodes import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def service():
    pytest.importorskip("horovod.runner.http.http_server")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mxnet_cpsgd.cluster.rendezvous",
                             "--port", str(port), "--hosts", "localhost,localhost",
                             "--bind", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    try:
        line = proc.stdout.readline()
        assert "rendezvous: serving 2 slots on port %d" % port in line, line
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def request(port, parts, pause_s):
    """Send ``parts`` of one HTTP request ``pause_s`` apart; return the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause_s)
            sock.sendall(part)
        answer = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return answer
            answer += chunk


def test_a_slow_request_is_answered(service):
    # Horovod's handler closes a connection whose request is not whole after 3 s
    # without an answer (Gloo reads "HTTP response not OK, got 0")
    body = b"10.0.0.1:1234"
    put = request(service, [b"PUT /global/rank_0 HTTP/1.1\r\nHost: x\r\n",
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)], 4.5)
    assert put.startswith(b"HTTP/1.0 200"), put
    got = request(service, [b"GET /global/ra", b"nk_0 HTTP/1.1\r\nHost: x\r\n\r\n"], 4.5)
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(body), got
    missing = request(service, [b"GET /global/rank_1 HTTP/1.1\r\nHost: x\r\n\r\n"], 0)
    assert missing.startswith(b"HTTP/1.0 404"), missing


def test_bad_request_timeout_is_rejected():
    out = subprocess.run([sys.executable, "-m", "mxnet_cpsgd.cluster.rendezvous",
                          "--port", "1", "--hosts", "localhost", "--request-timeout", "0"],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 2 and "--request-timeout must be positive" in out.stderr


def test_listen_backlog_holds_many_pending_connections(service):
    # Python's HTTP servers listen with a backlog of 5, which 32 polling workers
    # overflowed ("Connection reset by peer"); ss shows a listener's backlog as Send-Q
    ss = shutil.which("ss")
    if ss is None:
        pytest.skip("ss (iproute2) is not installed")
    out = subprocess.run([ss, "-ltnH", "sport = :%d" % service], capture_output=True,
                         text=True, timeout=30, check=True).stdout.split()
    assert out[0] == "LISTEN" and int(out[2]) >= 128, out
