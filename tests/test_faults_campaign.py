"""The short version of the fault campaign (python -m mxnet_cpsgd.bench.faults;
reports/perf/faults-campaign-results.md has the full one).

A real 2-worker ssgd job (LeNet-5, mnist-5k, 1 server, this machine) under
cpsgd-launch --max-restarts, checkpoints every 10 iterations, gets three faults
of different kinds from the seeded injector, one at a time while it trains:
SIGKILL of a worker, SIGSTOP of the server (only the stall timeout can notice
it), SIGKILL of the scheduler.  Every fault must be followed by a restart, a
resume from a checkpoint and new iterations; the job must end with exit 0 and
its final weights must equal, bit for bit, those of an uninterrupted run of the
same seed.  Nothing of either job may be left.  No timing is asserted (the
machine is shared); the figures are printed.
"""
import json
import re
import subprocess

import pytest

from mxnet_cpsgd.bench import fault_report
from mxnet_cpsgd.bench.fault_injector import job_processes, plan_kinds
from mxnet_cpsgd.bench.faults import main, parse_args

try:  # a generous per-test bound where pytest-timeout is installed
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(600)]
except ImportError:
    pytestmark = []

KINDS = ["kill-worker", "stop-server", "kill-scheduler"]


def _netns():
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    except OSError:
        return set()
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_plan_covers_every_kind_once_and_is_seeded():
    import random
    kinds = ["kill-worker", "stop-server", "drop-ssh", "link-down"]
    local = plan_kinds(random.Random(1), 2, kinds, "local")
    assert sorted(local) == ["kill-worker", "stop-server"]
    hosts = plan_kinds(random.Random(1), 2, kinds, "hosts")
    assert sorted(hosts) == ["drop-ssh", "link-down"]  # the host kinds come first
    assert plan_kinds(random.Random(3), 7, kinds, "hosts") == \
        plan_kinds(random.Random(3), 7, kinds, "hosts")
    assert set(plan_kinds(random.Random(3), 7, kinds, "hosts")) == set(kinds)
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--kinds", "kill-everything"])


def test_short_campaign_recovers_every_fault_bit_identically(tmp_path, capsys):
    out = tmp_path / "campaign"
    code = main(["--out", str(out), "--configs", "ssgd-local", "--kinds", ",".join(KINDS),
                 "--faults-per-job", "3", "--iters", "300", "--checkpoint-every", "10",
                 "--stall-timeout", "4", "--min-delay", "0.5", "--max-delay", "1.5",
                 "--end-margin", "60"])
    printed = capsys.readouterr().out
    with open(out / fault_report.JSON) as f:
        report = json.load(f)
    (config,) = report["configs"]
    faults = config["faults"]
    print("\n".join("%s -> %s at iteration %s: training again after %s s, %s steps recomputed"
                    % (f["kind"], f["target"], f["iteration_at_fault"],
                       f["fault_to_training_s"], f["steps_recomputed"]) for f in faults))
    assert code == 0, printed[-4000:]
    assert sorted(f["kind"] for f in faults) == sorted(KINDS), faults
    for f in faults:
        assert f["recovered"], f
        assert f["restart"] is not None and f["resumed_from"] is not None, f
        assert f["steps_recomputed"] >= 0 and f["fault_to_training_s"] > 0, f
    assert [f["restart"] for f in faults] == [1, 2, 3]
    assert config["exit_code"] == 0 and config["restarts"] == 3
    assert config["final_iterations"] == {"reference": 300, "faulted": 300}
    cmp = config["comparison"]["faulted_vs_reference"]
    assert cmp["bit_identical"] and cmp["max_abs_diff"] == 0.0, cmp
    assert config["val_acc"]["faulted"] == config["val_acc"]["reference"]
    summary = report["summary"]
    assert summary["faults_injected"] == summary["faults_recovered"] == 3
    assert summary["jobs_recovered"] == 1
    assert config["leftovers"] == []
    assert "| ssgd-local | faulted_vs_reference | yes |" in \
        (out / fault_report.MARKDOWN).read_text()
    # the teardown: no process of either run, no namespace made by them (the networks
    # their launchers name; other jobs on this machine may make and remove their own)
    networks = set()
    for run in ("reference", "faulted"):
        with open(out / "ssgd-local" / run / "launcher.log") as f:
            text = f.read()
        assert "job finished successfully" in text
        networks.update(re.findall(r"emulated network (cpsgd[0-9a-f]{5})", text))
    for run, mark in config["marks"].items():
        assert job_processes(mark) == [], "processes of the %s run left" % run
    assert [ns for ns in _netns() if ns.split("-")[0] in networks] == []


def test_every_engine_gets_its_own_kinds_and_launcher():
    import random
    from mxnet_cpsgd.bench.fault_engines import Engine, engine_of
    from mxnet_cpsgd.bench.fault_injector import ENGINE_KINDS, KINDS as ALL
    for engine, kinds in ENGINE_KINDS.items():
        plan = plan_kinds(random.Random(2), len(kinds) + 2, ALL, engine)
        assert set(plan) == set(kinds), (engine, plan)  # each once, then draws of them
    assert set(ENGINE_KINDS["slurm"]) == {"kill-slurmd", "kill-step", "link-down"}
    assert set(ENGINE_KINDS["allreduce"]) == {"kill-rank", "stop-rank"}
    with pytest.raises(ValueError):
        plan_kinds(random.Random(1), 2, ["drop-ssh"], "allreduce")
    assert engine_of("horovod-allreduce") == ("horovod", "allreduce")
    assert parse_args(["--out", "x", "--configs", "fp16-allreduce,ssgd-slurm"]).configs == \
        ["fp16-allreduce", "ssgd-slurm"]
    argv, env = Engine("mpi").command(["train"], "m1", 8, 3)
    assert argv[argv.index("--launcher") + 1] == "mpi" and argv[-2:] == ["--", "train"]
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    argv, env = Engine("allreduce").command(["train"], "m1", 8, 3)
    assert "--allreduce" in argv and "-s" not in argv
    assert argv[argv.index("--max-restarts") + 1] == "3" and env == {"CPSGD_FAULT_MARK": "m1"}


def test_slurm_campaign_survives_a_killed_slurmd(tmp_path):
    """ssgd in an emulated Slurm cluster (salloc, cpsgd-launch --launcher slurm,
    every node an srun step): a node's slurmd SIGKILLed and started again (the
    steps run on without it).  Weights bit-identical, no job, step or process
    left, the cluster's namespaces gone.  (A killed step's restart from the newest
    checkpoint is test_slurm's; the campaign's other engines and kinds are too slow
    for the suite: reports/perf/faults-campaign-engines-results.md has them.)"""
    from mxnet_cpsgd.cluster.emulated_slurm import SlurmUnavailable, check_available
    try:
        check_available()
    except SlurmUnavailable as err:
        pytest.skip(str(err))
    out = tmp_path / "campaign"
    code = main(["--out", str(out), "--configs", "ssgd-slurm", "--kinds",
                 "kill-slurmd", "--faults-per-job", "1", "--iters", "200",
                 "--checkpoint-every", "10", "--stall-timeout", "4", "--min-delay", "0.5",
                 "--max-delay", "1.5", "--end-margin", "60"])
    with open(out / fault_report.JSON) as f:
        report = json.load(f)
    (config,) = report["configs"]
    faults = {f["kind"]: f for f in config["faults"]}
    assert code == 0, (out / fault_report.MARKDOWN).read_text()
    assert sorted(faults) == ["kill-slurmd"], config["faults"]
    assert faults["kill-slurmd"]["recovered"], faults
    assert faults["kill-slurmd"]["restart"] is None, faults  # the steps ran on
    assert config["comparison"]["faulted_vs_reference"]["bit_identical"], config["comparison"]
    assert config["leftovers"] == [] and report["summary"]["namespaces_left"] == []
    for run, mark in config["marks"].items():
        assert job_processes(mark) == [], "processes of the %s run left" % run
