"""A pytest plugin: a test that failed because a Horovod job crashed inside MXNet
or Horovod runs once more.

Such crashes (:data:`procs.HOROVOD_CRASH`) came twice in CI, in different tests,
and never when the job was repeated; any test that starts a Horovod job can meet
one.  A test whose failure report (message and captured output) shows the crash
signature and :data:`HOROVOD_JOB` is run once more, with a warning that keeps the
first failure's tail; its second result stands, whatever it is.  Every other
failure is reported at once.  conftest.py loads this plugin.
"""
import pytest
from _pytest.runner import runtestprotocol

from procs import shows_horovod_crash


def _failure_text(reports):
    """Message and captured output of the failed reports (empty: none failed)."""
    parts = []
    for report in reports:
        if report.failed:
            parts.append(report.longreprtext)
            parts.extend(content for _, content in report.sections)
    return "\n".join(parts)


#: what only a Horovod job prints (the other ranks after a crash, horovodrun's report);
#: a bare "horovod" would match test and path names
HOROVOD_JOB = ("Horovod has been shut down", "horovodrun")


def horovod_crashed(reports):
    """True if a report failed with the crash signature of a Horovod job."""
    text = _failure_text(reports)
    return shows_horovod_crash(text) and any(mark in text for mark in HOROVOD_JOB)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    if horovod_crashed(reports):
        first = _failure_text(reports)
        item.warn(pytest.PytestWarning(
            "a Horovod job crashed inside MXNet or Horovod; running the test once "
            "more. First failure's tail:\n%s" % first[-3000:]))
        item._initrequest()  # fresh fixtures (tmp_path, marks) for the second run
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
