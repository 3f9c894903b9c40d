"""The package layout: no module imports "upwards" (docs/architecture.md), and no
module is over 500 lines nor any function over 100.

Layers, lowest first (a module may import its own layer and the ones it lists):

    kvstore_ext                       MXNet internals; imports nothing of mxnet_cpsgd
    mxnet_cpsgd.stores                the stores; kvstore_ext only
    mxnet_cpsgd.cluster               starting jobs, emulating networks; kvstore_ext only
                                      (the workers' exit-on-error hook lives there)
    mxnet_cpsgd (__init__), .run      the public API; registers the stores
    mxnet_cpsgd.training              the scripts' loop, data, models; stores, API
    mxnet_cpsgd.bench, .repro         tooling on top; everything below, not each other
    mxnet_cpsgd.launch                alias of cluster.launch

Every import counts, also one inside a function (a lazy import is still a
dependency).  ``python tests/test_layout.py`` prints the measurements: modules
per folder, the largest modules, any upward import, and what is too long.
"""
import ast
import os
import subprocess
import sys
from collections import Counter

from procs import repo_pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("mxnet_cpsgd", "kvstore_ext")

# layer -> the layers it may import (besides itself)
ALLOWED = {
    "kvstore_ext": set(),
    "stores": {"kvstore_ext"},
    "cluster": {"kvstore_ext"},
    "api": {"stores", "kvstore_ext"},
    "training": {"stores", "api", "kvstore_ext"},
    "bench": {"training", "cluster", "stores", "api", "kvstore_ext", "alias"},
    "repro": {"training", "cluster", "stores", "api", "kvstore_ext", "alias"},
    "alias": {"cluster"},
}
SUBPACKAGES = ("stores", "cluster", "training", "bench", "repro")


def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def layer_of(module):
    """The layer of a module name of this project (None: not ours)."""
    parts = module.split(".")
    if parts[0] == "kvstore_ext":
        return "kvstore_ext"
    if parts[0] != "mxnet_cpsgd":
        return None
    if len(parts) == 1:
        return "api"
    if parts[1] == "launch":
        return "alias"
    if parts[1] == "run":  # `python -m mxnet_cpsgd.run SCRIPT`: the API around a script
        return "api"
    if parts[1] in SUBPACKAGES:
        return parts[1]
    return "unknown:" + parts[1]


def project_modules():
    for package in PACKAGES:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, package)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.join(dirpath, name)


def imports_of(path):
    """(line, absolute module name) of every import in a file, at any depth."""
    module = module_name(path)
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from pkg import sub` imports pkg.sub when sub is a subpackage/module
            for alias in node.names:
                candidate = target + "." + alias.name
                rel = candidate.replace(".", os.sep)
                if (os.path.isdir(os.path.join(ROOT, rel))
                        or os.path.isfile(os.path.join(ROOT, rel + ".py"))):
                    yield node.lineno, candidate
                else:
                    yield node.lineno, target


def upward_imports():
    """Every import that goes to a layer its module may not use."""
    bad = []
    for path in project_modules():
        source = layer_of(module_name(path))
        for line, target in imports_of(path):
            dest = layer_of(target)
            if dest is None or dest == source:
                continue
            if source not in ALLOWED or dest not in ALLOWED[source]:
                bad.append("%s:%d (%s) imports %s (%s)"
                           % (os.path.relpath(path, ROOT), line, source, target, dest))
    return bad


def test_every_module_has_a_layer():
    unknown = sorted(module_name(p) for p in project_modules()
                     if layer_of(module_name(p)) not in ALLOWED)
    assert not unknown, "modules outside the layers of tests/test_layout.py: %s" % unknown


def test_no_module_imports_upwards():
    bad = upward_imports()
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_checker_sees_an_upward_import(tmp_path):
    # the check itself: a store importing the benchmark is found
    global ROOT
    pkg = tmp_path / "mxnet_cpsgd"
    (pkg / "stores").mkdir(parents=True)
    (pkg / "bench").mkdir()
    for p in (pkg, pkg / "stores", pkg / "bench"):
        (p / "__init__.py").write_text("")
    (pkg / "bench" / "runs.py").write_text("X = 1\n")
    (pkg / "stores" / "bad.py").write_text("def f():\n    from ..bench import runs\n")
    saved, ROOT = ROOT, str(tmp_path)
    try:
        bad = upward_imports()
    finally:
        ROOT = saved
    assert bad == ["mxnet_cpsgd/stores/bad.py:2 (stores) imports mxnet_cpsgd.bench.runs "
                   "(bench)"], bad


#: the developers' guide: functions under about 100 lines, modules under 500
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100


def too_long():
    """Every module over MAX_MODULE_LINES lines and every function (or method)
    over MAX_FUNCTION_LINES, with its length."""
    found = []
    for path in project_modules():
        rel = os.path.relpath(path, ROOT)
        with open(path) as f:
            text = f.read()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append("%s: %d lines" % (rel, lines))
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append("%s:%d %s(): %d lines" % (rel, node.lineno, node.name,
                                                          length))
    return found


def test_no_module_or_function_is_too_long():
    found = too_long()
    assert not found, "split these by what they do:\n" + "\n".join(found)


def test_length_check_sees_a_long_function_and_module(tmp_path):
    global ROOT
    pkg = tmp_path / "mxnet_cpsgd"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "".join("    x = %d\n" % i for i in range(MAX_FUNCTION_LINES - 1))
    (pkg / "fits.py").write_text("def f():\n" + body)
    (pkg / "long.py").write_text("def g():\n" + body + "    return x\n"
                                 + "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES))
    saved, ROOT = ROOT, str(tmp_path)
    try:
        found = too_long()
    finally:
        ROOT = saved
    assert found == ["mxnet_cpsgd/long.py: %d lines" % (MAX_MODULE_LINES + 1),
                     "mxnet_cpsgd/long.py:1 g(): %d lines" % (MAX_FUNCTION_LINES + 1)], found


def _python(code, **env):
    full = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **env)
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_servers_import_nothing():
    # a parameter server imports the package only to unpickle the server optimizer
    for role in ("server", "scheduler"):
        out = _python("import sys, mxnet_cpsgd, mxnet_cpsgd.stores\n"
                      "print(sorted(m for m in sys.modules if m.startswith('mxnet')))",
                      DMLC_ROLE=role)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["['mxnet_cpsgd',", "'mxnet_cpsgd.stores']"], out.stdout


def test_launch_alias_is_the_launcher():
    out = _python("import mxnet_cpsgd.launch as a, mxnet_cpsgd.cluster.launch as b\n"
                  "from mxnet_cpsgd.launch import run_job, main\n"
                  "assert a is b and run_job is b.run_job, (a, b)\n")
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "mxnet_cpsgd.launch", "--help"], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=repo_pythonpath(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "cpsgd-launch" in out.stdout, out.stderr


def measure():
    """Modules per folder, the five largest modules (lines), upward imports."""
    per_folder = Counter()
    sizes = []
    for path in project_modules():
        rel = os.path.relpath(path, ROOT)
        per_folder[os.path.dirname(rel)] += 1
        with open(path) as f:
            sizes.append((sum(1 for _ in f), rel))
    lines = ["modules per folder:"]
    lines += ["  %3d  %s" % (n, d) for d, n in sorted(per_folder.items())]
    lines.append("largest modules (lines):")
    lines += ["  %4d  %s" % s for s in sorted(sizes, reverse=True)[:5]]
    bad = upward_imports()
    lines.append("upward imports: %d" % len(bad))
    lines += ["  " + b for b in bad]
    long = too_long()
    lines.append("too long: %d" % len(long))
    lines += ["  " + b for b in long]
    return "\n".join(lines)


if __name__ == "__main__":
    print(measure())
