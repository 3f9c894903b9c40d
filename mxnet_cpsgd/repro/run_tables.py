"""The report's account of what ran: the experiments table (each experiment's
flags, the runs that exist and those its spec plans that do not) and the list
of runs (status, seed, wall time, epochs, the code of each sitting, runs still
in progress, earlier failed attempts, the worker commands).  :mod:`.report`
puts them at the head and the end of the report.
"""
import os
from typing import Dict, List, Optional, Sequence

from .logs import ATTEMPTS_DIR, Run, read_run
from .markdown import md_table
from .spec import split_run_id
from .summary import epoch_series


def _seed_ranges(seeds: Sequence[object]) -> str:
    """``[1, 2, 3, 5]`` -> ``'1-3, 5'`` (other seeds as they are)."""
    ints = sorted(s for s in seeds if isinstance(s, int))
    parts, i = [], 0
    while i < len(ints):
        j = i
        while j + 1 < len(ints) and ints[j + 1] == ints[j] + 1:
            j += 1
        parts.append(str(ints[i]) if i == j else "%d-%d" % (ints[i], ints[j]))
        i = j + 1
    return ", ".join(parts + [str(s) for s in seeds if not isinstance(s, int)])


def _by_setting(items) -> str:
    """``[(label-M<m>-<network>, seed)]`` -> ``'SSGD-M2: 1-5; k5-M2: 1-3'``, first-seen order."""
    grouped: Dict[str, List[object]] = {}
    for key, seed in items:
        grouped.setdefault(key, []).append(seed)
    return "; ".join("%s: %s" % (k, _seed_ranges(v)) for k, v in grouped.items())


def experiments_section(meta: Dict[str, object], runs: Sequence[Run]) -> List[str]:
    """The experiments table: each experiment's flags, then the runs that exist (a
    directory with a ``run.json``, whatever its status: see the list of runs) and the
    runs its spec plans that do not, by label, M and network, with their seeds."""
    planned = [str(r) for r in meta.get("runs") or []]
    rows = []
    for e in meta["experiments"]:
        name = e.get("name")
        mine = [r for r in runs if r.experiment == name]
        have = {str(r.meta.get("run_id")) for r in mine}
        exist = [("%s-M%d-%s" % (r.label, r.num_workers, r.rate or "loopback"),
                  r.meta.get("seed")) for r in mine]
        missing = []
        for run_id in planned:
            experiment, stem, seed = split_run_id(run_id)
            if experiment == name and run_id not in have:
                missing.append((stem, seed))
        rows.append([name, "`%s`" % " ".join(e.get("args") or []) if e.get("args") else "",
                     _by_setting(exist) or "none", _by_setting(missing) or "none"])
    return [md_table(["experiment", "its flags", "runs that exist (label-M-network: seeds)",
                      "in the spec, not run"], rows, ["l"] * 4), ""]


def code_text(code: Optional[Dict[str, object]]) -> str:
    """``run.json``'s ``code`` as a short commit, ``+dirty`` when the tree had
    uncommitted changes; ``n/a`` for runs that did not record it."""
    if not code or not code.get("commit"):
        return "n/a"
    return str(code["commit"])[:10] + ("+dirty" if code.get("dirty") else "")


def sittings_code_text(meta: Dict[str, object]) -> str:
    """The code of every sitting of a resumable run (distinct, in order), else
    the run's :func:`code_text`."""
    texts = []
    for sitting in meta.get("sittings") or [meta]:
        text = code_text(sitting.get("code"))
        if text not in texts:
            texts.append(text)
    return " + ".join(texts)


#: stores that push through MXNet's 2-bit compression, whose residual lives inside
#: MXNet and is not saved: a resumed run of these starts it again from zero
#: (tests/test_report.py checks this list against the stores' own definitions)
TWO_BIT_STORES = ("bitsgd", "cpsgd")


def sittings_note(meta: Dict[str, object]) -> str:
    """``"3 sittings, resumed at iterations 400, 820"`` for a run that went on
    from checkpoints, with a note when MXNet's 2-bit residual restarted at zero
    on resuming; empty for a run of one sitting."""
    sittings = meta.get("sittings") or []
    if len(sittings) < 2:
        return ""
    note = "%d sittings, resumed at iteration%s %s" % (
        len(sittings), "s" if len(sittings) > 2 else "",
        ", ".join(str(s.get("resumed_from_iteration")) for s in sittings[1:]))
    if str(meta.get("algorithm", "")).lower() in TWO_BIT_STORES:
        note += " (MXNet's 2-bit residual restarted at zero there: it is not saved)"
    return note


def wall_text(meta: Dict[str, object]) -> str:
    """The run's wall time in seconds; ``">= N"`` when a killed sitting's own is
    unknown (N: the sum of the sittings' known times)."""
    wall = meta.get("wall_time")
    if not isinstance(wall, (int, float)):
        return "n/a"
    return (">= %.0f" if meta.get("wall_time_incomplete") else "%.0f") % wall


def in_progress(run: Run) -> bool:
    """A run that has not finished and goes on: one running now (or whose sitting was
    killed: ``running`` in run.json), or one that went on over sittings and stopped
    (it resumes from its checkpoint with the same command)."""
    return run.status == "running" or (bool(run.meta.get("sittings")) and run.status != "ok")


def runs_section(runs: Sequence[Run]) -> List[str]:
    md = ["## Runs", ""]
    rows = []
    for r in runs:
        rows.append([r.meta.get("run_id"), r.status, r.label, r.num_workers,
                     r.rate or "loopback", r.meta.get("seed", "n/a"), wall_text(r.meta),
                     sum(1 for _ in epoch_series(r)), sittings_code_text(r.meta),
                     "; ".join(t for t in (sittings_note(r.meta), (
                         r.meta.get("failure") or "").replace("|", "/")[:120]) if t)])
    md += [md_table(["run", "status", "label", "M", "network", "seed", "wall (s)", "epochs",
                     "code", "note"], rows, ["l"] * 3 + ["r"] * 5 + ["l", "l"]), ""]
    going = [r for r in runs if in_progress(r)]
    if going:
        md += ["In progress (running, or resumable from their newest checkpoint with the "
               "same command; left out of every table and figure above): " + "; ".join(
                   "%s, %d of %s epochs logged" % (
                       r.meta.get("run_id"), len(epoch_series(r)),
                       r.meta.get("expected_epochs") or "?") for r in going) + ".", ""]
    attempts = [(r, a) for r in runs for a in r.attempts]
    if attempts:
        md += ["Earlier failed attempts (files kept in `<run>/attempts/<n>/`; the run "
               "was started again from scratch):", ""]
        md += [md_table(["run", "attempt", "wall (s)", "epochs logged", "failure"],
                        [[r.meta.get("run_id"), a["attempt"],
                          "%.0f" % a["wall_time"] if isinstance(a.get("wall_time"),
                                                                (int, float)) else "n/a",
                          len(epoch_series(read_run(os.path.join(
                              r.path, ATTEMPTS_DIR, a["attempt"])))),
                          (a.get("failure") or "").replace("|", "/")[:160]]
                         for r, a in attempts], ["l", "r", "r", "r", "l"]), ""]
    cmds = [(r.meta.get("run_id"), r.meta.get("command_text")) for r in runs
            if r.meta.get("command_text")]
    if cmds:
        md += ["<details><summary>Worker command of each run</summary>", ""]
        for run_id, cmd in cmds:
            md += ["- `%s`: `%s`" % (run_id, cmd)]
        md += ["", "</details>", ""]
    return md
