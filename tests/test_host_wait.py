"""cpsgd-launch -H --max-restarts --host-wait over real ssh on emulated hosts:
a host whose link goes down (``ip link set eth0 down`` in its namespace) is
waited for after the stall is detected; when it answers again, what is left
of the job there is swept and the job restarts; when it does not, the job
ends with one line naming it.  Root only (see tests/test_cluster.py)."""
import os
import subprocess
import sys
import threading
import time

import pytest
from procs import repo_pythonpath
from test_cluster import (BOUND_S, _REASON, assert_nothing_left,  # noqa: F401
                          launchers, make_hosts)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(400)]
except ImportError:
    pytestmark = []
if _REASON:
    pytestmark.append(pytest.mark.skip(reason="emulated ssh hosts unavailable: " + _REASON))

# First attempt: push/pull forever, reporting progress; after a restart: exit.
LOOP = r"""
import os, sys, time
import mxnet as mx
kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.ones((2, 3)))
mx.nd.waitall()
kv._barrier()
if os.environ.get("MXNET_CPSGD_RESTART"):
    print("restarted", flush=True)
    sys.exit(0)
print("store up", flush=True)
out, step = mx.nd.zeros((2, 3)), 0
while True:
    kv.push(3, mx.nd.ones((2, 3)))
    kv.pull(3, out=out)
    out.wait_to_read()
    step += 1
    print("[cpsgd-progress] phase=train step=%d" % step, file=sys.stderr, flush=True)
    time.sleep(0.1)
"""


def _link(host, state):
    subprocess.run(["ip", "-n", host.netns, "link", "set", "eth0", state], check=True)


@pytest.mark.parametrize("back_s,host_wait", [(5, 90), (None, 10)])
def test_link_down_host_is_waited_for(make_hosts, launchers, mark, tmp_path, back_s,
                                      host_wait):
    """The link of the second host goes down; it comes back ``back_s`` seconds
    after the launcher says it waits for the host (an event, not a fixed time
    after the cut, which a loaded machine may take to get there), or never."""
    hosts = make_hosts(2)
    (tmp_path / "loop.py").write_text(LOOP)
    launcher = launchers(hosts, mark, [
        "-n", "2", "-s", "1", "--stall-timeout", "3", "--timeout", "20",
        "--ssh-connect-timeout", "3", "--max-restarts", "1", "--host-wait", str(host_wait)],
        [sys.executable, str(tmp_path / "loop.py")])
    h1, h2 = hosts.hosts
    try:
        assert launcher.wait_for(["[worker 0 on %s] store up" % h2.address,
                                  "[worker 1 on %s] store up" % h1.address]), \
            launcher.text[-4000:]
        _link(h2, "down")
        cut = time.monotonic()
        if back_s is not None:
            def back():
                if launcher.wait_for(["waiting up to %g s for the host" % host_wait]):
                    time.sleep(back_s)
                    _link(h2, "up")
            timer = threading.Thread(target=back, daemon=True)
            timer.start()
        code = launcher.finish(BOUND_S + host_wait + 60)
        took = time.monotonic() - cut
    finally:
        _link(h2, "up")
    text = launcher.text
    print(text[-3000:])
    assert "cpsgd-launch: could not check %s for processes left of the job" % h2.address \
        in text, text[-4000:]
    assert "waiting up to %g s for the host to answer again (--host-wait)" % host_wait in text
    if back_s is not None:
        timer.join()
        assert code == 0, text[-4000:]
        assert "of --host-wait" in text and "every host answered again" in text
        assert "cpsgd-launch: restart 1 of 1 (MXNET_CPSGD_RESTART=1)" in text
        assert "] restarted" in text
        assert text.count("job started on hosts") == 2
    else:
        # the failure noticed first sets the code: the worker's lost ssh session (255)
        # or its missing progress (1), whichever came first after the link went down
        first = next(line for line in text.splitlines() if "; stopping the job" in line)
        lost = "worker 0 on %s lost its ssh session (ssh exited with code 255)" % h2.address
        assert code == (255 if lost in first else 1), text[-4000:]
        note = "could not check %s for processes left of the job; no answer within " \
               "--host-wait %g s" % (h2.address, host_wait)
        assert "cpsgd-launch: " + note in text
        assert "restart 1 of 1" not in text and text.count("job started on hosts") == 1
        assert took < BOUND_S + host_wait
    assert_nothing_left(hosts, mark)


CHECK = r"""
import sys
from mxnet_cpsgd.cluster import engines, ssh
cluster = ssh.Cluster(ssh.parse_hostfile(sys.argv[1]),
                      ssh.SshSettings(config=sys.argv[2], connect_timeout=2))
try:
    address, port = engines.prepare(cluster, None, "x", first=False, timeout=10,
                                    wait=float(sys.argv[3]),
                                    message=lambda text: print(text, flush=True))
    print("checked", address)
except ssh.HostError as err:
    print("gave up:", err)
"""


def test_restart_check_waits_for_the_host(make_hosts, tmp_path):
    """The restart's host check (ssh preflight) is retried within --host-wait:
    it succeeds once the link is back, and gives up with the host's error
    when the wait is over.  The link comes back when the check says it tries
    again (not after a fixed time, which a loaded machine may spend starting
    the check)."""
    hosts = make_hosts(1)
    host = hosts.hosts[0]
    (tmp_path / "check.py").write_text(CHECK)
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO))

    def check(wait, on_retry=lambda: None):
        proc = subprocess.Popen(hosts.launcher.wrap(
            [sys.executable, str(tmp_path / "check.py"), hosts.hostfile, hosts.ssh_config,
             str(wait)]), env=env, stdout=subprocess.PIPE, text=True)
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if "trying again for up to" in line:
                    on_retry()
            proc.wait(120)
        finally:
            proc.kill()
            proc.wait()
        return "".join(lines)

    _link(host, "down")
    try:
        out = check(60, on_retry=lambda: _link(host, "up"))
        assert "checked %s" % hosts.launcher.address in out, out
        retries = [l for l in out.splitlines() if "trying again for up to" in l]
        assert len(retries) == 1 and retries[0].startswith(
            "cannot reach %s over ssh" % host.address), out
        _link(host, "down")
        out = check(4)
        assert "gave up: cannot reach %s over ssh" % host.address in out, out
        assert out.count("trying again for up to") == 1, out
    finally:
        _link(host, "up")
