"""Reading a reproduction's output directory: each run's ``run.json``, its
per-rank JSON log lines and earlier attempts (layout in docs/reproduce.md).
"""
import glob
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional


RUN_META = "run.json"
REPRODUCE_META = "reproduce.json"
#: earlier failed attempts of a run: <run>/attempts/<n>/ (not runs themselves)
ATTEMPTS_DIR = "attempts"
LOG_RE = re.compile(r"^log(?:\.rank(\d+))?\.json$")
#: the validation logs of --val-every-iters / --emulate-compute (training/timed_training.py)
VAL_LOG_RE = re.compile(r"^log-val(?:\.rank(\d+))?\.json$")


# ----------------------------------------------------------------------------
# loading

@dataclass
class Run:
    """One run: its metadata (``run.json``) and its records by rank."""
    path: str
    meta: Dict[str, object]
    records: Dict[int, List[Dict[str, object]]] = field(default_factory=dict)
    attempts: List[Dict[str, object]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or self.meta.get("algorithm") or "?")

    @property
    def experiment(self) -> str:
        return str(self.meta.get("experiment") or "main")

    @property
    def num_workers(self) -> int:
        return int(self.meta.get("num_workers") or len(self.records) or 1)

    @property
    def rate(self) -> Optional[str]:
        rate = self.meta.get("rate")
        return str(rate) if rate else None

    @property
    def status(self) -> str:
        return str(self.meta.get("status") or ("ok" if self.records else "missing"))

    @property
    def knobs(self) -> Dict[str, object]:
        return dict(self.meta.get("knobs") or {})

    @property
    def k(self) -> Optional[int]:
        """The correction period of a CP-SGD run (None for other algorithms)."""
        if self.meta.get("algorithm") != "cpsgd":
            return None
        k = self.knobs.get("correction_period")
        return int(k) if k is not None else 5  # the store's default


def write_json(path: str, obj) -> None:
    """Write ``obj`` as JSON through a temporary file, so a reader never sees half of it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json_lines(path: str) -> List[Dict[str, object]]:
    """The JSON objects of a JSON-lines file (blank and broken lines skipped: a
    run killed while writing leaves at most one broken last line)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def read_run(path: str) -> Run:
    """Read one run directory."""
    meta: Dict[str, object] = {}
    meta_path = os.path.join(path, RUN_META)
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    records: Dict[int, List[Dict[str, object]]] = {}
    for name in sorted(os.listdir(path)):
        m = LOG_RE.match(name)
        if not m:
            continue
        lines = read_json_lines(os.path.join(path, name))
        if not lines:
            continue
        rank = int(lines[0].get("rank", m.group(1) or 0))
        records[rank] = lines
    if records and not meta:
        first = next(iter(records.values()))[0]
        meta = {"algorithm": first.get("algorithm"), "label": first.get("algorithm"),
                "num_workers": first.get("num_workers"), "status": "ok"}
    if "run_id" not in meta:
        meta["run_id"] = os.path.basename(os.path.normpath(path))
    return Run(path, meta, records, read_attempts(path))


def read_attempts(path: str) -> List[Dict[str, object]]:
    """The ``run.json`` of each earlier failed attempt kept under ``attempts/``."""
    out = []
    base = os.path.join(path, ATTEMPTS_DIR)
    if not os.path.isdir(base):
        return out
    for name in sorted(os.listdir(base), key=lambda n: (len(n), n)):
        meta_path = os.path.join(base, name, RUN_META)
        if os.path.isfile(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            meta["attempt"] = name
            out.append(meta)
    return out


def load_runs(root: str) -> List[Run]:
    """Every run under ``root`` (a directory holding ``run.json`` or ``log*.json``),
    in the order of their ``order`` field (spec order), then by path."""
    found = set()
    for pattern in ("**/" + RUN_META, "**/log.json", "**/log.rank*.json"):
        for p in glob.glob(os.path.join(root, pattern), recursive=True):
            found.add(os.path.dirname(p))
    found = {p for p in found
             if ATTEMPTS_DIR not in os.path.relpath(p, root).split(os.sep)}
    runs = [read_run(p) for p in sorted(found)]
    runs = [r for r in runs if r.meta.get("run_id")]
    runs.sort(key=lambda r: (r.meta.get("order", 1 << 30), r.path))
    return runs


def read_reproduce_meta(root: str) -> Dict[str, object]:
    path = os.path.join(root, REPRODUCE_META)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)
