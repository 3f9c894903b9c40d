"""Experiments of ``kind: bench``: cpsgd-bench invocations planned from a spec,
run as subprocesses, and their completeness.

The layer rules keep ``repro`` and ``bench`` apart, so the bench runs as
``python -m mxnet_cpsgd.bench ...`` and is read back only through the
``results.json`` it writes.  One invocation per number of workers M (and per
value of the experiment's ``sweep`` flag), all of the experiment's runs as the
bench's algorithm variants (``LABEL=STORE:KNOB=VALUE``), in
``OUT/bench/<experiment>/M<M>[-<flag><value>]/``::

    invocation.json   what ran: the command, its fingerprint, status, wall time,
                      and the experiment's labels, reference and comparisons
    output.log        the bench's output
    results.json ...  the bench's own files (results.md, time_vs_rate.png, runs/)
"""
import hashlib
import json
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from . import logs

BENCH = "bench"
INVOCATION_META = "invocation.json"
#: flags cpsgd-reproduce sets on every bench invocation itself
RESERVED_BENCH_FLAGS = ("out-dir", "num-workers", "n", "algorithms", "no-progress",
                        "rerender", "plot-workers")
#: keys of a bench experiment (besides the shared name/purpose/description)
BENCH_KEYS = ("bench_args", "sweep", "reference", "compare", "workers", "runs", "labels",
              "timeout")


class BenchSpecError(ValueError):
    """A malformed bench experiment (runner.SpecError wraps it)."""


@dataclass
class BenchPlan:
    """One cpsgd-bench invocation of a ``kind: bench`` experiment.

    Args:
        order: position among the spec's bench invocations.
        experiment: the experiment's name.
        num_workers: ``-n``.
        bench_args: the bench's flags (name without dashes -> value), sweep value included.
        variants: ``(label, store, knobs)`` in the experiment's order.
        sweep_flag: the flag the experiment sweeps (None: no sweep).
        sweep_value: its value in this invocation.
        reference: the published table (``columns``, ``rows``) or None.
        compare: label pairs whose ratio the report compares.
        timeout: seconds the whole invocation may take (None: the bench's own
            per-job timeouts bound it).
    """
    order: int
    experiment: str
    num_workers: int
    bench_args: Dict[str, object]
    variants: List[tuple]
    sweep_flag: Optional[str] = None
    sweep_value: object = None
    reference: Optional[Dict[str, object]] = None
    compare: List[List[str]] = field(default_factory=list)
    timeout: Optional[float] = None

    @property
    def labels(self) -> List[str]:
        return [v[0] for v in self.variants]

    @property
    def invocation_id(self) -> str:
        name = "M%d" % self.num_workers
        if self.sweep_flag is not None:
            name += "-%s%s" % (self.sweep_flag, _value_text(self.sweep_value))
        return "%s/%s" % (_slug(self.experiment), _slug(name))

    def directory(self, out: str) -> str:
        return os.path.join(out, BENCH, self.invocation_id)

    def algorithms_text(self) -> str:
        """The bench's ``--algorithms`` value: every run as a labelled variant."""
        parts = []
        for label, store, knobs in self.variants:
            if label == store and not knobs:
                parts.append(store)
            else:
                parts.append("%s=%s" % (label, ":".join(
                    [store] + ["%s=%s" % (k, _value_text(v)) for k, v in knobs.items()])))
        return ",".join(parts)

    def flags(self) -> List[str]:
        """Every bench flag but --out-dir and --no-progress."""
        argv = ["-n", str(self.num_workers)]
        for key, value in self.bench_args.items():
            if value is None or value is False:
                continue
            argv.append("--" + key)
            if value is not True:
                argv.append(_value_text(value))
        return argv + ["--algorithms", self.algorithms_text()]

    def argv(self, python: str, out_dir: str) -> List[str]:
        return [python, "-m", "mxnet_cpsgd.bench", "--no-progress", "--out-dir",
                out_dir] + self.flags()

    def command_text(self) -> str:
        """The bench command as a user would type it (output relative to OUT)."""
        return " ".join(shlex.quote(a) for a in
                        ["cpsgd-bench", "--out-dir", os.path.join(BENCH, self.invocation_id)]
                        + self.flags())

    def fingerprint(self) -> str:
        """Identifies what the invocation measures (not where it writes)."""
        blob = json.dumps(self.flags())
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def meta(self, **extra) -> Dict[str, object]:
        meta = {"invocation_id": self.invocation_id, "order": self.order,
                "experiment": self.experiment, "num_workers": self.num_workers,
                "sweep_flag": self.sweep_flag, "sweep_value": self.sweep_value,
                "labels": self.labels,
                "variants": [{"label": l, "store": s, "knobs": k} for l, s, k in self.variants],
                "reference": self.reference, "compare": self.compare,
                "bench_args": self.bench_args, "command_text": self.command_text(),
                "fingerprint": self.fingerprint()}
        meta.update(extra)
        return meta


def _value_text(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_value_text(v) for v in value)
    if isinstance(value, float) and value == int(value) and abs(value) < 1e15:
        return "%d" % value
    return str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-") or "x"


def _flag(key) -> str:
    return str(key).lstrip("-").replace("_", "-")


def is_bench(exp: Dict[str, object]) -> bool:
    return exp.get("kind", "train") == "bench"


def validate_bench_experiment(exp: Dict[str, object], spec: Dict[str, object]) -> None:
    """Check one ``kind: bench`` experiment; raises BenchSpecError."""
    name = exp.get("name", "main")
    if "rates" in exp:
        raise BenchSpecError("bench experiment %r: give rates in bench_args "
                             "(rates: \"none\" or \"100mbit,50mbit\"), not 'rates'" % name)
    for key in ("script", "args", "seeds", "env", "num_servers", "job_timeout"):
        if key in exp:
            raise BenchSpecError("bench experiment %r: %r is for training experiments; "
                                 "put the bench's flags in bench_args" % (name, key))
    args = _bench_args(exp, spec)
    reserved = sorted(set(args) & set(RESERVED_BENCH_FLAGS))
    if reserved:
        raise BenchSpecError("bench experiment %r: %s set by cpsgd-reproduce (use "
                             "'workers' and 'runs')" % (name, ", ".join(reserved)))
    sweep = exp.get("sweep")
    if sweep is not None:
        if not isinstance(sweep, dict) or len(sweep) != 1:
            raise BenchSpecError("bench experiment %r: sweep is one bench flag and its "
                                 "values, e.g. {emulate-compute: [50, 100, 200]}" % name)
        flag, values = next(iter(sweep.items()))
        if _flag(flag) in RESERVED_BENCH_FLAGS or _flag(flag) in args:
            raise BenchSpecError("bench experiment %r: the swept flag %s is also set "
                                 "elsewhere" % (name, _flag(flag)))
        if not isinstance(values, list) or not values:
            raise BenchSpecError("bench experiment %r: sweep %s needs a list of values"
                                 % (name, flag))
    for run in exp.get("runs", spec.get("runs")) or []:
        misplaced = sorted(k for k in ("args", "env", "rates", "seeds", "workers")
                           if isinstance(run, dict) and k in run)
        if misplaced:
            raise BenchSpecError("bench experiment %r, run %r: %s not for bench runs (every "
                                 "run is measured in every invocation)"
                                 % (name, run.get("label"), ", ".join(misplaced)))
    ref = exp.get("reference")
    if ref is not None:
        if not isinstance(ref, dict) or not isinstance(ref.get("columns"), list) \
                or not isinstance(ref.get("rows"), dict):
            raise BenchSpecError("bench experiment %r: reference needs 'columns' (a list) "
                                 "and 'rows' (name -> values)" % name)
        for row, values in ref["rows"].items():
            if not isinstance(values, list) or len(values) != len(ref["columns"]):
                raise BenchSpecError("bench experiment %r: reference row %r needs %d values"
                                     % (name, row, len(ref["columns"])))
    for pair in exp.get("compare") or []:
        if not isinstance(pair, list) or len(pair) != 2:
            raise BenchSpecError("bench experiment %r: compare lists pairs such as "
                                 "[k5, BIT], got %r" % (name, pair))


def ordered_reference(reference: Optional[Dict[str, object]]) -> Optional[Dict[str, object]]:
    """The reference with its rows as a list of [name, values] pairs, so that
    their order survives JSON files written with sorted keys."""
    if not reference:
        return None
    rows = reference.get("rows") or {}
    return dict(reference, rows=[[k, v] for k, v in rows.items()] if isinstance(rows, dict)
                else rows)


def _bench_args(exp, spec) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for layer in (spec.get("bench_args"), exp.get("bench_args")):
        if layer is not None and not isinstance(layer, dict):
            raise BenchSpecError("bench_args must be a mapping")
        for key, value in (layer or {}).items():
            out[_flag(key)] = value
    return out


def expand_bench(spec: Dict[str, object], run_keys: Sequence[str], grid_points,
                 make_label) -> List[BenchPlan]:
    """Every bench invocation of the spec, in spec order (per experiment: workers,
    then sweep values).

    Args:
        spec: the validated spec.
        run_keys: keys of a run entry that are not knobs.
        grid_points: the runner's grid expansion (mapping -> list of points).
        make_label: the runner's label formatting (template, fields) -> label.
    """
    plans: List[BenchPlan] = []
    for exp in spec.get("experiments") or [{}]:
        if not is_bench(exp):
            continue
        name = exp.get("name", "main")
        args = _bench_args(exp, spec)
        variants = []
        for run in exp.get("runs", spec.get("runs")) or []:
            for point in grid_points(run.get("grid") or {}):
                knobs = {k: v for k, v in run.items() if k not in run_keys}
                knobs.update({k.replace("-", "_"): v for k, v in point.items()})
                knobs = {k.replace("-", "_"): v for k, v in knobs.items()}
                fields = dict(knobs, algorithm=run["algorithm"], experiment=name)
                label = make_label(run.get("label", run["algorithm"]), fields)
                variants.append((label, str(run["algorithm"]).lower(), knobs))
        labels = exp.get("labels")
        if labels is not None:
            variants = [v for v in variants if v[0] in labels]
        seen = [v[0] for v in variants]
        twice = sorted({l for l in seen if seen.count(l) > 1})
        if twice:
            raise BenchSpecError("bench experiment %r: label(s) used twice: %s"
                                 % (name, ", ".join(twice)))
        sweep = exp.get("sweep") or {}
        flag, values = (next(iter(sweep.items())) if sweep else (None, [None]))
        workers = exp.get("workers", spec.get("workers", [2]))
        workers = workers if isinstance(workers, list) else [workers]
        timeout = exp.get("timeout")
        for m in workers:
            for value in values:
                plan_args = dict(args)
                if flag is not None:
                    plan_args[_flag(flag)] = value
                plans.append(BenchPlan(
                    order=len(plans), experiment=name, num_workers=int(m),
                    bench_args=plan_args, variants=variants,
                    sweep_flag=_flag(flag) if flag is not None else None, sweep_value=value,
                    reference=ordered_reference(exp.get("reference")),
                    compare=list(exp.get("compare") or []),
                    timeout=float(timeout) if timeout else None))
    return plans


# ----------------------------------------------------------------------------
# running

def read_meta(directory: str) -> Dict[str, object]:
    path = os.path.join(directory, INVOCATION_META)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def is_complete(plan: BenchPlan, out: str) -> bool:
    """The invocation ran before with the same flags, succeeded, and left its
    results.json."""
    directory = plan.directory(out)
    meta = read_meta(directory)
    return (meta.get("status") == "ok" and meta.get("fingerprint") == plan.fingerprint()
            and os.path.isfile(os.path.join(directory, "results.json")))


def execute(plan: BenchPlan, out: str, python: str, now, echo=None) -> Dict[str, object]:
    """Run one bench invocation and write its ``invocation.json``; returns it.

    The bench runs in this process group, so Ctrl-C reaches it too (it then
    tears its job down and writes what it measured); this waits for it.

    Args:
        plan: the invocation.
        out: the reproduction's output directory.
        python: the interpreter to run ``-m mxnet_cpsgd.bench`` with.
        now: a function giving the current time as text.
        echo: a stream for the bench's output as it comes (None: only output.log).
    """
    directory = plan.directory(out)
    os.makedirs(directory, exist_ok=True)
    stale = os.path.join(directory, "results.json")
    if os.path.exists(stale):
        os.remove(stale)  # an earlier attempt's: never read as this one's
    started, t0 = now(), time.monotonic()
    failure, returncode, interrupted = None, None, False
    env = dict(os.environ)
    # the bench imports this project; let it find the same copy as we do
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    with open(os.path.join(directory, "output.log"), "w") as log:
        proc = subprocess.Popen(plan.argv(python, directory), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        reader = threading.Thread(target=_copy_lines, args=(proc.stdout, log, echo),
                                  daemon=True)
        reader.start()
        try:
            try:
                returncode = proc.wait(plan.timeout)
            except subprocess.TimeoutExpired:
                failure = "took more than %g s (the spec's timeout)" % plan.timeout
                proc.terminate()  # the bench tears its jobs and namespaces down on SIGTERM
                returncode = proc.wait(120)
        except KeyboardInterrupt:
            interrupted = True
            returncode = proc.wait()  # the bench got the same SIGINT; let it clean up
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(10)
    if failure is None and returncode != 0:
        failure = "cpsgd-bench exited with %s (see output.log)" % returncode
    if failure is None and not os.path.isfile(stale):
        failure = "cpsgd-bench wrote no results.json"
    meta = plan.meta(status="ok" if failure is None else "failed", returncode=returncode,
                     failure=failure, started=started, finished=now(),
                     wall_time=round(time.monotonic() - t0, 2), python=python,
                     interrupted=interrupted)
    logs.write_json(os.path.join(directory, INVOCATION_META), meta)
    if interrupted:
        raise KeyboardInterrupt
    return meta


def _copy_lines(source, log, echo) -> None:
    for line in source:
        log.write(line)
        if echo is not None:
            echo.write(line)
            echo.flush()


def brief(plan: BenchPlan, out: str) -> str:
    """ms/iter of every label of a finished invocation, for the progress line."""
    try:
        with open(os.path.join(plan.directory(out), "results.json")) as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError):
        return ""
    cells = ["%s %.1f" % (r["algorithm"], r["mean_ms"]) for r in rows
             if r.get("mean_ms") is not None]
    return " ms/iter: " + ", ".join(cells) if cells else ""


def run_all(plans: Sequence[BenchPlan], out: str, python: str, force: bool, say, now,
            echo=None) -> int:
    """Run every incomplete invocation; returns how many failed."""
    failed = 0
    for i, plan in enumerate(plans, 1):
        tag = "[bench %d/%d] %s" % (i, len(plans), plan.invocation_id)
        if not force and is_complete(plan, out):
            say("%s: complete, skipped" % tag)
            continue
        say("%s: %s" % (tag, plan.command_text()))
        meta = execute(plan, out, python, now, echo)
        failed += meta["status"] != "ok"
        say("%s: %s in %.0f s%s%s" % (tag, meta["status"], meta["wall_time"],
                                       brief(plan, out),
                                       (" (%s)" % meta["failure"]) if meta["failure"] else ""))
    return failed


def experiment_meta(exp: Dict[str, object], plans: Sequence[BenchPlan]) -> Dict[str, object]:
    """What reproduce.json records of a bench experiment (the report reads it)."""
    name = exp.get("name", "main")
    ps = [p for p in plans if p.experiment == name]
    first = ps[0] if ps else None
    args = dict(first.bench_args) if first else {}
    if first and first.sweep_flag:
        args.pop(first.sweep_flag, None)
    return {"name": name, "kind": BENCH, "purpose": "timing",
            "description": exp.get("description"),
            "args": ["%s %s" % ("--" + k, _value_text(v)) if v is not True else "--" + k
                     for k, v in args.items() if v is not None and v is not False],
            "workers": sorted({p.num_workers for p in ps}, reverse=True),
            "rates": [_value_text(args.get("rates", "none,1gbit,100mbit"))],
            "seeds": [],
            "labels": first.labels if first else [],
            "sweep": ({first.sweep_flag: [p.sweep_value for p in ps
                                          if p.num_workers == first.num_workers]}
                      if first and first.sweep_flag else None),
            "reference": ordered_reference(exp.get("reference")),
            "compare": exp.get("compare") or [], "invocations": [p.invocation_id for p in ps]}
