"""cpsgd-reproduce: spec expansion, resumability, and one tiny grid end to end.

The end-to-end test runs LeNet on synthetic MNIST-shaped data, 2 workers + 1
server, S-SGD and CP-SGD (2 epochs of 3 iterations, warm-up 2 iterations), through
the real launcher, and checks the report it writes.
"""
import json
import os
import shutil
import sys
import time

import pytest
import yaml

from mxnet_cpsgd.repro import logs, markdown, report
from mxnet_cpsgd.repro.logs import load_runs, read_run
from mxnet_cpsgd.repro import runner as reproduce

SPEC = {
    "name": "tiny",
    "title": "tiny grid",
    "script": "scripts/train_mnist.py",
    "args": {"dataset": "mnist-5k", "synthetic": True, "synthetic-batches": 3,
             "num-epochs": 2, "batch-size": 16, "val-split": "shard", "quiet": True},
    "env": {"OMP_NUM_THREADS": 1, "MXNET_CPU_WORKER_NTHREADS": 1},
    "workers": [2],
    "seeds": [7],
    "job_timeout": 80,
    "timeout": 20,
    "runs": [{"label": "SSGD", "algorithm": "ssgd"},
             {"label": "k{correction_period}", "algorithm": "cpsgd", "warmup_steps": 2,
              "grid": {"correction_period": [2]}},
             # an all-reduce store: a Horovod/Gloo job, no scheduler or servers
             {"label": "HVD", "algorithm": "horovod"}],
}


def _spec_file(tmp_path, spec):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


# ----------------------------------------------------------------------------
# expansion

def test_expand_grid_labels_and_order():
    spec = {
        "script": "scripts/train_cifar.py",
        "args": {"num_epochs": 3, "synthetic": True, "no-hybridize": False},
        "seeds": [1, 2],
        "workers": [4, 2],
        "runs": [{"label": "SSGD", "algorithm": "ssgd"},
                 {"label": "k{correction_period}", "algorithm": "cpsgd",
                  "threshold": 0.5, "grid": {"correction_period": [2, 5]}}],
        "experiments": [{"name": "a"},
                        {"name": "b", "rates": ["100mbit"], "seeds": [1],
                         "labels": ["SSGD", "k5"], "args": {"num-epochs": 1}}],
    }
    reproduce.validate_spec(spec)
    plans = reproduce.expand(spec)
    a = [p for p in plans if p.experiment == "a"]
    # seeds outermost, then workers, then runs (grid values in order)
    assert [(p.seed, p.num_workers, p.label) for p in a] == [
        (s, m, l) for s in (1, 2) for m in (4, 2) for l in ("SSGD", "k2", "k5")]
    b = [p for p in plans if p.experiment == "b"]
    assert [(p.label, p.num_workers, p.rate) for p in b] == [
        ("SSGD", 4, "100mbit"), ("k5", 4, "100mbit"), ("SSGD", 2, "100mbit"),
        ("k5", 2, "100mbit")]
    k5 = b[1]
    assert k5.knobs == {"threshold": 0.5, "correction_period": 5}
    assert k5.args["num-epochs"] == 1
    argv = k5.argv("PY", "/out/r")
    assert argv[0] == "PY" and argv[1].endswith(os.path.join("scripts", "train_cifar.py"))
    assert argv[2:] == ["--algorithm", "cpsgd", "--seed", "1", "--num-epochs", "1",
                        "--synthetic", "--threshold", "0.5", "--correction-period", "5",
                        "--log-json", "/out/r/log.json"]
    assert k5.run_id == "b/k5-M4-100mbit-s1"
    assert "--emulate-network 100mbit" in k5.launch_text()
    assert k5.expected_epochs() == 1
    assert len({p.run_id for p in plans}) == len(plans)
    # the report reads run ids back (the experiments table)
    for p in plans:
        assert reproduce.split_run_id(p.run_id) == (
            p.experiment, "%s-M%d-%s" % (p.label, p.num_workers, p.rate or "loopback"), p.seed)
    # the fingerprint ignores where logs go but not what runs
    assert k5.fingerprint() == reproduce.expand(spec)[plans.index(k5)].fingerprint()
    assert k5.fingerprint() != b[3].fingerprint()


@pytest.mark.parametrize("bad, message", [
    ({"runs": [{"algorithm": "ssgd"}]}, "needs 'script'"),
    ({"script": "s.py", "runs": [{"label": "x"}]}, "needs an 'algorithm'"),
    ({"script": "s.py", "runs": [{"algorithm": "ssgd"}], "bogus": 1}, "unknown spec key"),
    ({"script": "s.py"}, "has no 'runs'"),
    ({"script": "s.py", "runs": [{"algorithm": "ssgd"}], "comparisons": {"a": 1}},
     "'comparisons' must be a list"),
    ({"script": "s.py", "runs": [{"algorithm": "ssgd"}],
      "comparisons": [{"experiment": "main", "run": "a"}]}, "exactly the keys"),
    ({"script": "s.py", "runs": [{"algorithm": "ssgd"}],
      "comparisons": [{"experiment": "m9", "run": "a", "vs": "b"}]}, "no experiment 'm9'"),
    ({"script": "s.py", "runs": [{"algorithm": "ssgd"}],
      "comparisons": [{"experiment": "main", "run": "a", "vs": "a"}]}, "two different"),
    ({"script": "s.py", "runs": [{"algorithm": "ssgd"}], "checkpoint_every": 0},
     "checkpoint_every must be a positive"),
    ({"script": "s.py", "experiments": [{"name": "a", "checkpoint_every": "10",
                                         "runs": [{"algorithm": "ssgd"}]}]},
     "checkpoint_every must be a positive"),
])
def test_bad_specs(bad, message):
    with pytest.raises(reproduce.SpecError, match=message):
        reproduce.validate_spec(bad)


_FIG_BASE = {"script": "s.py", "runs": [{"algorithm": "ssgd"}],
             "experiments": [{"name": "m2"}, {"name": "m4"}]}


@pytest.mark.parametrize("figures, message", [
    ({"name": "x"}, "'figures' must be a list"),
    ([{"kind": "curves"}], "with a 'name'"),
    ([{"name": "x", "kind": "pie", "experiment": "m2", "labels": ["a"]}], "kind must be"),
    ([{"name": "x", "kind": "curves", "panels": []}], "non-empty list"),
    ([{"name": "x", "kind": "curves", "panels": [{"experiment": "m8", "labels": ["a"]}]}],
     "no experiment 'm8'"),
    ([{"name": "x", "kind": "paired", "experiment": "m2"}], "'labels' must be"),
    ([{"name": "x", "kind": "paired", "experiment": "m2", "labels": ["a"]},
      {"name": "x", "kind": "paired", "experiment": "m4", "labels": ["a"]}], "used twice"),
])
def test_bad_figures(figures, message):
    reproduce.validate_spec(dict(_FIG_BASE, figures=[
        {"name": "ok", "kind": "curves", "panels": [{"experiment": "m4", "labels": ["a"]}]}]))
    with pytest.raises(reproduce.SpecError, match=message):
        reproduce.validate_spec(dict(_FIG_BASE, figures=figures))


def test_duplicate_and_reserved():
    spec = {"script": "s.py", "runs": [{"algorithm": "ssgd"}, {"algorithm": "ssgd"}]}
    with pytest.raises(reproduce.SpecError, match="share an id"):
        reproduce.expand(spec)
    spec = {"script": "s.py", "args": {"seed": 3}, "runs": [{"algorithm": "ssgd"}]}
    with pytest.raises(reproduce.SpecError, match="set by cpsgd-reproduce"):
        reproduce.expand(spec)
    spec = {"script": "s.py", "runs": [{"algorithm": "cpsgd", "label": "k{nope}"}]}
    with pytest.raises(reproduce.SpecError, match="cannot fill in"):
        reproduce.expand(spec)


def test_shipped_specs_expand():
    specs_dir = os.path.join(reproduce.PROJECT_ROOT, "specs")
    names = sorted(n for n in os.listdir(specs_dir) if n.endswith((".yaml", ".yml", ".json")))
    assert {"lenet-mnist.yaml", "resnet20-cifar10.yaml", "inception-bn-cifar10.yaml",
            "resnet50-imagenet.yaml", "lenet-fashion-local.yaml"} <= set(names)
    for name in names:
        spec = reproduce.load_spec(os.path.join(specs_dir, name))
        plans = reproduce.expand(spec)
        assert plans, name
        for p in plans:
            assert os.path.isfile(reproduce.resolve_script(p.script)), (name, p.script)
    # the paper's Te/Tc grid: SSGD, BIT, k2, k5, k10, k20 for M=2 and M=4
    spec = reproduce.load_spec(os.path.join(specs_dir, "resnet20-cifar10.yaml"))
    timing = {(p.label, p.num_workers) for p in reproduce.expand(spec)
              if p.experiment == "te-tc"}
    assert timing == {(l, m) for l in ("SSGD", "BIT", "k2", "k5", "k10", "k20")
                      for m in (2, 4)}


def test_knobs_are_accepted_by_the_training_scripts():
    """Every knob a shipped spec passes is a flag the scripts know, for an
    algorithm that accepts it (the scripts reject the others)."""
    from mxnet_cpsgd.training import options
    specs_dir = os.path.join(reproduce.PROJECT_ROOT, "specs")
    for name in os.listdir(specs_dir):
        spec = reproduce.load_spec(os.path.join(specs_dir, name))
        for p in reproduce.expand(spec):
            accepted = options.accepted_knobs(p.algorithm)
            for knob in p.knobs:
                assert knob in options.KNOB_FLAGS, (name, knob)
                assert knob in accepted, (name, p.run_id, knob)


# ----------------------------------------------------------------------------
# resumability and emulation policy, without training

def _fake_logs(run_dir, workers, epochs):
    os.makedirs(run_dir, exist_ok=True)
    for rank in range(workers):
        name = "log.json" if rank == 0 else "log.rank%d.json" % rank
        with open(os.path.join(run_dir, name), "w") as f:
            for e in range(epochs):
                f.write(json.dumps({"epoch": e, "rank": rank, "val_acc": 0.5,
                                    "epoch_time": 1.0, "comm_time": 0.5}) + "\n")


def test_run_is_complete(tmp_path):
    plan = reproduce.expand(SPEC)[0]
    out = str(tmp_path)
    run_dir = plan.directory(out)
    assert not reproduce.run_is_complete(plan, run_dir)
    _fake_logs(run_dir, 2, 2)
    assert not reproduce.run_is_complete(plan, run_dir)   # no run.json
    logs.write_json(os.path.join(run_dir, "run.json"),
                          reproduce.run_meta(plan, status="ok"))
    assert reproduce.run_is_complete(plan, run_dir)
    _fake_logs(run_dir, 2, 1)                               # an epoch missing
    assert not reproduce.run_is_complete(plan, run_dir)
    _fake_logs(run_dir, 2, 2)
    os.remove(os.path.join(run_dir, "log.rank1.json"))      # a rank missing
    assert not reproduce.run_is_complete(plan, run_dir)
    _fake_logs(run_dir, 2, 2)
    changed = dict(SPEC, args=dict(SPEC["args"], lr=0.5))   # another command
    assert not reproduce.run_is_complete(reproduce.expand(changed)[0], run_dir)


def test_no_emulation_skip_and_fail(tmp_path):
    spec = dict(SPEC, rates=["100mbit"])
    plan = reproduce.expand(spec)[0]
    meta = reproduce.execute(plan, str(tmp_path), sys.executable, "skip",
                             emulation_error="needs root")
    assert meta["status"] == "skipped" and "needs root" in meta["failure"]
    meta = reproduce.execute(plan, str(tmp_path), sys.executable, "fail",
                             emulation_error="needs root")
    assert meta["status"] == "failed"
    with open(os.path.join(plan.directory(str(tmp_path)), "run.json")) as f:
        assert json.load(f)["status"] == "failed"


def test_dry_run_and_report_only_cli(tmp_path, capsys):
    spec = _spec_file(tmp_path, SPEC)
    out = str(tmp_path / "out")
    assert reproduce.main([spec, "-o", out, "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[1].startswith("main/k2-M2-loopback-s7: python -m "
                                                   "mxnet_cpsgd.launch -n 2 -s 1")
    assert lines[2].startswith("main/HVD-M2-loopback-s7: horovodrun -np 2 -H localhost:2")
    assert not os.path.exists(out)
    with pytest.raises(SystemExit):
        reproduce.main(["--report-only", "-o", out])          # no such directory
    _fake_logs(os.path.join(out, "runs", "main", "x"), 2, 2)
    assert reproduce.main(["--report-only", "-o", out]) == 0
    assert os.path.isfile(os.path.join(out, "report.md"))


# ----------------------------------------------------------------------------
# end to end

def test_tiny_grid_end_to_end(tmp_path):
    spec_path = _spec_file(tmp_path, SPEC)
    out = str(tmp_path / "out")
    started = time.monotonic()
    # --allow-dirty: the tree under test may have uncommitted changes
    code = reproduce.main([spec_path, "-o", out, "--allow-dirty"])
    elapsed = time.monotonic() - started
    runs_dir = os.path.join(out, "runs", "main")
    outputs = ""
    for name in sorted(os.listdir(runs_dir)):
        path = os.path.join(runs_dir, name, "output.log")
        if os.path.isfile(path):
            with open(path) as f:
                outputs += "--- %s ---\n%s" % (name, f.read()[-3000:])
    assert code == 0, outputs
    assert elapsed < 150, "took %.0f s" % elapsed   # a hang guard, not a timing
    for run_id in ("SSGD-M2-loopback-s7", "k2-M2-loopback-s7", "HVD-M2-loopback-s7"):
        run = read_run(os.path.join(runs_dir, run_id))
        assert run.meta["status"] == "ok" and run.meta["allow_dirty"] is True
        assert sorted(run.records) == [0, 1]
        for lines in run.records.values():
            assert [r["epoch"] for r in lines] == [0, 1]
            assert all(r["iterations"] == 3 for r in lines)
    assert read_run(os.path.join(runs_dir, "k2-M2-loopback-s7")).meta["knobs"] == {
        "warmup_steps": 2, "correction_period": 2}
    hvd = read_run(os.path.join(runs_dir, "HVD-M2-loopback-s7")).meta
    assert hvd["launch_text"].startswith("horovodrun -np 2 -H localhost:2 --gloo "), hvd
    with open(os.path.join(runs_dir, "HVD-M2-loopback-s7", "output.log")) as f:
        assert "rendezvous: serving 2 slots" in f.read()   # horovod, not ps-lite
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert "| main | SSGD | 2 | loopback |" in md
    assert "| main | k2 | 2 | loopback |" in md
    assert "| main | HVD | 2 | loopback |" in md
    assert "|  | SSGD | k2 |" in md             # the Te/Tc table
    assert "cpsgd-reproduce %s -o %s" % (spec_path, out) in md
    png = os.path.join(out, markdown.figure_name("curves", "main", 2, None))
    assert os.path.getsize(png) > 1000
    # a second invocation finds every run complete and runs nothing (so a dirty
    # tree is no reason to refuse it)
    started = time.monotonic()
    assert reproduce.main([spec_path, "-o", out]) == 0
    assert time.monotonic() - started < 20


def test_interrupted_run_resumes_from_its_checkpoint(tmp_path):
    """A run of an experiment with checkpoint_every, stopped by SIGTERM after its
    first checkpoint, goes on from its newest checkpoint when the same command
    runs again; killed by SIGKILL in that second sitting after a newer checkpoint,
    it goes on from that one: its logs reach the last iteration, run.json lists
    the three sittings (the killed one too), the report says so, and the
    checkpoints are removed once it is complete."""
    import signal
    import subprocess
    from mxnet_cpsgd.training.checkpoint import newest_complete
    spec = dict(SPEC, runs=[{"label": "k2", "algorithm": "cpsgd", "warmup_steps": 5,
                             "correction_period": 2}],
                args=dict(SPEC["args"], **{"synthetic-batches": 150}), checkpoint_every=10)
    spec_path = _spec_file(tmp_path, spec)
    out = str(tmp_path / "out")
    plan = reproduce.expand(spec)[0]
    run_dir = plan.directory(out)
    checkpoints = os.path.join(run_dir, reproduce.CHECKPOINTS_DIR)
    assert "--checkpoint-every 10" in plan.command_text()
    env = dict(os.environ, PYTHONPATH=reproduce.PROJECT_ROOT)
    cmd = [sys.executable, "-m", "mxnet_cpsgd.repro", spec_path, "-o", out, "--allow-dirty"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
    try:
        deadline = time.monotonic() + 120
        # stop once a checkpoint is complete (every rank's files and their hashes):
        # rank 0's checkpoint.json alone can come before rank 1 has written its states
        while time.monotonic() < deadline and first.poll() is None:
            if os.path.isdir(checkpoints) and newest_complete(checkpoints) is not None:
                break
            time.sleep(0.05)
        assert first.poll() is None, "the run ended before its first complete checkpoint"
        first.send_signal(signal.SIGTERM)
        text = first.communicate(timeout=60)[0]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 130, text
    stopped = read_run(run_dir).meta
    assert stopped["status"] == "failed" and stopped.get("interrupted"), stopped
    assert len(stopped["sittings"]) == 1
    point = reproduce.resume_point(plan, run_dir)
    assert point is not None, os.listdir(checkpoints)
    resumed_at = int(os.path.basename(point["checkpoint"]).split("-")[1])
    assert 10 <= resumed_at < 300

    # the second sitting is SIGKILLed (no chance to write its end) after a newer
    # checkpoint: run.json still says "running", and the third sitting resumes
    second = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and second.poll() is None:
            newest = newest_complete(checkpoints) if os.path.isdir(checkpoints) else None
            if newest is not None and newest != point["checkpoint"]:
                break
            time.sleep(0.05)
        assert second.poll() is None, "the second sitting ended before a new checkpoint"
        second.kill()
        second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    killed = read_run(run_dir).meta
    assert killed["status"] == "running" and killed["pid"] == second.pid, killed
    _wait_for_no_job(run_dir)
    point2 = reproduce.resume_point(plan, run_dir)
    assert point2 is not None and point2["checkpoint"] != point["checkpoint"]
    resumed_again = int(os.path.basename(point2["checkpoint"]).split("-")[1])
    assert resumed_at < resumed_again < 300

    killed_last_write = os.path.getmtime(os.path.join(run_dir, "output.log"))
    time.sleep(1.1)  # run.json's times have whole seconds
    code = reproduce.main([spec_path, "-o", out, "--allow-dirty"])
    with open(os.path.join(run_dir, "output.log")) as f:
        output = f.read()
    assert code == 0, output[-3000:]
    assert "resuming from %s" % point["checkpoint"] in output
    assert "resuming from %s" % point2["checkpoint"] in output
    run = read_run(run_dir)
    assert run.meta["status"] == "ok"
    sittings = run.meta["sittings"]
    assert [s["resumed_from_iteration"] for s in sittings] == [None, resumed_at,
                                                               resumed_again]
    assert [s["status"] for s in sittings] == ["failed", "killed", "ok"]
    assert sittings[1]["wall_time"] > 0 and sittings[1]["finished"]
    # the killed sitting ended at its own last write, not at the third sitting's
    import datetime
    killed_end = datetime.datetime.fromisoformat(sittings[1]["finished"]).timestamp()
    assert killed_end <= killed_last_write < datetime.datetime.fromisoformat(
        sittings[2]["started"]).timestamp(), sittings
    assert run.meta["wall_time"] == pytest.approx(
        sum(s["wall_time"] for s in sittings), abs=0.03)
    for lines in run.records.values():
        assert lines[-1]["epoch"] == 1 and lines[-1]["total_iterations"] == 300
    assert not os.path.exists(checkpoints)
    md = report.generate(out, plots=False).markdown
    assert "3 sittings, resumed at iterations %d, %d" % (resumed_at, resumed_again) in md
    # complete now: the same command runs nothing
    assert reproduce.main([spec_path, "-o", out]) == 0
    assert len(read_run(run_dir).meta["sittings"]) == 3


def _wait_for_no_job(run_dir, wait=30):
    """The killed sitting's job nodes die with it (parent-death signal); wait until
    none of them (a process with the run directory in its command line) is left."""
    deadline = time.monotonic() + wait
    while _pids_with_arg(run_dir):
        if time.monotonic() > deadline:
            raise AssertionError("the killed sitting's job is still running: %s"
                                 % _pids_with_arg(run_dir))
        time.sleep(0.2)


def _pids_with_arg(text):
    from mxnet_cpsgd.cluster import procfs
    found = []
    for pid in procfs.pids():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if text.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return [p for p in found if procfs.alive(p)]


def test_a_run_another_process_is_running_is_left_alone(tmp_path):
    """A run whose run.json says "running" for a live process on this host is
    skipped with a message naming that process (its files untouched, exit 1); marked
    so by another host, it is taken over with a warning (here: nothing to resume
    from, so it starts afresh)."""
    import subprocess
    spec = dict(SPEC, runs=SPEC["runs"][:1], checkpoint_every=10)
    out = str(tmp_path / "out")
    plan = reproduce.expand(spec)[0]
    run_dir = plan.directory(out)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.makedirs(os.path.join(run_dir, reproduce.CHECKPOINTS_DIR, "iter-000000010"))
        meta = reproduce.run_meta(plan, status="running", pid=holder.pid,
                                  host=__import__("socket").gethostname(),
                                  sitting_started="2026-01-01T00:00:00+00:00")
        logs.write_json(os.path.join(run_dir, "run.json"), meta)
        lines = []
        code = reproduce.reproduce(spec, out, only=[plan.run_id], allow_dirty=True,
                                   report=False, progress=_Lines(lines))
        assert code == 1
        said = "\n".join(lines)
        assert "skipped: process %d on this host is running it" % holder.pid in said, said
        assert read_run(run_dir).meta["status"] == "running"
        assert os.path.isdir(os.path.join(run_dir, reproduce.CHECKPOINTS_DIR,
                                          "iter-000000010"))
        # the same mark from another host (files moved here, or that host went down):
        # taken over with a warning; no checkpoint is complete, so it starts afresh
        logs.write_json(os.path.join(run_dir, "run.json"), dict(meta, host="elsewhere"))
        assert reproduce.resume_point(plan, run_dir) is None
        lines = []
        code = reproduce.reproduce(spec, out, only=[plan.run_id], allow_dirty=True,
                                   report=False, progress=_Lines(lines))
        said = "\n".join(lines)
        assert code == 0, said
        assert "running on host elsewhere (pid %d" % holder.pid in said
        assert "taking it over" in said
        assert read_run(run_dir).meta["status"] == "ok"
    finally:
        holder.kill()
        holder.wait()


class _Lines:
    """A text stream that keeps what is written, line by line."""

    def __init__(self, lines):
        self.lines = lines

    def write(self, text):
        self.lines.extend(text.splitlines())
        return len(text)

    def flush(self):
        pass


def test_code_version_ignores_the_output_directory(tmp_path):
    """The runner rewrites reproduce.json in its output directory before every run;
    a committed output directory must not make every run look like uncommitted
    code, but a changed file elsewhere must."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path)] + list(args), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    git("init", "-q")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "reproduce.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    clean = reproduce.code_version(str(tmp_path), exclude=str(tmp_path / "out"))
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (tmp_path / "out" / "reproduce.json").write_text('{"command": "again"}')
    assert reproduce.code_version(str(tmp_path), exclude=str(tmp_path / "out"))["dirty"] is False
    assert reproduce.code_version(str(tmp_path))["dirty"] is True
    (tmp_path / "code.py").write_text("x = 2\n")
    assert reproduce.code_version(str(tmp_path), exclude=str(tmp_path / "out"))["dirty"] is True


def test_dirty_tree_is_refused_unless_allowed(tmp_path):
    """cpsgd-reproduce run from a copy of the code in a git checkout with an
    uncommitted change refuses to start runs (exit 2, naming --allow-dirty) and
    writes nothing; once the change is committed the check lets runs start."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path / "code")] + list(args), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code_dir = tmp_path / "code"
    shutil.copytree(os.path.join(reproduce.PROJECT_ROOT, "mxnet_cpsgd"),
                    str(code_dir / "mxnet_cpsgd"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    with open(str(code_dir / "mxnet_cpsgd" / "__init__.py"), "a") as f:
        f.write("# an uncommitted change\n")
    spec_path = _spec_file(tmp_path, dict(SPEC, runs=SPEC["runs"][:1]))
    out = str(tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(code_dir)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

    def python(*args):
        # cwd: python -m / -c import from the current directory first
        return subprocess.run([sys.executable] + list(args), env=env, timeout=120,
                              cwd=str(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    refused = python("-c", "import mxnet_cpsgd.repro.runner as r, sys; "
                     "assert r.__file__.startswith(%r); sys.exit(r.main(%r))"
                     % (str(code_dir), [spec_path, "-o", out]))
    assert refused.returncode == 2, refused.stdout
    assert "uncommitted changes" in refused.stdout and "--allow-dirty" in refused.stdout
    assert "SSGD-M2-loopback-s7" in refused.stdout
    assert not os.path.exists(out)
    # the same check, on the copy's tree once the change is committed, lets runs start
    check = ("import mxnet_cpsgd.repro.gitstate as g; assert g.__file__.startswith(%r); "
             "g.refuse_dirty_tree(['r'], %r); print('clean')" % (str(code_dir), out))
    assert "uncommitted changes" in python("-c", check).stdout
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "d")
    clean = python("-c", check)
    assert clean.returncode == 0 and clean.stdout.strip().endswith("clean"), clean.stdout


def test_failed_attempt_is_kept_and_reported(tmp_path):
    plan = reproduce.expand(SPEC)[0]
    out = str(tmp_path)
    run_dir = plan.directory(out)
    _fake_logs(run_dir, 2, 1)
    logs.write_json(os.path.join(run_dir, "run.json"), reproduce.run_meta(
        plan, status="failed", failure="worker 1 exited with code 1", wall_time=9.0))
    reproduce._clear_logs(run_dir)          # what a rerun does first
    assert not os.path.exists(os.path.join(run_dir, "log.json"))
    kept = os.path.join(run_dir, "attempts", "1")
    assert sorted(os.listdir(kept)) == ["log.json", "log.rank1.json", "run.json"]
    _fake_logs(run_dir, 2, 2)               # the rerun succeeded
    logs.write_json(os.path.join(run_dir, "run.json"),
                          reproduce.run_meta(plan, status="ok"))
    runs = load_runs(out)
    assert len(runs) == 1                   # the attempt is not a run of its own
    assert runs[0].attempts[0]["failure"] == "worker 1 exited with code 1"
    md = report.generate(out, plots=False).markdown
    assert "| main/SSGD-M2-loopback-s7 | 1 | 9 | 1 | worker 1 exited with code 1 |" in md
    reproduce._clear_logs(run_dir)          # a successful run's files are just removed
    assert sorted(os.listdir(run_dir)) == ["attempts"]


def test_every_store_knob_is_recorded_in_run_json():
    """A knob the spec sets reaches run.json's knobs, for every knob a store has (a new
    knob is recorded without editing the runner)."""
    from mxnet_cpsgd.repro.spec import KNOBS
    from mxnet_cpsgd.stores.config import KNOBS as STORE_KNOBS
    assert set(KNOBS) == set(STORE_KNOBS) - {"type"}
    assert {"correction_schedule", "ratio", "rank", "correction_residual"} <= set(KNOBS)


def test_reproduce_json_carries_each_experiments_min_seeds(tmp_path):
    """An experiment's own equivalence_min_seeds reaches reproduce.json, where the
    report reads it (the spec's value stays the default for the others)."""
    spec = dict(SPEC, equivalence_margin=0.5, equivalence_min_seeds=5,
                experiments=[{"name": "short"}, {"name": "long", "equivalence_min_seeds": 3}])
    out = str(tmp_path / "out")
    reproduce.write_reproduce_meta(out, spec, None, "cpsgd-reproduce", reproduce.expand(spec))
    with open(os.path.join(out, "reproduce.json")) as f:
        meta = json.load(f)
    assert report.min_seeds_by_experiment(meta) == {None: 5, "long": 3}
