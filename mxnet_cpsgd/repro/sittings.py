"""A run's sittings: the parts of one run that went on from checkpoints.

A run writes ``run.json`` with ``status: "running"`` (its process and host) when
a sitting starts, and its outcome when the sitting ends.  A sitting whose
process was killed (SIGKILL, the machine went down, the out-of-memory killer)
never writes its end: the next sitting finds ``running`` with a process that is
gone, resumes from the newest complete checkpoint like after a failure, and
records the killed sitting with the time its output was last written as its end.
A ``running`` run whose process is alive on this host is another reproduction
at work on it: it is left alone.  One marked ``running`` on another host is taken
over with a warning (the files were moved, or that host went down).
"""
import datetime
import os
import re
import shutil
import socket
import time
from typing import Dict, List, Optional

from .spec import CHECKPOINTS_DIR

RUNNING = "running"

_SITTING_KEYS = ("started", "finished", "wall_time", "code", "allow_dirty", "status",
                 "failure")


def _iso(unix_time: float) -> str:
    return datetime.datetime.fromtimestamp(unix_time).astimezone().isoformat(
        timespec="seconds")


def checkpoint_iteration(path: Optional[str]) -> Optional[int]:
    """The iteration of a checkpoint directory ``.../iter-000000400`` (None: none)."""
    match = re.search(r"iter-(\d+)$", path or "")
    return int(match.group(1)) if match else None


def running_fields(previous: Optional[Dict[str, object]],
                   earlier: List[Dict[str, object]], started: str) -> Dict[str, object]:
    """What ``run.json`` holds while a sitting runs, besides the run's own keys
    (``earlier``: :func:`earlier_sittings`, read before this sitting wrote anything)."""
    return {"status": RUNNING, "pid": os.getpid(), "host": socket.gethostname(),
            "sitting_started": started, "sitting_started_unix": time.time(),
            "resumed_from_iteration": checkpoint_iteration(
                previous.get("checkpoint")) if previous else None,
            "sittings": earlier, "started": earlier[0]["started"] if earlier else started}


def held_elsewhere(meta: Optional[Dict[str, object]]) -> Optional[str]:
    """Why a run must be left alone: its ``run.json`` says ``running`` and that
    process is alive on this host; None otherwise."""
    if not meta or meta.get("status") != RUNNING or meta.get("host") != socket.gethostname():
        return None
    pid = meta.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and _alive(pid):
        return "process %d on this host is running it (since %s)" % (
            pid, meta.get("sitting_started"))
    return None


def taken_over(meta: Optional[Dict[str, object]]) -> Optional[str]:
    """A warning when a run marked ``running`` on another host is taken over (its
    files were moved here, or that host went down; whether its process still runs
    there cannot be checked from here)."""
    if not meta or meta.get("status") != RUNNING or meta.get("host") == socket.gethostname():
        return None
    return ("run.json says it was running on host %s (pid %s, since %s); taking it over "
            "(if it still runs there, stop one of the two)" % (
                meta.get("host"), meta.get("pid"), meta.get("sitting_started")))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def killed_sitting(meta: Dict[str, object], run_dir: str) -> Dict[str, object]:
    """The sitting a ``running`` run.json describes, whose process is gone: it
    ended when its output was last written."""
    started_unix = meta.get("sitting_started_unix")
    try:
        last = os.path.getmtime(os.path.join(run_dir, "output.log"))
    except OSError:
        last = None
    wall = None
    if isinstance(started_unix, (int, float)) and last is not None and last >= started_unix:
        wall = round(last - started_unix, 2)
    return {"started": meta.get("sitting_started"),
            "finished": _iso(last) if last is not None else None,
            "wall_time": wall, "code": meta.get("code"),
            "allow_dirty": meta.get("allow_dirty"), "status": "killed",
            "failure": "its process (pid %s on %s) ended without recording the sitting's "
                       "end; finished = when its output was last written"
                       % (meta.get("pid"), meta.get("host")),
            "resumed_from_iteration": meta.get("resumed_from_iteration")}


def earlier_sittings(previous: Optional[Dict[str, object]],
                     run_dir: str) -> List[Dict[str, object]]:
    """The sittings before this one: those ``previous`` (the run.json this sitting
    resumes from) lists, and the killed one it describes if it says ``running``.

    Call it before this sitting appends to ``output.log``: a killed sitting's end
    is read off that file's modification time."""
    if not previous:
        return []
    sittings = [dict(s) for s in previous.get("sittings") or []]
    if previous.get("status") == RUNNING:
        sittings.append(killed_sitting(previous, run_dir))
    return sittings


def record_sitting(meta: Dict[str, object], previous: Optional[Dict[str, object]],
                   earlier: List[Dict[str, object]], run_dir: str) -> None:
    """Add this sitting to ``meta["sittings"]`` after ``earlier`` (what
    :func:`earlier_sittings` said when this sitting started); the run's
    ``started`` and ``wall_time`` become the first sitting's and the sum of those
    known (``wall_time_incomplete`` when a killed sitting's is not)."""
    sitting = {key: meta.get(key) for key in _SITTING_KEYS}
    sitting["resumed_from_iteration"] = checkpoint_iteration(
        previous["checkpoint"]) if previous else None
    sittings = [dict(s) for s in earlier]
    sittings.append(sitting)
    meta["sittings"] = sittings
    meta["started"] = sittings[0]["started"]
    meta["wall_time"] = round(sum(s.get("wall_time") or 0.0 for s in sittings), 2)
    if any(s.get("wall_time") is None for s in sittings):
        meta["wall_time_incomplete"] = True
    if meta["status"] == "ok":
        shutil.rmtree(os.path.join(run_dir, CHECKPOINTS_DIR), ignore_errors=True)
