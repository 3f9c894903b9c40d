"""The git state of the code a reproduction runs: its commit, whether the tree has
uncommitted changes, and the refusal to start runs from such a tree unless the
user says so (``cpsgd-reproduce --allow-dirty``).
"""
import os
from typing import Dict, Optional, Sequence


class DirtyTreeError(RuntimeError):
    """Runs would start from code with uncommitted changes (see ``--allow-dirty``)."""


def code_version(directory: Optional[str] = None,
                 exclude: Optional[str] = None) -> Dict[str, object]:
    """The git commit of the code that runs, and whether the tree has uncommitted
    changes (``{'commit': None, 'dirty': None}`` outside a git checkout).

    Args:
        directory: where to ask git (default: this package's directory).
        exclude: a directory whose changes do not count (the reproduction's output,
            which the runner itself writes before every run).
    """
    import subprocess
    where = directory or os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        return subprocess.run(["git", "-C", where] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True,
                              timeout=30, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        paths = []
        if exclude:
            top = git("rev-parse", "--show-toplevel")
            rel = os.path.relpath(os.path.realpath(exclude), os.path.realpath(top))
            if not rel.startswith(os.pardir):
                paths = ["--", ":(top)", ":(top,exclude)%s" % rel]
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", *paths))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def refuse_dirty_tree(starting: Sequence[str], out: str) -> None:
    """Raise :class:`DirtyTreeError` when runs ``starting`` (their ids) would start
    from a tree with uncommitted changes (outside ``out``, which the runner writes).
    Outside a git checkout nothing can be told and nothing is refused."""
    if starting and code_version(exclude=out)["dirty"]:
        raise DirtyTreeError(
            "the code's git tree has uncommitted changes (git status), so %d run(s) (%s) "
            "would not be reproducible from their recorded commit; commit first, or pass "
            "--allow-dirty (run.json then records allow_dirty: true)"
            % (len(starting), ", ".join(starting[:3]) + (", ..." if len(starting) > 3 else "")))
