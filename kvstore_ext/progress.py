"""Progress reports from a worker to the launcher that started it.

cpsgd-launch sets ``MXNET_CPSGD_PROGRESS=1`` in the workers it starts and reads
their standard error: a line that begins with :data:`PREFIX` is a progress
report (the launcher keeps it out of the visible log) and tells the launcher
that the worker is alive and what it is doing.  A node that reports nothing for
the launcher's stall timeout, while its phase does not excuse it, is stalled.

Line format (one line, ASCII)::

    [cpsgd-progress] phase=<phase> step=<int>

``phase`` is one of :data:`PHASES`: ``start`` (before the first step: loading
data, building the model, the first step's graph), ``train`` (``step`` = steps
completed), ``eval`` (an evaluation pass; ``step`` = batches evaluated in it),
``save`` (writing a checkpoint).

Standard library only: the launcher (``mxnet_cpsgd.cluster``) and the worker
side (stores, the training loop, ``worker_site``) both import this file.
"""
import os
import sys
import time
from typing import IO, NamedTuple, Optional

ENV = "MXNET_CPSGD_PROGRESS"
PREFIX = "[cpsgd-progress] "
PHASES = ("start", "train", "eval", "save")


class Report(NamedTuple):
    phase: str
    step: int


def format_report(phase: str, step: int) -> str:
    """The report line for ``phase`` and ``step``, without the newline."""
    if phase not in PHASES:
        raise ValueError("progress phase %r is not one of %s" % (phase, ", ".join(PHASES)))
    return "%sphase=%s step=%d" % (PREFIX, phase, int(step))


def parse(line: str) -> Optional[Report]:
    """The :class:`Report` in ``line``, or None when it is no (well-formed) report."""
    if not line.startswith(PREFIX):
        return None
    fields = dict(part.split("=", 1) for part in line[len(PREFIX):].split() if "=" in part)
    try:
        report = Report(fields["phase"], int(fields["step"]))
    except (KeyError, ValueError):
        return None
    return report if report.phase in PHASES else None


def wanted(environ=None) -> bool:
    """Whether the process was started by a launcher that reads reports."""
    return (os.environ if environ is None else environ).get(ENV) == "1"


class ProgressReporter:
    """Writes reports, at most one per ``min_interval`` seconds within a phase.

    A change of phase is written at once, so the launcher always knows the
    current phase; within a phase only the newest step matters.  Does nothing
    unless :func:`wanted`.

    Args:
        min_interval: seconds between two reports of the same phase.
        stream: where to write (default: ``sys.stderr`` at the time of writing).
    """

    def __init__(self, min_interval: float = 1.0, stream: Optional[IO[str]] = None,
                 enabled: Optional[bool] = None) -> None:
        self.min_interval = min_interval
        self.stream = stream
        self.enabled = wanted() if enabled is None else enabled
        self._phase = None
        self._last = 0.0

    def report(self, phase: str, step: int) -> None:
        """Report ``phase`` and ``step`` if the phase changed or the interval passed."""
        if not self.enabled:
            return
        now = time.monotonic()
        if phase == self._phase and now - self._last < self.min_interval:
            return
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write(format_report(phase, step) + "\n")
            stream.flush()
        except (OSError, ValueError):  # the launcher is gone: nothing to report to
            return
        self._phase, self._last = phase, now
