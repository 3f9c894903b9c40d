"""The fast tier's list (tests/tiers.py) names tests that exist and leaves no test
module out without a reason."""
import ast
import fnmatch
import os
import re
import subprocess
import sys

import tiers

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _test_functions(module):
    with open(os.path.join(TESTS_DIR, module)) as f:
        tree = ast.parse(f.read())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def _test_modules():
    return sorted(name for name in os.listdir(TESTS_DIR)
                  if name.startswith("test_") and name.endswith(".py"))


def test_every_test_module_is_in_a_tier_or_says_why_not():
    modules = set(_test_modules())
    assert not set(tiers.FAST) & set(tiers.NO_FAST)
    assert sorted(modules - set(tiers.FAST) - set(tiers.NO_FAST)) == []
    assert sorted((set(tiers.FAST) | set(tiers.NO_FAST)) - modules) == []


def test_every_pattern_names_a_test():
    for module, patterns in tiers.FAST.items():
        functions = _test_functions(module)
        kept = {f for f in functions if tiers.is_fast(module, f, f)}
        assert kept or any("[" in p for p in patterns), (module, "no fast test")
        for pattern in patterns:
            bare = pattern.lstrip("!").partition("[")[0]
            assert fnmatch.filter(functions, bare), (module, pattern, "matches no test")


def test_parametrized_entries_exist():
    """A pattern with parameters must name a collected test exactly."""
    ids = ["tests/%s::%s" % (module, pattern.lstrip("!"))
           for module, patterns in tiers.FAST.items() for pattern in patterns
           if "[" in pattern]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider"] + ids,
                          cwd=os.path.dirname(TESTS_DIR), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for node in ids:
        assert node in proc.stdout, (node, proc.stdout[-3000:])


#: what a test module that builds emulated hosts uses (namespaces, sshd, Slurm, MPI)
HOST_SIGNS = re.compile(r"make_hosts|EmulatedHosts|emulated_hosts|emulated_slurm|"
                        r"netns|sshd|slurm|mpirun|cluster import hosts|cluster\.hosts")


def test_every_module_that_builds_hosts_runs_in_the_host_lane():
    """Two modules that build hosts must not run side by side (scripts/run_tests.sh
    runs the host lane beside the other one): every module showing a sign of it is
    in tiers.HOST_LANE, and every entry there is a test module."""
    modules = _test_modules()
    building = set()
    for module in modules:
        with open(os.path.join(TESTS_DIR, module)) as f:
            if HOST_SIGNS.search(f.read()):
                building.add(module)
    building.discard("test_tiers.py")  # this file names the signs
    assert sorted(building - set(tiers.HOST_LANE)) == []
    assert sorted(set(tiers.HOST_LANE) - set(modules)) == []
    # guests are loopback modules: one that builds hosts belongs in HOST_LANE itself
    assert sorted(set(tiers.HOST_LANE_GUESTS) - set(modules)) == []
    assert sorted(set(tiers.HOST_LANE_GUESTS) & building) == []
