"""User docs say what is true now: no project history or development-machine paths
in the README, docs/ or the commands' --help, and every relative link resolves."""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the obvious signs of lab notes in a user page: issue numbers, the process that made
# the project, and paths of the machine it was developed on
PROCESS_TALK = re.compile(
    r"\bissues?[ -]?#?\d+|\bissue's\b|\bas the issue\b|\bthis session\b|\bother agents\b"
    r"|\bother (?:developers|sessions)\b|\bcluster branch\b|/work/|/tmp/venv", re.IGNORECASE)


def _pages():
    pages = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]
    pages += glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return sorted(pages)


def _hits(text):
    """The matches, with words broken over lines joined again."""
    flat = re.sub(r"\s+", " ", text)
    return [flat[max(0, m.start() - 40):m.end() + 20] for m in PROCESS_TALK.finditer(flat)]


def test_the_pattern_finds_what_it_is_for():
    for bad in ("Issue 13 gave", "the issue-15 targets", "issue15-ab1", "in this session",
                "shared with other agents", "other developers' jobs", "five other sessions ran",
                "the cluster branch's", "/work/main/.venv/bin/python", "/tmp/venv/lib",
                "as the issue specifies"):
        assert _hits(bad), bad
    for fine in ("issues a pull", "the tissue", "/tmp/cl/wd", "reissued"):
        assert not _hits(fine), fine


@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_page_has_no_process_talk(page):
    with open(page) as f:
        hits = _hits(f.read())
    assert not hits, "%s: %s" % (os.path.relpath(page, ROOT), hits)


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    with open(path) as f:
        headings = re.findall(r"^#+ (.*)$", f.read(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
    with open(page) as f:
        text = f.read()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        path = os.path.join(os.path.dirname(page), path) if path else page
        if not os.path.exists(path):
            broken.append(target)
        elif anchor and path.endswith(".md") and anchor not in _anchors(path):
            broken.append(target)
    assert not broken, "%s: %s" % (os.path.relpath(page, ROOT), broken)


HELP_COMMANDS = [
    ["scripts/train_mnist.py"], ["scripts/train_cifar.py"], ["scripts/train_imagenet.py"],
    ["-m", "mxnet_cpsgd.launch"], ["-m", "mxnet_cpsgd.bench"], ["-m", "mxnet_cpsgd.repro"],
]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=lambda c: c[-1])
def test_help_has_no_process_talk(command):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable] + command + ["--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
    assert not _hits(proc.stdout), _hits(proc.stdout)
    assert "(default: None)" not in proc.stdout


# Lab notes live beside the reports (reports/perf/), indexed in reports/perf/README.md
# with a status per file; a user page may cite a current one, never a superseded one.
LAB = os.path.join(ROOT, "reports", "perf")
INDEX_ROW = re.compile(r"^\| \[([^\]]+)\]\([^)]+\) \|.*\| ([^|]+) \|$", re.MULTILINE)


def _lab_status():
    with open(os.path.join(LAB, "README.md")) as f:
        return {name.rstrip("/"): status.strip() for name, status in INDEX_ROW.findall(f.read())}


def test_lab_index_lists_every_lab_file_with_a_status():
    status = _lab_status()
    files = set(os.listdir(LAB)) - {"README.md"}
    assert files <= set(status), sorted(files - set(status))
    for name, value in status.items():
        assert re.match(r"(current|investigation|superseded)\b", value), (name, value)


@pytest.mark.parametrize("page", [p for p in _pages() if not p.endswith("CHANGELOG.md")],
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_user_page_links_no_superseded_lab_note(page):
    superseded = {n for n, s in _lab_status().items() if s.startswith("superseded")}
    with open(page) as f:
        targets = LINK.findall(f.read())
    cited = {os.path.basename(os.path.normpath(os.path.join(os.path.dirname(page),
                                                            t.partition("#")[0])))
             for t in targets if "reports/perf/" in t}
    assert not cited & superseded, "%s: %s" % (os.path.relpath(page, ROOT), cited & superseded)


# A path of the machine a result was made on (a private work folder, a home, a scratch
# folder in /tmp) says nothing to a reader and must not be in a recorded command.
# Horovod's own error messages name the folder pip built it in (/tmp/pip-install-...):
# that is the library's text, not ours.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|Users)/[\w.-]"
                          r"|(?<![\w.~-])/tmp/(?!pip-install-)[\w.-]")
RECORDS = (".md", ".json", ".py", ".txt", ".yaml", ".sh", ".csv")


def _machine_paths(text):
    # cpsgd-reproduce records the interpreter a run used ("python": ...) as metadata
    return [m.group(0) for line in text.splitlines() if '"python": "' not in line
            for m in MACHINE_PATH.finditer(line)]


def test_the_machine_path_pattern_finds_what_it_is_for():
    for bad in ("--out-dir /work/bench34/n2-a", "--out-dir /tmp/i15-pipe1", "/home/me/x",
                "/root/.pyenv/versions", "(/tmp/cpany/bench4)"):
        assert _machine_paths(bad), bad
    for fine in ("--out-dir bench-results/n2-a", "/tmp/pip-install-2_my/gloo/pair.cc",
                 "/usr/bin/ssh", "~/work/x", "reports/perf/x.md", '"python": "/work/v/python"'):
        assert not _machine_paths(fine), fine


def test_no_machine_paths_under_docs_or_reports():
    found = []
    for top in ("docs", "reports"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith(RECORDS):
                    path = os.path.join(folder, name)
                    with open(path, errors="replace") as f:
                        hits = _machine_paths(f.read())
                    if hits:
                        found.append("%s: %s" % (os.path.relpath(path, ROOT), hits[:3]))
    assert not found, "\n".join(found[:20])


def _lines(path):
    with open(path) as f:
        return f.read().splitlines()


def test_readme_is_a_short_front_door():
    lines = _lines(os.path.join(ROOT, "README.md"))
    assert len(lines) <= 160, len(lines)
    text = "\n".join(lines)
    setup = text.split("## Set up", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in setup.strip().splitlines()]
    assert commands == ["bash scripts/main_job.sh", "bash scripts/run_tests.sh"], commands
    long_cells = [cell.strip() for line in lines if line.startswith("|")
                  for cell in line.strip("|").split("|")
                  if len(re.sub(r"\]\([^)]*\)", "]", cell).split()) > 25]
    assert not long_cells, long_cells


@pytest.mark.parametrize("page", [p for p in _pages() if os.sep + "docs" + os.sep in p],
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_reference_page_is_short(page):
    assert len(_lines(page)) <= 400, "%s: %d lines" % (os.path.relpath(page, ROOT),
                                                      len(_lines(page)))
