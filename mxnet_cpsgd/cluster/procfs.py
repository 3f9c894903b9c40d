"""What Linux's /proc says about the processes of this machine.

The launcher's stall detection (:mod:`.stall`), the emulated hosts
(:mod:`.hosts`) and the fault campaign's injector (``bench/fault_injector.py``)
read the same few files; they live here, in ``cluster/``, the lowest layer
that all of them may import (``bench/`` imports ``cluster/``, not the
reverse; ``kvstore_ext`` is for MXNet's internals and the workers' side).

Any process may exit between being listed and being read, so every reader
returns "unknown" (None, an empty list or mapping) for a process that is gone
or cannot be read, never raises.  The remote nodes' watchdog
(:mod:`.watchdog`) reads /proc on its own: it runs on another host with the
standard library only.
"""
import os
from typing import Dict, List, NamedTuple, Optional

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class Stat(NamedTuple):
    """The fields of ``/proc/PID/stat`` that the project uses."""
    state: str     # R running, S sleeping, D uninterruptible, T stopped, Z zombie, ...
    ppid: int
    cpu_s: float   # user + system CPU time, seconds


def pids() -> List[int]:
    """Every process id in /proc (this pid namespace's view)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat_fields(pid: int) -> Optional[List[str]]:
    # the fields after the command name, which is in parentheses and may hold
    # spaces or ')' itself: split after the last ')'
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def stat(pid: int) -> Optional[Stat]:
    """State, parent and CPU time of ``pid`` from one read of its stat file."""
    fields = _stat_fields(pid)
    try:
        return Stat(fields[0], int(fields[1]),
                    (int(fields[11]) + int(fields[12])) / _TICKS_PER_S)
    except (TypeError, IndexError, ValueError):
        return None


def state(pid: int) -> Optional[str]:
    """The state letter of ``pid`` (``R``, ``S``, ``D``, ``T``, ``Z``, ...)."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def ppid(pid: int) -> Optional[int]:
    """The parent process id of ``pid``."""
    fields = _stat_fields(pid)
    try:
        return int(fields[1])
    except (TypeError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is no zombie."""
    return state(pid) not in (None, "Z")


def environ(pid: int) -> Dict[str, str]:
    """The environment ``pid`` was started with (what it gave to exec)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    items = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in items}


def cmdline(pid: int) -> List[str]:
    """The argument vector of ``pid`` (empty for a zombie or kernel thread)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [w.decode(errors="replace") for w in f.read().split(b"\0")[:-1]]
    except OSError:
        return []
