"""tests/horovod_rerun.py: which failed tests run once more, and what is reported.

An inner pytest session (a subprocess, with the plugin loaded as conftest.py loads
it) runs four tests that count their runs in files: one fails with the crash
signature of a Horovod job once, one every time, one with another error, one with
the signature of a crash in a job that is not Horovod's.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

INNER = '''
import os

def _count(name):
    path = os.path.join(os.environ["RERUN_COUNTS"], name)
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(n))
    return n

def test_crash_once():
    if _count("once") == 1:
        print("[worker 1] Segmentation fault: 11")
        print("[worker 0] MXNetError: Horovod has been shut down")
        assert False, "horovodrun exited 1"

def test_crash_every_time():
    _count("every")
    assert False, "worker 1 exited with signal SIGSEGV; Horovod has been shut down"

def test_other_failure():
    _count("other")
    print("[worker 0] MXNetError: Horovod has been shut down")
    assert False, "horovodrun exited 1: wrong weights"

def test_crash_without_horovod():
    _count("plain")
    assert False, "worker 1 exited with signal SIGSEGV"
'''


def test_only_a_horovod_crash_runs_again_and_once(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "conftest.py").write_text(
        "from horovod_rerun import pytest_runtest_protocol  # noqa: F401\n")
    counts = tmp_path / "counts"
    counts.mkdir()
    env = dict(os.environ, RERUN_COUNTS=str(counts),
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                          "-p", "no:randomly", "test_inner.py"], cwd=str(tmp_path), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120)
    out = run.stdout
    assert run.returncode == 1, out
    runs = {p.name: int(p.read_text()) for p in counts.iterdir()}
    assert runs == {"once": 2, "every": 2, "other": 1, "plain": 1}, (runs, out)
    assert "PASSED test_inner.py::test_crash_once" in out, out
    for name in ("test_crash_every_time", "test_other_failure", "test_crash_without_horovod"):
        assert "FAILED test_inner.py::%s" % name in out, out
    assert "1 passed" in out and "3 failed" in out, out
    # the first failure is not lost: a warning keeps its tail
    assert out.count("running the test once more") == 2, out
    assert "[worker 1] Segmentation fault: 11" in out, out
