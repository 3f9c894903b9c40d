"""Telling a stalled job from a slow one (``cpsgd-launch --stall-timeout``).

A stalled node is alive but makes no progress: SIGSTOPped, a hung driver, a
host swapping or stuck on a file system.  Its process does not exit, so the
launcher's exit watch never sees it, and in a synchronous job every other node
waits for it forever.  Two kinds of evidence end such a job, each after
``stall_timeout`` seconds:

* **A stopped process** (state ``T`` in ``/proc/PID/stat``; for a remote node
  the watchdog on its host reports the state over the ssh session).  Works
  for every node, including servers and the scheduler, which are MXNet's own
  processes and report nothing, and for scripts that never report.  A node
  stopped for ``stall_timeout`` ends the job even while the workers still
  train (a stopped scheduler blocks the next barrier; nothing the launcher
  starts stops itself).
* **No worker progressing.**  Workers report their phase and step
  (kvstore_ext/progress.py).  When every running worker that has reported is
  silent for longer than its phase allows (``train``: ``stall_timeout``, or
  :data:`SLOW_STEP_FACTOR` times the longest gap between its train reports so
  far when steps are that slow; ``start``, ``eval`` and ``save``:
  :data:`LONG_PHASE_FACTOR` times the timeout, for a slow first step, a long
  evaluation batch or a large checkpoint), the job is stalled.  A worker in
  phase ``exit`` (reported by the launcher's ``worker_site`` once the
  script's main code is over) is not watched for silence: it may wait at
  MXNet's final barrier for as long as the others still train.  The node blamed is a stopped one or one in uninterruptible sleep
  (``D``) if there is one, else a worker on this machine that kept a CPU busy
  all the while (a loop that never ends a step), else the worker whose report
  is the oldest.  One worker evaluating (and reporting) while the others
  wait for it at the next step is no stall: some worker still progresses.
  Reports that the launcher's step hook inferred from an unchanged script's
  ``Trainer.step`` calls only say what the worker last did: the hook cannot
  see an evaluation pass, so silence after them is no evidence.

CPU time alone ends no job: in a stalled synchronous job every waiting node
burns as little CPU as a stuck one, and a script sleeping or waiting for input
looks like a hung one; it only picks the culprit among silent workers.
ps-lite's heartbeats
(``PS_HEARTBEAT_INTERVAL``) are not used either: in MXNet 1.9.1's ps-lite the
scheduler only records them (for a recovering node), it never acts on a
missing one, and a stopped node's sockets stay open.
"""
import time
from typing import Dict, List, Optional, Tuple

from mxnet_cpsgd.cluster import procfs, ssh
from mxnet_cpsgd.cluster.nodes import Node

#: ``start``, ``eval`` and ``save`` may be silent this many times the stall timeout
LONG_PHASE_FACTOR = 4
#: ``train`` may be silent this many times the longest gap between its reports so far
SLOW_STEP_FACTOR = 3
#: the stall timeout when none is given (seconds)
DEFAULT_STALL_TIMEOUT_S = 30.0
#: seconds a worker may wait in mx.kv.create for the others when none is given
DEFAULT_CONNECT_TIMEOUT_S = 300.0
#: how often process states are read (seconds)
SAMPLE_S = 0.25
#: a longer gap between two checks means the launcher itself did not run
LAUNCHER_PAUSE_S = 2.0
#: process states that count as evidence (see the module doc)
STOPPED, UNINTERRUPTIBLE = "T", "D"
#: a silent worker that used this share of a CPU over the stall timeout is busy (a
#: worker waiting for the others uses next to none; a loop gets more even on a
#: machine loaded 10 times over)
BUSY_SHARE = 0.05


def process_state(node: Node) -> Tuple[Optional[str], Optional[float]]:
    """The state letter of the node's process (``R``, ``S``, ``D``, ``T``, ...)
    and its CPU time in seconds; None for what is unknown (not started, gone;
    a remote node's CPU time, and its state before the first report)."""
    proc = node.proc
    if proc is None:
        return None, None
    if isinstance(proc, ssh.RemoteProcess):
        return proc.remote_state, None
    stat = procfs.stat(proc.pid)
    return (stat.state, stat.cpu_s) if stat is not None else (None, None)


def allowance(node: Node, stall_timeout: float,
              connect_timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT_S) -> float:
    """Seconds the worker may be silent in its current phase: ``train`` the
    stall timeout, or :data:`SLOW_STEP_FACTOR` times the longest gap between
    two train reports seen so far if that is longer (slow steps on a slow
    network); ``connect`` the connect timeout (None: no limit); the other
    phases :data:`LONG_PHASE_FACTOR` times the stall timeout."""
    phase = node.last_report.phase if node.last_report else "start"
    if phase == "connect":
        return float("inf") if not connect_timeout else connect_timeout
    if phase == "train":
        return max(stall_timeout, SLOW_STEP_FACTOR * node.longest_train_gap)
    return LONG_PHASE_FACTOR * stall_timeout


def last_did(node: Node, now: float) -> str:
    """``'last report: phase train step 50, 3.1 s ago'`` or ``'no progress report'``."""
    if node.last_report is None:
        return "no progress report"
    return "last report: phase %s step %d, %.1f s ago" % (
        node.last_report.phase, node.last_report.step, now - node.last_report_at)


class StallWatch:
    """Watches the running nodes of one job for the evidence above.

    Args:
        nodes: the job's nodes (those that have exited are skipped).
        stall_timeout: seconds (> 0).
        connect_timeout: seconds the workers may wait in ``mx.kv.create``
            for the job's other nodes (0 or None: no limit).
    """

    def __init__(self, nodes: List[Node], stall_timeout: float,
                 connect_timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        self.nodes = nodes
        self.stall_timeout = stall_timeout
        self.connect_timeout = connect_timeout
        self._states: Dict[str, Optional[str]] = {}
        #: node name -> (time, CPU seconds) samples of the last stall_timeout
        self._cpu: Dict[str, List[Tuple[float, float]]] = {}
        #: node name -> when it was first seen stopped (continuously since)
        self._stopped_since: Dict[str, float] = {}
        self._sampled = 0.0
        self._checked: Optional[float] = None
        #: silence before this time does not count (the launcher itself was not running)
        self._awake_since = time.monotonic()

    def _sample(self, now: float) -> None:
        for node in self.nodes:
            state, cpu = process_state(node) if node.returncode is None else (None, None)
            self._states[node.name] = state
            history = self._cpu.setdefault(node.name, [])
            if cpu is not None:
                history.append((now, cpu))
            while history and now - history[0][0] > self.stall_timeout:
                history.pop(0)
            if state == STOPPED:
                self._stopped_since.setdefault(node.name, now)
            else:
                self._stopped_since.pop(node.name, None)

    def check(self, now: Optional[float] = None) -> Optional[str]:
        """One line naming the stalled node (ending with ``; stopping the job``),
        or None while the job is not stalled."""
        now = time.monotonic() if now is None else now
        if self._checked is not None and now - self._checked > LAUNCHER_PAUSE_S:
            # the launcher was stopped or starved of CPU: its readers may hold
            # reports not yet read, and the samples have a gap; start afresh
            self._awake_since = now
            self._stopped_since.clear()
        self._checked = now
        if now - self._sampled >= SAMPLE_S:
            self._sample(now)
            self._sampled = now
        running = [n for n in self.nodes if n.returncode is None]
        for node in running:
            since = self._stopped_since.get(node.name)
            if since is not None and now - since >= self.stall_timeout:
                return self._stopped_line(node, now - since, now)
        reporting = [n for n in running if n.role == "worker" and n.last_report_at is not None
                     and not n.last_report_inferred and n.last_report.phase != "exit"]
        if not reporting or any(now - self._silent_since(n)
                                <= allowance(n, self.stall_timeout, self.connect_timeout)
                                for n in reporting):
            return None
        if all(n.last_report.phase == "connect" for n in reporting):
            return self._connect_line(reporting, now)
        return self._silent_line(reporting, now)

    def _silent_since(self, node: Node) -> float:
        return max(node.last_report_at, self._awake_since)

    def _stopped_line(self, node: Node, seconds: float, now: float) -> str:
        line = "%s made no progress for %.1f s: its process is stopped (state T)" % (
            node.name, seconds)
        if node.role == "worker":
            line += " (%s)" % last_did(node, now)
        return line + "; stopping the job"

    def _connect_line(self, reporting: List[Node], now: float) -> str:
        waited = now - max(self._silent_since(n) for n in reporting)
        names = ", ".join(n.name for n in reporting)
        return ("%s waited %.1f s in mx.kv.create for the job's other nodes to register "
                "with the scheduler (one cannot reach it: a firewall or the wrong network "
                "interface, or a node never started; --connect-timeout sets the wait); "
                "stopping the job" % (names, waited))

    def _silent_line(self, reporting: List[Node], now: float) -> str:
        silent = now - max(self._silent_since(n) for n in reporting)
        suspects = [n for n in self.nodes if n.returncode is None
                    and self._states.get(n.name) in (STOPPED, UNINTERRUPTIBLE)]
        busy = [n for n in reporting if self._busy(n.name)]
        if suspects:
            node = suspects[0]
            why = "its process is %s and no worker reports progress" % (
                "stopped (state T)" if self._states[node.name] == STOPPED
                else "in uninterruptible sleep (state D)")
        elif busy:
            node = busy[0]
            why = "no worker reports progress, and it kept a CPU busy"
        else:
            node = min(reporting, key=lambda n: n.last_report_at)
            why = "no worker reports progress, its report is the oldest"
        line = "%s made no progress for %.1f s: %s" % (node.name, silent, why)
        if node.role == "worker":
            line += " (%s)" % last_did(node, now)
        return line + "; stopping the job"

    def _busy(self, name: str) -> bool:
        """Whether the node used at least BUSY_SHARE of a CPU over the samples
        of the last stall timeout (which must span most of it)."""
        history = self._cpu.get(name, [])
        if len(history) < 2 or history[-1][0] - history[0][0] < 0.8 * self.stall_timeout:
            return False
        (t0, c0), (t1, c1) = history[0], history[-1]
        return c1 - c0 >= BUSY_SHARE * (t1 - t0)
