"""Run a grid of training jobs from an experiment spec and write its report.

Usage::

    cpsgd-reproduce SPEC [-o OUT] [--only LABEL ...] [--experiment NAME ...]
                    [--force] [--dry-run] [--report-only]
                    [--if-no-emulation {fail,skip,unshaped}] [--allow-dirty]
    python -m mxnet_cpsgd.repro.runner ...

A spec (YAML or JSON; see specs/ and docs/reproduce.md) names the training
script, the flags every run shares, and a grid: runs (label + algorithm + knobs,
a knob may list several values) x workers x network rates x seeds, optionally in
several experiments that override any of these.  Each run is one job started by
:func:`mxnet_cpsgd.cluster.launch.run_job` (inside an emulated network of the given
rate when there is one), writing its per-epoch JSON logs into
``OUT/runs/<experiment>/<run>/``.  A run whose logs are complete and whose
command is unchanged is skipped, so an interrupted reproduction continues
where it stopped; a run of an experiment with ``checkpoint_every`` resumes
from its newest complete checkpoint (one run over several sittings).  Finally
:func:`mxnet_cpsgd.repro.report.generate` writes ``OUT/report.md`` and its PNGs
from the logs alone.  The spec format and its expansion are :mod:`.spec`.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import sys
import time
from typing import Dict, Optional, Sequence

from . import bench_runs, emulated_hosts, logs, markdown, sittings, summary
from . import report as report_mod
from .spec import (CHECKPOINTS_DIR, RunPlan, SpecError, _merge_args, args_to_argv, expand,
                   expand_bench_plans, load_spec, select, select_bench)
# also part of cpsgd-reproduce's API as this module's (tests, scripts)
from .spec import PROJECT_ROOT, resolve_script, split_run_id, validate_spec  # noqa: F401
from .gitstate import DirtyTreeError, code_version, refuse_dirty_tree

def logs_complete(plan: RunPlan, run_dir: str) -> bool:
    """Every rank 0..M-1 left a log whose epochs are 0..E-1 (E = --num-epochs;
    with --max-iters, or without --num-epochs, at least one epoch)."""
    run = logs.read_run(run_dir)
    if sorted(run.records) != list(range(plan.num_workers)):
        return False
    expected = plan.expected_epochs()
    for lines in run.records.values():
        epochs = sorted({int(r["epoch"]) for r in lines})
        if not epochs:
            return False
        if expected is not None and epochs != list(range(expected)):
            return False
    return True


def run_is_complete(plan: RunPlan, run_dir: str) -> bool:
    """The run finished before with the same command (a successful ``run.json``
    with this plan's fingerprint) and its logs are complete."""
    meta_path = os.path.join(run_dir, logs.RUN_META)
    if not os.path.isfile(meta_path):
        return False
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except ValueError:
        return False
    if meta.get("status") != "ok" or meta.get("fingerprint") != plan.fingerprint():
        return False
    return logs_complete(plan, run_dir)


def _clear_logs(run_dir: str) -> None:
    """Remove a previous attempt's files; a failed attempt's files are kept under
    ``attempts/<n>/`` (the report lists them)."""
    names = [n for n in os.listdir(run_dir)
             if logs.LOG_RE.match(n) or logs.VAL_LOG_RE.match(n)
             or n in (logs.RUN_META, "output.log")]
    failed = False
    meta_path = os.path.join(run_dir, logs.RUN_META)
    if os.path.isfile(meta_path):
        try:
            with open(meta_path) as f:
                failed = json.load(f).get("status") == "failed"
        except ValueError:
            failed = False
    if failed:
        n = 1
        while os.path.exists(os.path.join(run_dir, logs.ATTEMPTS_DIR, str(n))):
            n += 1
        keep = os.path.join(run_dir, logs.ATTEMPTS_DIR, str(n))
        os.makedirs(keep)
        for name in names:
            os.replace(os.path.join(run_dir, name), os.path.join(keep, name))
        return
    for name in names:
        os.remove(os.path.join(run_dir, name))


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def run_meta(plan: RunPlan, **extra) -> Dict[str, object]:
    """A run's ``run.json``; pass ``code`` (:func:`code_version` when the run
    started), else it is taken now."""
    meta = {"run_id": plan.run_id, "order": plan.order, "experiment": plan.experiment,
            "label": plan.label, "algorithm": plan.algorithm,
            "num_workers": plan.num_workers, "num_servers": plan.num_servers,
            "rate": plan.rate, "placement": plan.placement, "seed": plan.seed,
            "knobs": plan.knobs,
            "args": plan.args, "env": plan.env, "fingerprint": plan.fingerprint(),
            "command_text": plan.command_text(), "launch_text": plan.launch_text(),
            "expected_epochs": plan.expected_epochs()}
    meta.update(extra)
    if meta.get("code") is None:
        meta["code"] = code_version()
    return meta


def emulation_problem() -> Optional[str]:
    """Why network emulation cannot run here (None when it can)."""
    from ..cluster import netem
    try:
        netem.check_available()
    except netem.NetemError as err:
        return str(err)
    return None


def _read_meta(run_dir: str) -> Optional[Dict[str, object]]:
    try:
        with open(os.path.join(run_dir, logs.RUN_META)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def resume_point(plan: RunPlan, run_dir: str) -> Optional[Dict[str, object]]:
    """Where a resumable run goes on from: the ``run.json`` of its earlier
    sitting(s) with ``checkpoint`` (the newest complete checkpoint's directory)
    added, or None when it starts afresh (no ``checkpoint_every``, no earlier
    sitting that stopped, another command, or no complete checkpoint)."""
    if not plan.checkpoint_every:
        return None
    meta = _read_meta(run_dir)
    # "running" with its process gone: a sitting that was killed before it could
    # record its end (the caller has left alone a run whose process is alive)
    if (meta is None or meta.get("status") not in ("failed", sittings.RUNNING)
            or meta.get("fingerprint") != plan.fingerprint()):
        return None
    from ..training.checkpoint import newest_complete
    path = newest_complete(os.path.join(run_dir, CHECKPOINTS_DIR))
    if path is None:
        return None
    meta["checkpoint"] = path
    return meta


def execute(plan: RunPlan, out: str, python: str, if_no_emulation: str = "fail",
            emulation_error: Optional[str] = None, echo=None,
            resume_from: Optional[Dict[str, object]] = None,
            allow_dirty: bool = False) -> Dict[str, object]:
    """Run one job and write its ``run.json``; returns that metadata.

    Args:
        plan: the run.
        out: the reproduction's output directory.
        python: the interpreter of the workers.
        if_no_emulation: with a rate but no emulation: 'fail' the run, 'skip' it,
            or run it 'unshaped' (``actual_rate`` in run.json is then None).
        emulation_error: why emulation is unavailable (None: available).
        echo: a stream for the job's output lines as they come (None: only the file).
        resume_from: what :func:`resume_point` found for this run: go on from its
            checkpoint; None starts the run from the beginning.
        allow_dirty: recorded in ``run.json``: the user let runs start from a tree
            with uncommitted changes (``--allow-dirty``).

    A resumable run (``plan.checkpoint_every``) whose earlier sitting stopped
    goes on from its newest complete checkpoint, appending to its logs; its
    ``run.json`` lists every sitting (``sittings``: start, end, wall time, code,
    the iteration it resumed from, outcome) and ``wall_time`` is their sum.  Its
    checkpoints are removed once it is complete.
    """
    from ..cluster import launch
    run_dir = plan.directory(out)
    os.makedirs(run_dir, exist_ok=True)
    # the code of this run is the code when it starts (later commits do not run in it)
    code = code_version(exclude=out)
    if resume_from is None:
        _clear_logs(run_dir)
        shutil.rmtree(os.path.join(run_dir, CHECKPOINTS_DIR), ignore_errors=True)
    rate = plan.rate
    if rate and emulation_error:
        if if_no_emulation in ("fail", "skip"):
            meta = run_meta(plan, code=code, allow_dirty=allow_dirty,
                            status="failed" if if_no_emulation == "fail" else "skipped",
                            returncode=None, wall_time=0.0, started=_now(), finished=_now(),
                            failure="network emulation unavailable: %s" % emulation_error)
            logs.write_json(os.path.join(run_dir, logs.RUN_META), meta)
            return meta
        rate = None
    started, t0 = _now(), time.monotonic()
    # before this sitting appends to output.log: a killed sitting's end is that
    # file's last write
    earlier = sittings.earlier_sittings(resume_from, run_dir)
    # while it runs: so that a sitting killed before it can write its end is
    # resumed (and not started afresh), and another reproduction leaves it alone
    logs.write_json(os.path.join(run_dir, logs.RUN_META), run_meta(
        plan, code=code, allow_dirty=allow_dirty, actual_rate=rate,
        **sittings.running_fields(resume_from, earlier, started)))
    with open(os.path.join(run_dir, "output.log"), "a" if resume_from else "w") as log:
        if resume_from:
            log.write("cpsgd-reproduce: %s: resuming from %s\n"
                      % (started, resume_from["checkpoint"]))
        stream = _Tee(log, echo)
        try:
            result = launch.run_job(plan.argv(python, run_dir, resume=bool(resume_from)),
                                    plan.num_workers,
                                    plan.num_servers, env=plan.env, timeout=plan.timeout,
                                    job_timeout=plan.job_timeout,
                                    emulate_network=emulated_hosts.job_network(rate, plan.args),
                                    stream=stream, allreduce=plan.allreduce,
                                    placement=plan.placement)
            returncode, failure = result.returncode, result.failure
        except Exception as err:  # launcher refused (bad input, emulation broke)
            returncode, failure = None, "%s: %s" % (type(err).__name__, err)
            log.write("cpsgd-reproduce: %s\n" % failure)
    ok = returncode == 0
    meta = run_meta(plan, code=code, allow_dirty=allow_dirty,
                    status="ok" if ok else "failed", returncode=returncode,
                    failure=failure, wall_time=round(time.monotonic() - t0, 2),
                    started=started, finished=_now(), actual_rate=rate)
    if ok and not logs_complete(plan, run_dir):
        meta["status"] = "failed"
        meta["failure"] = "the job succeeded but its logs are incomplete"
    if failure and failure.startswith("received SIG"):
        meta["interrupted"] = True
    if plan.checkpoint_every:
        sittings.record_sitting(meta, resume_from, earlier, run_dir)
    logs.write_json(os.path.join(run_dir, logs.RUN_META), meta)
    return meta


class _Tee:
    """A text stream writing to a file and optionally another stream."""

    def __init__(self, first, second=None):
        self.first, self.second = first, second

    def write(self, text: str) -> int:
        self.first.write(text)
        if self.second is not None:
            self.second.write(text)
        return len(text)

    def flush(self) -> None:
        self.first.flush()
        if self.second is not None:
            self.second.flush()


def environment_info() -> Dict[str, object]:
    info = {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(terse=True)}
    try:
        import mxnet
        info["mxnet"] = mxnet.__version__
    except Exception:  # pragma: no cover
        pass
    return info


def write_reproduce_meta(out: str, spec: Dict[str, object], spec_path: Optional[str],
                         command: str, plans: Sequence[RunPlan]) -> None:
    common = args_to_argv(_merge_args(spec.get("args")))
    experiments = []
    bench_plans = expand_bench_plans(spec)
    for exp in spec.get("experiments") or [{}]:
        name = exp.get("name", "main")
        if bench_runs.is_bench(exp):
            experiments.append(bench_runs.experiment_meta(exp, bench_plans))
            continue
        ps = [p for p in plans if p.experiment == name]
        experiments.append({
            "name": name, "args": args_to_argv(_merge_args(exp.get("args"))),
            "workers": sorted({p.num_workers for p in ps}),
            "rates": list(dict.fromkeys(p.rate or "loopback" for p in ps)),
            "seeds": sorted({p.seed for p in ps}),
            "labels": list(dict.fromkeys(p.label for p in ps)),
            "env": ps[0].env if ps else {},
            "purpose": exp.get("purpose", "both"),
            "equivalence_min_seeds": exp.get("equivalence_min_seeds")})
    meta = {"experiments": experiments, "name": spec.get("name"), "title": spec.get("title"),
            "description": spec.get("description"), "notes": spec.get("notes"),
            "spec_path": spec_path, "command": command, "script": spec.get("script"),
            "bench_invocations": [p.invocation_id for p in bench_plans],
            "common_args": common, "environment": environment_info(),
            "reference_te_tc": spec.get("reference_te_tc"), "written": _now(),
            "figures": spec.get("figures"), "comparisons": spec.get("comparisons"),
            "equivalence_margin": spec.get("equivalence_margin"),
            "equivalence_min_seeds": spec.get("equivalence_min_seeds"),
            "time_to_accuracy": spec.get("time_to_accuracy"),
            "measured_time_to_accuracy": spec.get("measured_time_to_accuracy"),
            "runs": [p.run_id for p in plans]}
    os.makedirs(out, exist_ok=True)
    logs.write_json(os.path.join(out, logs.REPRODUCE_META), meta)
    logs.write_json(os.path.join(out, "spec.json"), spec)


def reproduce(spec: Dict[str, object], out: str, spec_path: Optional[str] = None,
              command: Optional[str] = None, only: Sequence[str] = (),
              experiments: Sequence[str] = (), force: bool = False,
              if_no_emulation: str = "fail", python: Optional[str] = None,
              echo=None, progress=sys.stdout, report: bool = True,
              allow_dirty: bool = False) -> int:
    """Run every incomplete run of the spec, then write the report.

    Raises :class:`DirtyTreeError`, before anything is written, when a run would
    start from code with uncommitted changes and ``allow_dirty`` is not set.

    Returns:
        0 when every selected run is complete (or skipped by ``if_no_emulation``),
        1 when one failed.
    """
    plans = expand(spec)
    chosen = select(plans, only, experiments)
    chosen_bench = select_bench(expand_bench_plans(spec), only, experiments)
    if not chosen and not chosen_bench:
        raise SpecError("no run matches --only/--experiment")
    python = python or sys.executable
    command = command or "cpsgd-reproduce %s -o %s" % (spec_path or "SPEC", out)
    if not allow_dirty:
        refuse_dirty_tree(
            [p.run_id for p in chosen if force or not run_is_complete(p, p.directory(out))]
            + [p.invocation_id for p in chosen_bench
               if force or not bench_runs.is_complete(p, out)], out)
    write_reproduce_meta(out, spec, spec_path, command, plans)
    need_emulation = any(p.rate for p in chosen)
    emulation_error = emulation_problem() if need_emulation else None
    if emulation_error:
        _say(progress, "network emulation unavailable (%s); runs with a rate: %s"
             % (emulation_error, if_no_emulation))
    failed = 0
    for i, plan in enumerate(chosen, 1):
        run_dir = plan.directory(out)
        if not force and run_is_complete(plan, run_dir):
            _say(progress, "[%d/%d] %s: complete, skipped" % (i, len(chosen), plan.run_id))
            continue
        _say(progress, "[%d/%d] %s: %s" % (i, len(chosen), plan.run_id, plan.launch_text()))
        earlier = _read_meta(run_dir)
        busy = None if force else sittings.held_elsewhere(earlier)
        if busy:
            _say(progress, "[%d/%d] %s: skipped: %s" % (i, len(chosen), plan.run_id, busy))
            failed += 1
            continue
        warning = sittings.taken_over(earlier)
        if warning:
            _say(progress, "[%d/%d] %s: %s" % (i, len(chosen), plan.run_id, warning))
        point = None if force else resume_point(plan, run_dir)
        if point is not None:
            _say(progress, "[%d/%d] %s: resuming from %s" % (i, len(chosen), plan.run_id,
                                                             point["checkpoint"]))
        meta = execute(plan, out, python, if_no_emulation, emulation_error, echo,
                       resume_from=point, allow_dirty=allow_dirty)
        brief = ""
        if meta["status"] == "ok":
            s = summary.summarize_run(logs.read_run(run_dir))
            brief = " final val acc %s, Te %s s, Tc %s s" % (
                markdown.fmt_pct(s.final_val_acc), markdown.fmt_num(s.te),
                markdown.fmt_num(s.tc))
        else:
            failed += meta["status"] == "failed"
        if meta.get("interrupted"):
            _say(progress, "interrupted; rerun the same command to continue")
            return 130
        _say(progress, "[%d/%d] %s: %s in %.0f s%s%s" % (
            i, len(chosen), plan.run_id, meta["status"], meta.get("wall_time") or 0,
            brief, (" (%s)" % meta["failure"]) if meta.get("failure") else ""))
    try:
        failed += bench_runs.run_all(chosen_bench, out, python, force,
                                     lambda text: _say(progress, text), _now, echo)
    except KeyboardInterrupt:
        _say(progress, "interrupted; rerun the same command to continue")
        return 130
    if report:
        rep = report_mod.generate(out, name=spec.get("report_name") or "report.md")
        _say(progress, "report: %s" % rep.markdown_path)
    return 1 if failed else 0


def _say(stream, text: str) -> None:
    if stream is not None:
        stream.write("cpsgd-reproduce: %s\n" % text)
        stream.flush()


# ----------------------------------------------------------------------------
# command line

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cpsgd-reproduce",
        description="Run the grid of an experiment spec (each run a ps-lite job on this "
                    "machine) and write a Markdown report of its logs.")
    p.add_argument("spec", nargs="?", help="YAML or JSON spec (see specs/); optional "
                   "with --report-only")
    p.add_argument("-o", "--out", default=None,
                   help="output directory (default runs/<spec name>)")
    p.add_argument("--only", nargs="+", default=[], metavar="LABEL",
                   help="run only these labels or run ids (shell patterns; default: "
                        "every run)")
    p.add_argument("--experiment", nargs="+", default=[], metavar="NAME",
                   help="run only these experiments of the spec (default: all of them)")
    p.add_argument("--force", action="store_true",
                   help="rerun selected runs from the beginning even if their logs "
                        "are complete or they could resume from a checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="print the launcher command of every run and exit")
    p.add_argument("--report-only", action="store_true",
                   help="do not run anything: regenerate the report from the logs in OUT")
    p.add_argument("--if-no-emulation", choices=("fail", "skip", "unshaped"), default="fail",
                   help="runs with a network rate when emulation is unavailable "
                        "(not root, no iproute2): fail them (default), skip them, or "
                        "run them on plain loopback")
    p.add_argument("--python", default=None,
                   help="interpreter of the workers (default: this one)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="start runs even when the code's git tree has uncommitted changes "
                        "(refused otherwise; run.json records allow_dirty)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="echo every node's output lines (always written to "
                        "OUT/runs/<run>/output.log)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console script ``cpsgd-reproduce``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    command = "cpsgd-reproduce " + " ".join(shlex.quote(a) for a in argv)
    try:
        spec = load_spec(args.spec) if args.spec else None
        if spec is None:
            if not (args.report_only and args.out):
                parser.error("a SPEC is needed (or --report-only with -o OUT)")
        out = args.out or os.path.join("runs", spec["name"])
        if args.report_only:
            if not os.path.isdir(out):
                parser.error("--report-only: no such directory %s" % out)
            if spec is not None:
                # keep the command that ran the experiments; refresh the rest
                old = logs.read_reproduce_meta(out)
                write_reproduce_meta(out, spec, args.spec, old.get("command") or command,
                                     expand(spec))
            name = (spec or {}).get("report_name") or "report.md"
            rep = report_mod.generate(out, name=name, command=command)
            print(rep.markdown_path)
            return 0
        plans = select(expand(spec), args.only, args.experiment)
        if args.dry_run:
            for p in plans:
                print("%s: %s" % (p.run_id, p.launch_text()))
            for p in select_bench(expand_bench_plans(spec), args.only, args.experiment):
                print("%s: %s" % (p.invocation_id, p.command_text()))
            return 0
        return reproduce(spec, out, args.spec, command, args.only, args.experiment,
                         args.force, args.if_no_emulation, args.python,
                         echo=sys.stdout if args.verbose else None,
                         allow_dirty=args.allow_dirty)
    except (SpecError, DirtyTreeError) as err:
        parser.error(str(err))
    except KeyboardInterrupt:
        print("cpsgd-reproduce: interrupted; rerun the same command to continue",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
