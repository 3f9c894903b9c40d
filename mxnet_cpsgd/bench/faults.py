"""The fault campaign: real training jobs under a seeded fault injector.

Usage (root: the emulated hosts are network namespaces with their own sshd)::

    nice -n 10 python -m mxnet_cpsgd.bench.faults --out DIR \\
        [--configs ssgd-local,cpsgd-local,ssgd-hosts,cpsgd-hosts] [--kinds K,...] \\
        [--faults-per-job 6] [--seed 1] [--iters 3000] [--checkpoint-every 10] \\
        [--stall-timeout 8] [--repeat-reference] [--no-seed-spread]

Every configuration ``ALGORITHM-ENGINE`` (2 workers of LeNet-5 on mnist-5k;
the engines in :mod:`.fault_engines`: this machine with 1 server, 2 emulated
hosts over ssh, an emulated Slurm cluster, mpirun, Horovod all-reduce) runs:

1. an uninterrupted reference run (``--seed``);
2. the faulted run, the same command under ``cpsgd-launch --max-restarts``
   with checkpoints every ``--checkpoint-every`` iterations, while the
   injector (:mod:`.fault_injector`) delivers ``--faults-per-job`` faults, one
   at a time, each at a seeded random time while training progresses after
   the previous recovery;
3. for algorithms other than ``ssgd`` and ``horovod``, a reference run with
   seed ``--seed + 1`` (the spread between two seeds bounds the faulted run's
   difference; not with ``--no-seed-spread``), and with
   ``--repeat-reference`` a second run of the reference seed (determinism).

Per fault it records the kind, target, when it was injected, when training
progressed again (the first iteration line after the restart beyond the
iteration resumed from) and the steps recomputed (the last iteration reached
before the restart minus the iteration resumed from).  At the end the final
weights (``model.params`` of the last checkpoint) of the faulted and the
reference run are compared.  Results: ``DIR/faults-campaign.json`` and
``DIR/faults-campaign.md`` (:mod:`.fault_report`), one log per run.
"""
import argparse
import os
import random
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import numpy as np

from mxnet_cpsgd.bench import fault_report
from mxnet_cpsgd.bench.fault_engines import Engine, engine_of, namespaces
from mxnet_cpsgd.bench.fault_injector import (KINDS, TEMPORARY_KINDS, Injector, NoTarget,
                                              continue_stopped, kill_job_processes,
                                              plan_kinds)
from mxnet_cpsgd.bench.fault_job import JobRun, TrainSettings, final_params_path, train_command

CONFIGS = ("ssgd-local", "cpsgd-local", "ssgd-hosts", "cpsgd-hosts")
#: configurations of the other engines (not run by default)
ENGINE_CONFIGS = ("ssgd-slurm", "cpsgd-slurm", "ssgd-mpi", "cpsgd-mpi",
                  "horovod-allreduce", "fp16-allreduce")
#: algorithms whose faulted run must end with the reference's weights, bit for bit
EXACT = ("ssgd", "horovod")
#: seconds a fault may take to be noticed and the job to train again
RECOVERY_LIMIT_S = 300.0


@dataclass
class FaultRecord:
    config: str
    index: int
    kind: str
    target: str = ""
    injected_s: Optional[float] = None     # seconds since the faulted run started
    iteration_at_fault: Optional[int] = None
    restart: Optional[int] = None
    detected_s: Optional[float] = None     # the launcher's restart line, after the fault
    resumed_from: Optional[int] = None
    last_iteration_before_restart: Optional[int] = None
    training_again_s: Optional[float] = None
    fault_to_training_s: Optional[float] = None
    steps_recomputed: Optional[int] = None
    recovered: bool = False
    note: str = ""


@dataclass
class ConfigResult:
    config: str
    algorithm: str
    where: str
    seed: int
    faults: List[FaultRecord] = field(default_factory=list)
    exit_code: Optional[int] = None
    restarts: int = 0
    faulted_seconds: Optional[float] = None
    reference_seconds: Optional[float] = None
    final_iterations: Dict[str, Optional[int]] = field(default_factory=dict)
    val_acc: Dict[str, Optional[float]] = field(default_factory=dict)
    comparison: Dict[str, object] = field(default_factory=dict)
    leftovers: List[str] = field(default_factory=list)
    marks: Dict[str, str] = field(default_factory=dict)   # run -> CPSGD_FAULT_MARK


def load_params(path: str) -> Dict[str, np.ndarray]:
    import mxnet as mx
    return {k: v.asnumpy() for k, v in mx.nd.load(path).items()}


def compare(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> Dict[str, object]:
    """Bitwise equality, largest absolute difference and ``||a - b|| / ||b||``."""
    names = sorted(b)
    if sorted(a) != names:
        return {"same_names": False}
    va = np.concatenate([a[n].ravel().astype(np.float64) for n in names])
    vb = np.concatenate([b[n].ravel().astype(np.float64) for n in names])
    return {"same_names": True,
            "bit_identical": all(np.array_equal(a[n], b[n]) for n in names),
            "arrays": len(names),
            "max_abs_diff": float(np.abs(va - vb).max()),
            "rel_l2": float(np.linalg.norm(va - vb) / np.linalg.norm(vb))}


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.engines: Dict[str, Engine] = {}
        self.running: Optional[tuple] = None  # (JobRun, mark) of the run under way

    def log(self, text: str) -> None:
        print("[faults %s] %s" % (time.strftime("%H:%M:%S"), text), flush=True)

    def run_config(self, config: str, index: int) -> ConfigResult:
        algorithm, where = engine_of(config)
        args = self.args
        settings = TrainSettings(algorithm, args.iters, args.checkpoint_every)
        result = ConfigResult(config, algorithm, where, args.seed)
        engine = self._engine(where)
        runs = [("reference", args.seed)]
        if algorithm not in EXACT:
            if not args.no_seed_spread:
                runs.append(("seed%d" % (args.seed + 1), args.seed + 1))
            if args.repeat_reference:
                runs.append(("repeat", args.seed))
        params = {}
        for name, seed in runs:
            job, seconds = self._plain_run(config, name, settings, seed, engine, result)
            if name == "reference":
                result.reference_seconds = seconds
            path = final_params_path(os.path.join(self.out, config, name, "ckpt"))
            params[name] = load_params(path) if path else None
        rng = random.Random("%d/%s" % (args.seed, config))
        self._faulted_run(config, settings, engine, rng, result)
        path = final_params_path(os.path.join(self.out, config, "faulted", "ckpt"))
        params["faulted"] = load_params(path) if path else None
        ref = params["reference"]
        for name, p in params.items():
            if name != "reference" and p is not None and ref is not None:
                result.comparison[name + "_vs_reference"] = compare(p, ref)
        return result

    def _engine(self, where: str) -> Engine:
        """The engine (set up on first use) the jobs of ``where`` run on."""
        if where not in self.engines:
            self.engines[where] = Engine(where)
        self.engines[where].setup(self.log)
        return self.engines[where]

    def _start(self, config, name, settings, seed, engine, max_restarts):
        run_dir = os.path.join(self.out, config, name)
        os.makedirs(run_dir, exist_ok=True)
        mark = uuid.uuid4().hex[:12]
        argv, env = engine.command(
            train_command(settings, seed, os.path.join(run_dir, "ckpt")), mark,
            self.args.stall_timeout, max_restarts, host_wait=self.args.host_wait)
        job = JobRun(argv, os.path.join(run_dir, "launcher.log"), env=env)
        self.running = (job, mark)
        return job, mark

    def _finish(self, job: JobRun, mark: str, result: ConfigResult, name: str,
                engine: Engine):
        result.marks[name] = mark
        code = job.wait(self.args.job_timeout)
        if code is None:
            result.leftovers.append("%s: launcher still running after %g s, killed"
                                    % (name, self.args.job_timeout))
            job.kill()
        continue_stopped(mark)
        left = kill_job_processes(mark)
        if left:
            result.leftovers.append("%s: %d process(es) of the job left, killed" % (name, len(left)))
        result.leftovers += ["%s: %s" % (name, what) for what in engine.leftovers()]
        iterations, val = job.final()
        result.final_iterations[name] = iterations
        result.val_acc[name] = val
        return job.proc.returncode

    def _plain_run(self, config, name, settings, seed, engine, result):
        self.log("%s: %s run (seed %d)" % (config, name, seed))
        job, mark = self._start(config, name, settings, seed, engine, 0)
        code = self._finish(job, mark, result, name, engine)
        seconds = job.ended - job.started if job.ended else None
        self.log("%s: %s run exit %s in %.0f s, final val %s" % (
            config, name, code, seconds or -1, result.val_acc.get(name)))
        return job, seconds

    def _faulted_run(self, config, settings, engine, rng, result):
        args = self.args
        kinds = plan_kinds(rng, args.faults_per_job, args.kinds, engine.where)
        self.log("%s: faulted run, faults planned: %s" % (config, ", ".join(kinds)))
        job, mark = self._start(config, "faulted", settings, args.seed, engine,
                                args.faults_per_job + 3)
        injector = Injector(mark, rng, engine.hosts, link_down_s=args.link_down_factor
                            * args.stall_timeout, slurm=engine.slurm)
        try:
            ready, beyond = job.started, args.checkpoint_every
            for index, kind in enumerate(kinds):
                record = FaultRecord(config, index, kind)
                result.faults.append(record)
                if not self._inject(job, injector, record, rng, ready, beyond, settings):
                    break
                self.log("%s: fault %d %s -> %s at iteration %s" % (
                    config, index, kind, record.target, record.iteration_at_fault))
                self._await_recovery(job, record)
                self.log("%s: fault %d %s" % (config, index, "recovered: training again after "
                                              "%.1f s, %s steps recomputed" % (
                                                  record.fault_to_training_s,
                                                  record.steps_recomputed)
                                              if record.recovered else "NOT recovered: "
                                              + record.note))
                if not record.recovered:
                    break
                ready = job.started + record.training_again_s
                beyond = job.last_iteration() or 0
        finally:
            injector.close()
        result.exit_code = self._finish(job, mark, result, "faulted", engine)
        result.faulted_seconds = job.ended - job.started if job.ended else None
        result.restarts = len([1 for _, line in job.snapshot()
                               if line.startswith("cpsgd-launch: restart ")])
        self.log("%s: faulted run exit %s after %d restarts, final val %s" % (
            config, result.exit_code, result.restarts, result.val_acc.get("faulted")))

    def _inject(self, job, injector, record, rng, ready, beyond, settings) -> bool:
        """Wait until training progresses past ``beyond`` after ``ready``, then a
        seeded random delay; deliver the fault.  False: the job ended or is too
        near its end (the fault is recorded as not injected)."""
        args = self.args
        deadline = time.monotonic() + RECOVERY_LIMIT_S
        while job.running and job.progressed_after(ready, beyond) is None:
            if time.monotonic() > deadline:
                record.note = "training did not progress; not injected"
                return False
            time.sleep(0.1)
        wait = time.monotonic() + rng.uniform(args.min_delay, args.max_delay)
        while job.running and time.monotonic() < wait:
            time.sleep(0.05)
        last = job.last_iteration() or 0
        if not job.running or last > settings.iterations - args.end_margin:
            record.note = "not injected: the job %s" % (
                "ended" if not job.running else "is within %d iterations of its end"
                % args.end_margin)
            return False
        for _ in range(50):  # between two attempts nothing may be there to hit
            try:
                delivered = injector.inject(record.kind)
                break
            except NoTarget as err:
                record.note = str(err)
                time.sleep(0.1)
        else:
            return False
        record.note = ""
        record.target = delivered.target
        record.injected_s = delivered.at - job.started
        record.iteration_at_fault = job.last_iteration(delivered.at)
        return True

    def _await_recovery(self, job: JobRun, record: FaultRecord) -> None:
        """Wait for the restart, the resume and the first new iteration.  A link
        that comes back before the launcher noticed it (the 4x allowance of a
        checkpoint or an evaluation in progress) may be survived without a
        restart: then training going on past the fault's iteration after the
        link is up again, with no restart for a stall timeout more (or up to
        the job's successful end), counts.  So does a killed slurmd (the steps
        run on without it): training going on after the fault, with no restart
        until a stall timeout after the slurmd is back (or the job's end)."""
        at = job.started + record.injected_s
        deadline = at + RECOVERY_LIMIT_S
        back = at + self.args.link_down_factor * self.args.stall_timeout \
            if record.kind in TEMPORARY_KINDS else None
        since = back if record.kind == "link-down" else at
        restart = resumed = progressed = survived = None
        while time.monotonic() < deadline:
            restart = restart or job.restart_after(at)
            if restart and not resumed:
                resumed = job.resumed_after(restart[0])
            if resumed:
                progressed = job.progressed_after(resumed[0], resumed[1])
                if progressed:
                    break
            ended = not job.running
            if not restart and back is not None and (ended or time.monotonic() > back):
                went_on = job.progressed_after(at if ended else since,
                                               record.iteration_at_fault or 0)
                if went_on and (time.monotonic() > max(back, went_on[0])
                                + self.args.stall_timeout
                                or (ended and job.proc.returncode == 0)):
                    survived = went_on
                    break
            if ended:
                break
            time.sleep(0.1)
        if survived:
            record.training_again_s = survived[0] - job.started
            record.fault_to_training_s = round(survived[0] - at, 3)
            record.steps_recomputed = 0
            record.recovered = True
            record.note = "no restart: training went on %s" % (
                "when the link came back" if record.kind == "link-down"
                else "without the slurmd")
            return
        if restart:
            record.restart = restart[1]
            record.detected_s = restart[0] - job.started
            record.last_iteration_before_restart = job.last_iteration(restart[0])
        if resumed:
            record.resumed_from = resumed[1]
        if progressed:
            record.training_again_s = progressed[0] - job.started
            record.fault_to_training_s = round(progressed[0] - at, 3)
            record.steps_recomputed = max(0, (record.last_iteration_before_restart or 0)
                                          - resumed[1])
            record.recovered = True
        else:
            record.note = "no %s within %g s" % (
                "restart" if not restart else "resume" if not resumed else "new iteration",
                RECOVERY_LIMIT_S) if job.running else "the job ended (exit %s)" % (
                job.proc.returncode,)

    def close(self) -> None:
        """Stop a run still under way (the campaign interrupted), then the engines."""
        if self.running is not None and self.running[0].running:
            job, mark = self.running
            job.kill()
            continue_stopped(mark)
            kill_job_processes(mark)
        for engine in self.engines.values():
            engine.close()
        self.engines = {}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mxnet_cpsgd.bench.faults",
        description="Fault campaign: real training jobs (LeNet-5, mnist-5k, 2 workers) "
                    "under a seeded fault injector, compared with uninterrupted runs.")
    parser.add_argument("--out", required=True, help="results directory")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="comma-separated, of %s (default: %s)" % (
                            ", ".join(CONFIGS + ENGINE_CONFIGS), ",".join(CONFIGS)))
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="fault kinds, comma-separated, of %s (default: all)"
                             % ", ".join(KINDS))
    parser.add_argument("--faults-per-job", type=int, default=6,
                        help="faults injected into each faulted run (default 6)")
    parser.add_argument("--seed", type=int, default=1,
                        help="the reference run's training seed, also the fault plan's "
                             "(default 1)")
    parser.add_argument("--iters", type=int, default=3000,
                        help="training iterations of every run (default 3000)")
    parser.add_argument("--checkpoint-every", type=int, default=10,
                        help="the faulted runs' checkpoint interval in iterations "
                             "(default 10)")
    parser.add_argument("--stall-timeout", type=float, default=8.0,
                        help="the faulted runs' cpsgd-launch --stall-timeout in seconds "
                             "(default 8)")
    parser.add_argument("--host-wait", type=float, default=0.0,
                        help="the faulted runs' cpsgd-launch --host-wait (default 0)")
    parser.add_argument("--link-down-factor", type=float, default=1.5,
                        help="link-down lasts this many stall timeouts (default 1.5)")
    parser.add_argument("--min-delay", type=float, default=3.0,
                        help="least seconds of training between recovery and fault "
                             "(default 3)")
    parser.add_argument("--max-delay", type=float, default=12.0,
                        help="most seconds of training between recovery and fault "
                             "(default 12)")
    parser.add_argument("--end-margin", type=int, default=150,
                        help="no fault within this many iterations of the end (default 150)")
    parser.add_argument("--job-timeout", type=float, default=3000.0,
                        help="seconds any one run may take (default 3000)")
    parser.add_argument("--repeat-reference", action="store_true",
                        help="cpsgd: also repeat the uninterrupted reference run")
    parser.add_argument("--no-seed-spread", action="store_true",
                        help="no run of seed --seed + 1 (default: one for every "
                             "algorithm but ssgd and horovod)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.kinds = [k for k in args.kinds.split(",") if k]
    for c in args.configs:
        if c not in CONFIGS + ENGINE_CONFIGS:
            parser.error("unknown config %r (known: %s)" % (
                c, ", ".join(CONFIGS + ENGINE_CONFIGS)))
    for k in args.kinds:
        if k not in KINDS:
            parser.error("unknown fault kind %r (known: %s)" % (k, ", ".join(KINDS)))
    if not 0 < args.min_delay <= args.max_delay:
        parser.error("need 0 < --min-delay <= --max-delay")
    return args


def run_campaign(args: argparse.Namespace) -> List[ConfigResult]:
    campaign = Campaign(args)
    results: List[ConfigResult] = []
    started = time.time()
    try:
        for index, config in enumerate(args.configs):
            results.append(campaign.run_config(config, index))
            fault_report.write(campaign.out, [asdict(r) for r in results], vars(args),
                               started, time.time())
    finally:
        made = [n for engine in campaign.engines.values() for n in engine.netns]
        campaign.close()
    # the namespaces of this campaign's emulated hosts still there after the teardown
    left = sorted(set(made) & set(namespaces() or []))
    fault_report.write(campaign.out, [asdict(r) for r in results], vars(args), started,
                       time.time(), namespaces_left=left)
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM tears down as Ctrl-C does: the run under way, the emulated clusters
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results = run_campaign(args)
    path = os.path.join(os.path.abspath(args.out), fault_report.MARKDOWN)
    with open(path) as f:
        print(f.read())
    ok = all(r.exit_code == 0 and all(f.recovered for f in r.faults if f.injected_s is not None)
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
