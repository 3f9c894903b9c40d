"""Progress reports from a worker to the launcher that started it.

cpsgd-launch sets ``MXNET_CPSGD_PROGRESS=1`` in the workers it starts and reads
their standard error: a line that begins with :data:`PREFIX` is a progress
report (the launcher keeps it out of the visible log) and tells the launcher
that the worker is alive and what it is doing.  A node that reports nothing for
the launcher's stall timeout, while its phase does not excuse it, is stalled.

Line format (one line, ASCII)::

    [cpsgd-progress] phase=<phase> step=<int>

``phase`` is one of :data:`PHASES`: ``connect`` (inside ``mx.kv.create`` with a
distributed store's name: ps-lite waits there until every node of the job has
registered with the scheduler; reported by :func:`install_connect_hook`, which
reports an inferred ``start`` once the store exists), ``start`` (before the first step: loading
data, building the model, the first step's graph), ``train`` (``step`` = steps
completed), ``eval`` (an evaluation pass; ``step`` = batches evaluated in it),
``save`` (writing a checkpoint), ``exit`` (the script's main code is over;
the interpreter shuts down, MXNet's store waits for the other workers at its
final barrier; reported by :func:`install_exit_report`).  A report that ends
in :data:`INFERRED`
comes from :func:`install_step_hook` (an unchanged script's steps): the
launcher shows it as what the worker last did but does not expect more, since
the hook cannot see an evaluation pass or anything else between steps.

Standard library only: the launcher (``mxnet_cpsgd.cluster``) and the worker
side (stores, the training loop, ``worker_site``) both import this file.
"""
import os
import sys
import time
from typing import IO, NamedTuple, Optional

ENV = "MXNET_CPSGD_PROGRESS"
PREFIX = "[cpsgd-progress] "
PHASES = ("connect", "start", "train", "eval", "save", "exit")
#: the last word of a report inferred by the step hook
INFERRED = "source=hook"


class Report(NamedTuple):
    phase: str
    step: int


def format_report(phase: str, step: int) -> str:
    """The report line for ``phase`` and ``step``, without the newline."""
    if phase not in PHASES:
        raise ValueError("progress phase %r is not one of %s" % (phase, ", ".join(PHASES)))
    return "%sphase=%s step=%d" % (PREFIX, phase, int(step))


def inferred(line: str) -> bool:
    """Whether the report line came from the step hook (see the module doc)."""
    return line.rstrip().endswith(" " + INFERRED)


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
        enabled: report (default: :func:`wanted`).
        inferred: mark the reports as the step hook's (:data:`INFERRED`).
    """

    def __init__(self, min_interval: float = 1.0, stream: Optional[IO[str]] = None,
                 enabled: Optional[bool] = None, inferred: bool = False) -> None:
        self.min_interval = min_interval
        self.suffix = " " + INFERRED if inferred else ""
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
            stream.write(format_report(phase, step) + self.suffix + "\n")
            stream.flush()
        except (OSError, ValueError):  # the launcher is gone: nothing to report to
            return
        self._phase, self._last = phase, now


def install_exit_report(reporter: Optional[ProgressReporter] = None) -> bool:
    """Report phase ``exit`` when the interpreter starts to shut down (an
    ``atexit`` handler; registered first, so it runs after those of modules
    imported later, MXNet's among them, and before MXNet's store waits at its
    final barrier while the module objects are torn down).  Only when :func:`wanted`.

    Returns:
        Whether it was installed.
    """
    reporter = reporter or ProgressReporter()
    if not reporter.enabled:
        return False
    import atexit
    atexit.register(reporter.report, "exit", 0)
    return True


#: the step hook: module -> (class, method) of which every call is one training step
STEP_METHODS = {"mxnet.gluon.trainer": ("Trainer", "_update"),   # step() and update()
                "mxnet.module.module": ("Module", "update")}
#: a process that imported this module under its own name reports by itself
OWN_MODULE = "kvstore_ext.progress"


def install_step_hook(reporter: Optional[ProgressReporter] = None) -> bool:
    """Make an unchanged training script report ``train`` steps.

    Once MXNet's ``gluon.trainer`` (or ``module.module``) is imported, every
    ``Trainer.step``/``Trainer.update`` (``Module.update``) reports the number
    of such calls so far as the step, marked :data:`INFERRED`.  Stays silent in a process that imported
    ``kvstore_ext.progress`` itself (the project's training loop reports its
    own phases and steps).  The launcher loads this file, through
    ``worker_site/sitecustomize.py``, into every worker before its script runs.

    Returns:
        Whether the hook was installed (only when :func:`wanted`).
    """
    reporter = reporter or ProgressReporter(inferred=True)
    if not reporter.enabled:
        return False
    steps = [0]

    def on_step() -> None:
        if OWN_MODULE in sys.modules:
            return
        steps[0] += 1
        reporter.report("train", steps[0])
    for name, target in STEP_METHODS.items():
        sys.meta_path.insert(0, _PatchingFinder(
            name, lambda module, target=target: _patch_step_method(module, target, on_step)))
    return True


#: the module of MXNet's store factory ``create`` (``mx.kv.create``; ``mx.kvstore``
#: re-exports it after this module has run, so the patched one is what every caller gets)
CONNECT_MODULE = "mxnet.kvstore.base"


def joins_job(name) -> bool:
    """Whether ``mx.kv.create(name)`` joins a ps-lite job (a ``dist`` name)."""
    return isinstance(name, str) and "dist" in name.lower()


def install_connect_hook(reporter: Optional[ProgressReporter] = None,
                         after: Optional[ProgressReporter] = None) -> bool:
    """Make ``mx.kv.create`` report phase ``connect`` while it joins a job.

    With a distributed name, MXNet's ``create`` blocks until every node of the
    job has registered with the scheduler: forever when one cannot reach it
    (a firewall, a wrong interface) or never started.  The report lets the
    launcher bound that wait (``--connect-timeout``).  Once the store exists,
    an inferred ``start`` follows, so that what comes next is judged as before
    (the script's own reports, or the step hook's).

    Returns:
        Whether the hook was installed (only when :func:`wanted`).
    """
    reporter = reporter or ProgressReporter()
    after = after or ProgressReporter(inferred=True)
    if not reporter.enabled:
        return False

    def patch(base) -> None:
        original = getattr(base, "create", None)
        if original is None:
            return

        def create(name="local"):
            joining = joins_job(name)
            if joining:
                reporter.report("connect", 0)
            store = original(name)
            if joining:
                after.report("start", 0)
            return store
        create.__doc__ = original.__doc__
        create.__name__ = original.__name__
        base.create = create
    sys.meta_path.insert(0, _PatchingFinder(CONNECT_MODULE, patch))
    return True


class _PatchingFinder:
    """A meta path finder that calls ``patch(module)`` once ``name`` has run."""

    def __init__(self, name: str, patch) -> None:
        self._name, self._patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self._name:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenPatch(spec.loader, self._patch)
        return spec


class _ThenPatch:
    """Runs the module as its own loader would, then patches it."""

    def __init__(self, loader, patch) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch(module)


def _patch_step_method(module, target, on_step) -> None:
    cls = getattr(module, target[0], None)
    original = getattr(cls, target[1], None)
    if original is None:
        return

    def step_method(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        on_step()
        return result
    step_method.__wrapped__ = original
    step_method.__name__ = original.__name__
    setattr(cls, target[1], step_method)
