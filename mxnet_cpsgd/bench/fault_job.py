"""One training job of the fault campaign (:mod:`.faults`): ``cpsgd-launch``
running ``scripts/train_mnist.py`` with checkpoints, on one of the engines of
:mod:`.fault_engines`, its output read line by line with the time each line
arrived.

The rank-0 worker (whichever worker index ps-lite made rank 0) logs every
iteration (``--log-interval 1``: ``[Epoch e Batch b]``, iteration
``e * batches_per_epoch + b``); the launcher logs each restart (``cpsgd-launch:
restart n of N``) and the restarted rank 0 the checkpoint it resumed from
(``resumed from ...: epoch e, iteration i``).  :class:`JobRun`
turns these lines into the events the campaign measures.
"""
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_SCRIPT = os.path.join(REPO, "scripts", "train_mnist.py")
NODE_ENV = ("OMP_NUM_THREADS=1", "MXNET_CPU_WORKER_NTHREADS=1")

_BATCHES = re.compile(r"batches/epoch=(\d+)")
_ITER = re.compile(r"^\[worker \d+(?: on \S+)?\] .*\[Epoch (\d+) Batch (\d+)\]")
_RESTART = re.compile(r"^cpsgd-launch: restart (\d+) of \d+")
_RESUMED = re.compile(r"resumed from \S+: epoch \d+, iteration (\d+)")
_FRESH = re.compile(r"restart \d+: no complete checkpoint in")
_DONE = re.compile(r"^\[worker \d+(?: on \S+)?\] .*done: (\d+) iterations, final val=([\d.]+)")


@dataclass
class TrainSettings:
    """What every run of one configuration shares (but the seed)."""
    algorithm: str
    iterations: int
    checkpoint_every: int
    batch_size: int = 32
    dataset: str = "mnist-5k"
    batches_per_epoch: int = 62   # mnist-5k, 2 workers, batch 32 (checked in the output)


def train_command(settings: TrainSettings, seed: int, checkpoint_dir: str) -> List[str]:
    """The workers' command: ``scripts/train_mnist.py`` for ``settings.iterations``
    iterations, the cosine schedule spanning just the epochs they need."""
    epochs = -(-settings.iterations // settings.batches_per_epoch)
    return [sys.executable, TRAIN_SCRIPT, "--algorithm", settings.algorithm,
            "--dataset", settings.dataset, "--batch-size", str(settings.batch_size),
            "--seed", str(seed), "--num-epochs", str(epochs),
            "--max-iters", str(settings.iterations), "--checkpoint-dir", checkpoint_dir,
            "--checkpoint-every", str(settings.checkpoint_every), "--log-interval", "1"]


class JobRun:
    """A started launcher process and the lines it printed, with their times."""

    def __init__(self, argv: List[str], log_path: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None) -> None:
        env = dict(os.environ, **(env or {}))
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: List[Tuple[float, str]] = []
        self.ended: Optional[float] = None
        self.batches_per_epoch: Optional[int] = None
        self._log = open(log_path, "w") if log_path else None
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            now = time.monotonic()
            if self.batches_per_epoch is None:
                match = _BATCHES.search(line)
                if match:
                    self.batches_per_epoch = int(match.group(1))
            with self._lock:
                self.lines.append((now, line))
            if self._log:
                self._log.write("%.3f %s\n" % (now - self.started, line))
                self._log.flush()
        self.proc.wait()
        self.ended = time.monotonic()

    @property
    def running(self) -> bool:
        return self.ended is None

    def wait(self, seconds: float) -> Optional[int]:
        """The launcher's exit status, or None if it still runs after ``seconds``."""
        self._reader.join(seconds)
        if self._reader.is_alive():
            return None
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the launcher's process group (a run that did not end)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                pass
        self.wait(30)

    def snapshot(self, since: float = 0.0) -> List[Tuple[float, str]]:
        with self._lock:
            return [(t, line) for t, line in self.lines if t >= since]

    def iteration_of(self, line: str) -> Optional[int]:
        match = _ITER.search(line)
        if not match or self.batches_per_epoch is None:
            return None
        return int(match.group(1)) * self.batches_per_epoch + int(match.group(2))

    def iterations(self, since: float = 0.0, until: float = float("inf")):
        """(time, iteration) of the rank-0 iteration lines in [since, until)."""
        found = []
        for t, line in self.snapshot(since):
            if t >= until:
                break
            it = self.iteration_of(line)
            if it is not None:
                found.append((t, it))
        return found

    def last_iteration(self, until: float = float("inf")) -> Optional[int]:
        its = self.iterations(0.0, until)
        return its[-1][1] if its else None

    def restart_after(self, since: float) -> Optional[Tuple[float, int]]:
        """(time, restart number) of the first restart line at or after ``since``."""
        for t, line in self.snapshot(since):
            match = _RESTART.search(line)
            if match:
                return t, int(match.group(1))
        return None

    def resumed_after(self, since: float) -> Optional[Tuple[float, int]]:
        """(time, iteration) of the first resume (0 for a fresh start) after ``since``."""
        for t, line in self.snapshot(since):
            match = _RESUMED.search(line)
            if match:
                return t, int(match.group(1))
            if _FRESH.search(line):
                return t, 0
        return None

    def progressed_after(self, since: float, beyond: int) -> Optional[Tuple[float, int]]:
        """(time, iteration) of the first iteration line after ``since`` past ``beyond``."""
        for t, it in self.iterations(since):
            if it > beyond:
                return t, it
        return None

    def final(self) -> Tuple[Optional[int], Optional[float]]:
        """(iterations, validation accuracy) of rank 0's ``done:`` line."""
        for _, line in reversed(self.snapshot()):
            match = _DONE.search(line)
            if match:
                return int(match.group(1)), float(match.group(2))
        return None, None

    def text(self) -> str:
        return "\n".join(line for _, line in self.snapshot())


def final_params_path(checkpoint_dir: str) -> Optional[str]:
    """``model.params`` of the newest checkpoint (the one the run ends with)."""
    names = sorted(n for n in os.listdir(checkpoint_dir) if n.startswith("iter-")) \
        if os.path.isdir(checkpoint_dir) else []
    for name in reversed(names):
        path = os.path.join(checkpoint_dir, name, "model.params")
        if os.path.exists(os.path.join(checkpoint_dir, name, "checkpoint.json")):
            return path
    return None
