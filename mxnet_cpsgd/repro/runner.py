"""Run a grid of training jobs from an experiment spec and write its report.

Usage::

    cpsgd-reproduce SPEC [-o OUT] [--only LABEL ...] [--experiment NAME ...]
                    [--force] [--dry-run] [--report-only]
                    [--if-no-emulation {fail,skip,unshaped}]
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
from its newest complete checkpoint (one run over several sittings).  Finally :func:`mxnet_cpsgd.repro.report.generate` writes
``OUT/report.md`` and its PNGs from the logs alone.
"""
import argparse
import datetime
import fnmatch
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from . import bench_runs, logs, markdown, summary
from . import report as report_mod

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: keys of a run entry that are not knobs of the algorithm
RUN_KEYS = ("label", "algorithm", "args", "grid", "workers", "rates", "seeds", "env")
#: top-level / experiment keys
EXPERIMENT_KEYS = ("name", "purpose", "script", "args", "env", "workers", "rates", "seeds", "runs",
                   "labels", "num_servers", "job_timeout", "timeout", "description",
                   "checkpoint_every",
                   # kind: bench (mxnet_cpsgd/repro/bench_runs.py)
                   "kind", "bench_args", "sweep", "reference", "compare")
SPEC_KEYS = EXPERIMENT_KEYS + ("title", "experiments", "notes", "reference_te_tc",
                               "report_name", "figures", "comparisons")
#: what a figure of the spec's ``figures`` list draws (mxnet_cpsgd/repro/report.py)
FIGURE_KINDS = ("curves", "paired")
#: flags reproduce sets itself for every run
RESERVED_FLAGS = ("algorithm", "seed", "log-json", "log-csv", "checkpoint-dir",
                  "checkpoint-every", "resume")
#: a resumable run's checkpoints, under its directory (removed once it is complete)
CHECKPOINTS_DIR = "checkpoints"


class SpecError(ValueError):
    """A malformed experiment spec."""


# ----------------------------------------------------------------------------
# spec

def load_spec(path: str) -> Dict[str, object]:
    """Read a YAML (``.yaml``/``.yml``) or JSON spec file."""
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:  # pragma: no cover
            raise SpecError("reading %s needs PyYAML: pip install pyyaml" % path) from None
        spec = yaml.safe_load(text)
    else:
        spec = json.loads(text)
    if not isinstance(spec, dict):
        raise SpecError("%s: a spec is a mapping, got %s" % (path, type(spec).__name__))
    spec.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    validate_spec(spec)
    return spec


def validate_spec(spec: Dict[str, object]) -> None:
    """Check the keys and shapes of a spec; raises SpecError naming the problem."""
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise SpecError("unknown spec key(s): %s (known: %s)" % (
            ", ".join(unknown), ", ".join(SPEC_KEYS)))
    experiments = spec.get("experiments") or [{}]
    if not isinstance(experiments, list):
        raise SpecError("'experiments' must be a list")
    for exp in experiments:
        if isinstance(exp, dict) and exp.get("kind", "train") not in ("train", "bench"):
            raise SpecError("experiment %r: kind must be train (default) or bench"
                            % exp.get("name", "main"))
    if not spec.get("script") and any(isinstance(e, dict) and not bench_runs.is_bench(e)
                                      for e in experiments):
        raise SpecError("the spec needs 'script' (the training script)")
    names = set()
    for exp in experiments:
        if not isinstance(exp, dict):
            raise SpecError("each experiment must be a mapping")
        unknown = sorted(set(exp) - set(EXPERIMENT_KEYS))
        if unknown:
            raise SpecError("experiment %r: unknown key(s) %s" % (exp.get("name"),
                                                                 ", ".join(unknown)))
        name = exp.get("name", "main")
        if bench_runs.is_bench(exp):
            try:
                bench_runs.validate_bench_experiment(exp, spec)
            except bench_runs.BenchSpecError as err:
                raise SpecError(str(err)) from None
        if exp.get("purpose", "both") not in ("both", "accuracy", "timing"):
            raise SpecError("experiment %r: purpose must be both, accuracy or timing" % name)
        if name in names:
            raise SpecError("experiment name %r used twice" % name)
        every = exp.get("checkpoint_every", spec.get("checkpoint_every"))
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every < 1):
            raise SpecError("experiment %r: checkpoint_every must be a positive number "
                            "of iterations, got %r" % (name, every))
        names.add(name)
        runs = exp.get("runs", spec.get("runs"))
        if not runs or not isinstance(runs, list):
            raise SpecError("experiment %r has no 'runs' list" % name)
        for run in runs:
            if not isinstance(run, dict) or not run.get("algorithm"):
                raise SpecError("experiment %r: every run needs an 'algorithm'" % name)
            for key in ("args", "grid", "env"):
                if key in run and not isinstance(run[key], dict):
                    raise SpecError("run %r: %r must be a mapping" % (run.get("label"), key))
    for key in ("args", "env"):
        if key in spec and not isinstance(spec[key], dict):
            raise SpecError("%r must be a mapping" % key)
    validate_figures(spec.get("figures"), names)
    validate_comparisons(spec.get("comparisons"), names)


def validate_comparisons(comparisons, experiment_names) -> None:
    """``comparisons``: a list of ``{experiment, run, vs}``, two run labels of one
    experiment whose seed-paired difference the report shows."""
    if comparisons is None:
        return
    if not isinstance(comparisons, list):
        raise SpecError("'comparisons' must be a list")
    for c in comparisons:
        if not isinstance(c, dict) or set(c) != {"experiment", "run", "vs"}:
            raise SpecError("each comparison is a mapping with exactly the keys "
                            "experiment, run, vs; got %r" % (c,))
        if c["experiment"] not in experiment_names:
            raise SpecError("comparison %r: no experiment %r in the spec"
                            % (c, c["experiment"]))
        if not all(isinstance(c[k], str) and c[k] for k in ("run", "vs")) or \
                c["run"] == c["vs"]:
            raise SpecError("comparison %r: run and vs must be two different labels" % (c,))


def validate_figures(figures, experiment_names) -> None:
    """``figures``: a list of ``{name, kind: curves|paired, title?, ...}``; a curves
    figure has ``panels: [{experiment, labels, title?}]``, a paired one ``experiment``
    and ``labels``; labels are a list of run labels or one-key mappings
    ``{shown name: run label}``, or a mapping shown name -> run label."""
    if figures is None:
        return
    if not isinstance(figures, list):
        raise SpecError("'figures' must be a list")
    seen = set()
    for fig in figures:
        if not isinstance(fig, dict) or not fig.get("name"):
            raise SpecError("each figure must be a mapping with a 'name'")
        name = fig["name"]
        if name in seen:
            raise SpecError("figure name %r used twice" % name)
        seen.add(name)
        if fig.get("kind") not in FIGURE_KINDS:
            raise SpecError("figure %r: kind must be one of %s" % (name,
                                                                  ", ".join(FIGURE_KINDS)))
        parts = fig.get("panels") if fig["kind"] == "curves" else [fig]
        if not isinstance(parts, list) or not parts:
            raise SpecError("figure %r: 'panels' must be a non-empty list" % name)
        for part in parts:
            if not isinstance(part, dict):
                raise SpecError("figure %r: each panel must be a mapping" % name)
            if part.get("experiment") not in experiment_names:
                raise SpecError("figure %r: no experiment %r in the spec"
                                % (name, part.get("experiment")))
            labels = part.get("labels")
            if not labels or not isinstance(labels, (list, dict)):
                raise SpecError("figure %r: 'labels' must be a non-empty list or mapping"
                                % name)


def flag_name(key: str) -> str:
    """``'correction_period'`` / ``'--correction-period'`` -> ``'correction-period'``."""
    return str(key).lstrip("-").replace("_", "-")


def args_to_argv(args: Dict[str, object], expand_user: bool = False) -> List[str]:
    """``{'num-epochs': 3, 'synthetic': True, 'x': None}`` -> ``['--num-epochs', '3',
    '--synthetic']`` (False/None omitted), in the mapping's order; with
    ``expand_user`` a value starting with ``~`` becomes a home-directory path
    (no shell runs the command)."""
    argv = []
    for key, value in args.items():
        if value is None or value is False:
            continue
        argv.append("--" + flag_name(key))
        if value is not True:
            text = _text(value)
            if expand_user and text.startswith("~"):
                text = os.path.expanduser(text)
            argv.append(text)
    return argv


def _text(value) -> str:
    if isinstance(value, float) and value == int(value) and abs(value) < 1e15:
        return repr(value)
    return str(value)


def _merge_args(*layers: Optional[Dict[str, object]]) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for layer in layers:
        for k, v in (layer or {}).items():
            out[flag_name(k)] = v  # a later layer overrides, in the flag's first place
    return out


def _as_list(value, default) -> list:
    if value is None:
        return list(default)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _grid_points(grid: Dict[str, object]) -> List[Dict[str, object]]:
    points: List[Dict[str, object]] = [{}]
    for key, values in grid.items():
        values = _as_list(values, [])
        points = [dict(p, **{flag_name(key): v}) for p in points for v in values]
    return points


def _label(template: str, fields: Dict[str, object]) -> str:
    try:
        return str(template).format(**fields)
    except (KeyError, IndexError, ValueError) as err:
        raise SpecError("label %r: cannot fill in %s (available: %s)" % (
            template, err, ", ".join(sorted(fields)))) from None


@dataclass
class RunPlan:
    """One run of the grid."""
    order: int
    experiment: str
    label: str
    algorithm: str
    num_workers: int
    num_servers: int
    rate: Optional[str]
    seed: int
    args: Dict[str, object]          # every flag but algorithm/seed/logs
    env: Dict[str, str]
    script: str
    job_timeout: Optional[float]
    timeout: float
    knobs: Dict[str, object] = field(default_factory=dict)
    #: iterations between checkpoints; set, the run resumes after an interruption
    checkpoint_every: Optional[int] = None

    @property
    def run_id(self) -> str:
        return "%s/%s-M%d-%s-s%d" % (_slug(self.experiment), _slug(self.label),
                                     self.num_workers, _slug(self.rate or "loopback"),
                                     self.seed)

    def directory(self, out: str) -> str:
        return os.path.join(out, "runs", self.run_id)

    def expected_epochs(self) -> Optional[int]:
        """Epochs a complete run logs (None when --max-iters may cut it short)."""
        if self.args.get("max-iters") not in (None, False):
            return None
        epochs = self.args.get("num-epochs")
        return int(epochs) if epochs is not None else None

    def _checkpoint_argv(self, run_dir: str) -> List[str]:
        if not self.checkpoint_every:
            return []
        return ["--checkpoint-dir", os.path.join(run_dir, CHECKPOINTS_DIR),
                "--checkpoint-every", str(self.checkpoint_every)]

    def argv(self, python: str, run_dir: str, resume: bool = False) -> List[str]:
        """The worker command (script path resolved); ``resume``: go on from the
        newest complete checkpoint."""
        return [python, resolve_script(self.script), "--algorithm", self.algorithm,
                "--seed", str(self.seed)] + args_to_argv(self.args, expand_user=True) + \
            ["--log-json", os.path.join(run_dir, "log.json")] + \
            self._checkpoint_argv(run_dir) + (["--resume"] if resume else [])

    def command_text(self) -> str:
        """The worker command as a user would type it (relative paths)."""
        run_dir = os.path.join("runs", self.run_id)
        return " ".join(shlex.quote(a) for a in
                        ["python", self.script, "--algorithm", self.algorithm, "--seed",
                         str(self.seed)] + args_to_argv(self.args) +
                        ["--log-json", os.path.join(run_dir, "log.json")] +
                        self._checkpoint_argv(run_dir))

    @property
    def allreduce(self) -> bool:
        """A Horovod/Gloo job (no scheduler or servers) rather than a ps-lite job."""
        from ..training.options import HOROVOD_STORES
        return self.algorithm in HOROVOD_STORES

    def launch_text(self) -> str:
        if self.allreduce and not self.rate:
            env = " ".join("-x %s=%s" % kv for kv in sorted(self.env.items()))
            return "horovodrun -np %d -H localhost:%d --gloo%s %s" % (
                self.num_workers, self.num_workers, (" " + env) if env else "",
                self.command_text())
        net = " --emulate-network %s" % self.rate if self.rate else ""
        env = " ".join("%s=%s" % kv for kv in sorted(self.env.items()))
        return "python -m mxnet_cpsgd.launch -n %d -s %d%s%s -- %s" % (
            self.num_workers, self.num_servers, net, (" --env " + env) if env else "",
            self.command_text())

    def fingerprint(self) -> str:
        """Identifies what the run computes (not where its logs go)."""
        blob = json.dumps({"script": self.script, "algorithm": self.algorithm,
                           "seed": self.seed, "args": self.args, "env": self.env,
                           "workers": self.num_workers, "servers": self.num_servers,
                           "rate": self.rate}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-") or "x"


def resolve_script(script: str) -> str:
    """A relative script path: from the working directory if it exists there,
    else from the project root."""
    if os.path.isabs(script) or os.path.exists(script):
        return os.path.abspath(script)
    return os.path.join(PROJECT_ROOT, script)


def expand(spec: Dict[str, object]) -> List[RunPlan]:
    """Every run of the spec, in execution order: per experiment, seeds outermost
    (so repetitions of a timing comparison interleave), then rates, workers and
    runs in spec order."""
    plans: List[RunPlan] = []
    for exp in spec.get("experiments") or [{}]:
        if bench_runs.is_bench(exp):
            continue  # expand_bench_plans
        name = exp.get("name", "main")
        script = exp.get("script", spec["script"])
        base_args = _merge_args(spec.get("args"), exp.get("args"))
        env: Dict[str, str] = {}
        env.update({k: str(v) for k, v in (spec.get("env") or {}).items()})
        env.update({k: str(v) for k, v in (exp.get("env") or {}).items()})
        runs = exp.get("runs", spec.get("runs"))
        labels = exp.get("labels")
        seeds = _as_list(exp.get("seeds", spec.get("seeds")), [42])
        rates = _as_list(exp.get("rates", spec.get("rates")), [None])
        workers = _as_list(exp.get("workers", spec.get("workers")), [2])
        servers = int(exp.get("num_servers", spec.get("num_servers", 1)))
        job_timeout = exp.get("job_timeout", spec.get("job_timeout"))
        timeout = float(exp.get("timeout", spec.get("timeout", 60)))
        checkpoint_every = exp.get("checkpoint_every", spec.get("checkpoint_every"))
        entries = []  # (entry, grid point)
        for run in runs:
            for point in _grid_points(run.get("grid") or {}):
                entries.append((run, point))
        for seed in seeds:
            for rate in rates:
                for m in workers:
                    for run, point in entries:
                        run_seeds = run.get("seeds")
                        if run_seeds is not None and seed not in _as_list(run_seeds, []):
                            continue
                        if run.get("rates") is not None and rate not in _as_list(run["rates"], []):
                            continue
                        if run.get("workers") is not None and m not in _as_list(run["workers"], []):
                            continue
                        knobs = {k: v for k, v in run.items() if k not in RUN_KEYS}
                        args = _merge_args(base_args, knobs, run.get("args"), point)
                        for reserved in RESERVED_FLAGS:
                            if reserved in args:
                                raise SpecError("run %r: %r is set by cpsgd-reproduce "
                                                "(use 'algorithm'/'seeds')" % (
                                                    run.get("label"), reserved))
                        fields = {k.replace("-", "_"): v for k, v in args.items()}
                        fields.update(algorithm=run["algorithm"], workers=m, seed=seed,
                                      rate=rate or "loopback", experiment=name)
                        label = _label(run.get("label", run["algorithm"]), fields)
                        if labels is not None and label not in labels:
                            continue
                        run_env = dict(env)
                        run_env.update({k: str(v) for k, v in (run.get("env") or {}).items()})
                        plan_knobs = {k.replace("-", "_"): v for k, v in args.items()
                                      if k.replace("-", "_") in KNOBS}
                        plans.append(RunPlan(
                            order=len(plans), experiment=name, label=label,
                            algorithm=str(run["algorithm"]), num_workers=int(m),
                            num_servers=servers, rate=rate, seed=int(seed), args=args,
                            env=run_env, script=script,
                            job_timeout=float(job_timeout) if job_timeout else None,
                            timeout=timeout, knobs=plan_knobs,
                            checkpoint_every=checkpoint_every))
    ids = [p.run_id for p in plans]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SpecError("two runs share an id (give them distinct labels): %s" % ", ".join(dup))
    return plans


def expand_bench_plans(spec: Dict[str, object]) -> List[bench_runs.BenchPlan]:
    """Every cpsgd-bench invocation of the spec's ``kind: bench`` experiments."""
    try:
        return bench_runs.expand_bench(spec, RUN_KEYS, _grid_points, _label)
    except bench_runs.BenchSpecError as err:
        raise SpecError(str(err)) from None


def select_bench(plans: Sequence[bench_runs.BenchPlan], only: Sequence[str],
                 experiments: Sequence[str]) -> List[bench_runs.BenchPlan]:
    """Bench invocations of ``experiments`` (empty: all) whose id (``te-tc/M4``)
    matches one of ``only`` (shell patterns; empty: all)."""
    return [p for p in plans
            if (not experiments or p.experiment in experiments)
            and (not only or any(fnmatch.fnmatchcase(p.invocation_id, pat) for pat in only))]


#: the algorithm knobs of the training scripts (see train_common.KNOB_FLAGS)
KNOBS = ("threshold", "correction_period", "warmup_steps", "sync_period", "local_lr",
         "local_momentum", "glu_weight", "local_optimizer", "local_wd")


# ----------------------------------------------------------------------------
# running

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
             if logs.LOG_RE.match(n) or n in (logs.RUN_META, "output.log")]
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


def code_version(directory: Optional[str] = None,
                 exclude: Optional[str] = None) -> Dict[str, object]:
    """The git commit of the code that runs, and whether the tree has uncommitted
    changes (``{'commit': None, 'dirty': None}`` outside a git checkout).

    Args:
        directory: where to ask git (default: this package's directory).
        exclude: a directory whose changes do not count (the reproduction's output,
            which the runner itself writes before every run).
    """
    import subprocess
    where = directory or os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        return subprocess.run(["git", "-C", where] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True,
                              timeout=30, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        paths = []
        if exclude:
            top = git("rev-parse", "--show-toplevel")
            rel = os.path.relpath(os.path.realpath(exclude), os.path.realpath(top))
            if not rel.startswith(os.pardir):
                paths = ["--", ":(top)", ":(top,exclude)%s" % rel]
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", *paths))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def run_meta(plan: RunPlan, **extra) -> Dict[str, object]:
    """A run's ``run.json``; pass ``code`` (:func:`code_version` when the run
    started), else it is taken now."""
    meta = {"run_id": plan.run_id, "order": plan.order, "experiment": plan.experiment,
            "label": plan.label, "algorithm": plan.algorithm,
            "num_workers": plan.num_workers, "num_servers": plan.num_servers,
            "rate": plan.rate, "seed": plan.seed, "knobs": plan.knobs,
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
    if (meta is None or meta.get("status") != "failed"
            or meta.get("fingerprint") != plan.fingerprint()):
        return None
    from ..training.checkpoint import newest_complete
    path = newest_complete(os.path.join(run_dir, CHECKPOINTS_DIR))
    if path is None:
        return None
    meta["checkpoint"] = path
    return meta


def _checkpoint_iteration(path: Optional[str]) -> Optional[int]:
    match = re.search(r"iter-(\d+)$", path or "")
    return int(match.group(1)) if match else None


def execute(plan: RunPlan, out: str, python: str, if_no_emulation: str = "fail",
            emulation_error: Optional[str] = None, echo=None,
            fresh: bool = False) -> Dict[str, object]:
    """Run one job and write its ``run.json``; returns that metadata.

    Args:
        plan: the run.
        out: the reproduction's output directory.
        python: the interpreter of the workers.
        if_no_emulation: with a rate but no emulation: 'fail' the run, 'skip' it,
            or run it 'unshaped' (``actual_rate`` in run.json is then None).
        emulation_error: why emulation is unavailable (None: available).
        echo: a stream for the job's output lines as they come (None: only the file).
        fresh: start a resumable run from the beginning even if it could resume.

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
    previous = None if fresh else resume_point(plan, run_dir)
    if previous is None:
        _clear_logs(run_dir)
        shutil.rmtree(os.path.join(run_dir, CHECKPOINTS_DIR), ignore_errors=True)
    rate = plan.rate
    if rate and emulation_error:
        if if_no_emulation in ("fail", "skip"):
            meta = run_meta(plan, code=code,
                            status="failed" if if_no_emulation == "fail" else "skipped",
                            returncode=None, wall_time=0.0, started=_now(), finished=_now(),
                            failure="network emulation unavailable: %s" % emulation_error)
            logs.write_json(os.path.join(run_dir, logs.RUN_META), meta)
            return meta
        rate = None
    started, t0 = _now(), time.monotonic()
    with open(os.path.join(run_dir, "output.log"), "a" if previous else "w") as log:
        if previous:
            log.write("cpsgd-reproduce: %s: resuming from %s\n"
                      % (started, previous["checkpoint"]))
        stream = _Tee(log, echo)
        try:
            result = launch.run_job(plan.argv(python, run_dir, resume=bool(previous)),
                                    plan.num_workers,
                                    plan.num_servers, env=plan.env, timeout=plan.timeout,
                                    job_timeout=plan.job_timeout, emulate_network=rate,
                                    stream=stream, allreduce=plan.allreduce)
            returncode, failure = result.returncode, result.failure
        except Exception as err:  # launcher refused (bad input, emulation broke)
            returncode, failure = None, "%s: %s" % (type(err).__name__, err)
            log.write("cpsgd-reproduce: %s\n" % failure)
    ok = returncode == 0
    meta = run_meta(plan, code=code, status="ok" if ok else "failed", returncode=returncode,
                    failure=failure, wall_time=round(time.monotonic() - t0, 2),
                    started=started, finished=_now(), actual_rate=rate)
    if ok and not logs_complete(plan, run_dir):
        meta["status"] = "failed"
        meta["failure"] = "the job succeeded but its logs are incomplete"
    if failure and failure.startswith("received SIG"):
        meta["interrupted"] = True
    if plan.checkpoint_every:
        _record_sitting(meta, previous, run_dir)
    logs.write_json(os.path.join(run_dir, logs.RUN_META), meta)
    return meta


def _record_sitting(meta: Dict[str, object], previous: Optional[Dict[str, object]],
                    run_dir: str) -> None:
    """Add this sitting to ``meta["sittings"]`` after the earlier ones; the run's
    ``started`` and ``wall_time`` become the first sitting's and the sum."""
    sitting = {key: meta.get(key) for key in ("started", "finished", "wall_time", "code",
                                              "status", "failure")}
    sitting["resumed_from_iteration"] = _checkpoint_iteration(
        previous["checkpoint"]) if previous else None
    sittings = list(previous.get("sittings") or []) if previous else []
    sittings.append(sitting)
    meta["sittings"] = sittings
    meta["started"] = sittings[0]["started"]
    meta["wall_time"] = round(sum(s.get("wall_time") or 0.0 for s in sittings), 2)
    if meta["status"] == "ok":
        shutil.rmtree(os.path.join(run_dir, CHECKPOINTS_DIR), ignore_errors=True)


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


def select(plans: Sequence[RunPlan], only: Sequence[str],
           experiments: Sequence[str]) -> List[RunPlan]:
    """Plans whose label (or run id) matches one of ``only`` (shell patterns) and
    whose experiment is in ``experiments`` (empty: all)."""
    out = []
    for p in plans:
        if experiments and p.experiment not in experiments:
            continue
        if only and not any(fnmatch.fnmatchcase(p.label, pat) or
                            fnmatch.fnmatchcase(p.run_id, pat) for pat in only):
            continue
        out.append(p)
    return out


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
            "purpose": exp.get("purpose", "both")})
    meta = {"experiments": experiments, "name": spec.get("name"), "title": spec.get("title"),
            "description": spec.get("description"), "notes": spec.get("notes"),
            "spec_path": spec_path, "command": command, "script": spec.get("script"),
            "bench_invocations": [p.invocation_id for p in bench_plans],
            "common_args": common, "environment": environment_info(),
            "reference_te_tc": spec.get("reference_te_tc"), "written": _now(),
            "figures": spec.get("figures"), "comparisons": spec.get("comparisons"),
            "runs": [p.run_id for p in plans]}
    os.makedirs(out, exist_ok=True)
    logs.write_json(os.path.join(out, logs.REPRODUCE_META), meta)
    logs.write_json(os.path.join(out, "spec.json"), spec)


def reproduce(spec: Dict[str, object], out: str, spec_path: Optional[str] = None,
              command: Optional[str] = None, only: Sequence[str] = (),
              experiments: Sequence[str] = (), force: bool = False,
              if_no_emulation: str = "fail", python: Optional[str] = None,
              echo=None, progress=sys.stdout, report: bool = True) -> int:
    """Run every incomplete run of the spec, then write the report.

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
        point = None if force else resume_point(plan, run_dir)
        if point is not None:
            _say(progress, "[%d/%d] %s: resuming from %s" % (i, len(chosen), plan.run_id,
                                                             point["checkpoint"]))
        meta = execute(plan, out, python, if_no_emulation, emulation_error, echo,
                       fresh=force)
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
                   help="run only these labels or run ids (shell patterns)")
    p.add_argument("--experiment", nargs="+", default=[], metavar="NAME",
                   help="run only these experiments of the spec")
    p.add_argument("--force", action="store_true",
                   help="rerun selected runs from the beginning even if their logs "
                        "are complete or they could resume from a checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="print the launcher command of every run and exit")
    p.add_argument("--report-only", action="store_true",
                   help="do not run anything: regenerate the report from the logs in OUT")
    p.add_argument("--if-no-emulation", choices=("fail", "skip", "unshaped"), default="fail",
                   help="runs with a network rate when emulation is unavailable "
                        "(not root, no iproute2): fail them, skip them, or run them "
                        "on plain loopback")
    p.add_argument("--python", default=None,
                   help="interpreter of the workers (default: this one)")
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
                         echo=sys.stdout if args.verbose else None)
    except SpecError as err:
        parser.error(str(err))
    except KeyboardInterrupt:
        print("cpsgd-reproduce: interrupted; rerun the same command to continue",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
