"""Experiment specs of cpsgd-reproduce: reading and checking a spec, and expanding
it into the runs of its grid (:class:`RunPlan`: one training job each, its command,
its directory and fingerprint).  Running them is :mod:`.runner`'s part; the format is
in docs/reproduce.md.
"""
import fnmatch
import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..stores.config import KNOBS as STORE_KNOBS
from . import bench_runs, emulated_hosts, measured_tta

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: keys of a run entry that are not knobs of the algorithm
RUN_KEYS = ("label", "algorithm", "args", "grid", "workers", "rates", "seeds", "env")
#: top-level / experiment keys
EXPERIMENT_KEYS = ("name", "purpose", "script", "args", "env", "workers", "rates", "seeds", "runs",
                   "labels", "num_servers", "job_timeout", "timeout", "description",
                   "checkpoint_every", "equivalence_min_seeds", "placement",
                   # kind: bench (mxnet_cpsgd/repro/bench_runs.py)
                   "kind", "bench_args", "sweep", "reference", "compare")
SPEC_KEYS = EXPERIMENT_KEYS + ("title", "experiments", "notes", "reference_te_tc",
                               "report_name", "figures", "comparisons",
                               "equivalence_margin", "time_to_accuracy",
                               "measured_time_to_accuracy")
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
        problem = emulated_hosts.check_placement(exp.get("placement", spec.get("placement")))
        if problem:
            raise SpecError("experiment %r: %s" % (name, problem))
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
    validate_time_to_accuracy(spec.get("time_to_accuracy"))
    problem = measured_tta.check_settings(spec.get("measured_time_to_accuracy"))
    if problem:
        raise SpecError(problem)
    margin = spec.get("equivalence_margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))
                               or not margin > 0):
        raise SpecError("'equivalence_margin' must be a positive number of accuracy points "
                        "(fixed before the runs), got %r" % (margin,))
    # the spec's own value, and an experiment's that overrides it for its rows
    for where in [spec] + [e for e in spec.get("experiments") or [] if isinstance(e, dict)]:
        min_seeds = where.get("equivalence_min_seeds")
        if min_seeds is not None and (isinstance(min_seeds, bool)
                                      or not isinstance(min_seeds, int) or min_seeds < 2):
            raise SpecError("'equivalence_min_seeds' must be a whole number of paired seeds "
                            ">= 2 (fixed before the runs), got %r%s" % (
                                min_seeds, " in experiment %r" % where.get("name")
                                if where is not spec else ""))


def validate_time_to_accuracy(settings) -> None:
    """``time_to_accuracy``: see :func:`.time_to_accuracy.check_settings`."""
    from .time_to_accuracy import check_settings
    problem = check_settings(settings)
    if problem:
        raise SpecError(problem)


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
    placement: str = "separate"  # see emulated_hosts

    @property
    def run_id(self) -> str:
        """``<experiment>/<label>-M<m>-<network>-s<seed>`` (:func:`split_run_id`
        reads it back)."""
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
        if self.allreduce and not self.rate and self.placement == "separate":
            env = " ".join("-x %s=%s" % kv for kv in sorted(self.env.items()))
            return "horovodrun -np %d -H localhost:%d --gloo%s %s" % (
                self.num_workers, self.num_workers, (" " + env) if env else "",
                self.command_text())
        net = emulated_hosts.launcher_flags(self.rate, self.args, self.placement)
        env = " ".join("%s=%s" % kv for kv in sorted(self.env.items()))
        nodes = ("--allreduce -n %d" % self.num_workers if self.allreduce
                 else "-n %d -s %d" % (self.num_workers, self.num_servers))
        return "python -m mxnet_cpsgd.launch %s%s%s -- %s" % (
            nodes, net, (" --env " + env) if env else "", self.command_text())

    def fingerprint(self) -> str:
        """Identifies what the run computes (not where its logs go)."""
        blob = json.dumps({"script": self.script, "algorithm": self.algorithm,
                           "seed": self.seed, "args": self.args, "env": self.env,
                           "workers": self.num_workers, "servers": self.num_servers,
                           "rate": self.rate, **({"placement": self.placement}
                                                 if self.placement != "separate" else {})},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def split_run_id(run_id: str) -> Tuple[str, str, object]:
    """A :attr:`RunPlan.run_id` as ``(experiment, '<label>-M<m>-<network>', seed)``
    (the seed an int; as written when it is not a number)."""
    experiment, _, rest = str(run_id).partition("/")
    stem, _, seed = rest.rpartition("-s")
    return experiment, stem, int(seed) if seed.isdigit() else seed


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
        servers = exp.get("num_servers", spec.get("num_servers"))
        placement = exp.get("placement", spec.get("placement", "separate"))
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
                            num_servers=emulated_hosts.num_servers(placement, servers, int(m)),
                            rate=rate, seed=int(seed), args=args, placement=placement,
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


#: the algorithm knobs a run records in run.json: every knob of the stores (the
#: training scripts give each a flag), but 'type', which no script flag sets
KNOBS = tuple(k for k in STORE_KNOBS if k != "type")


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
