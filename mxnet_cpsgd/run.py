"""Run an unchanged MXNet training script with this package's stores registered.

Usage::

    python -m mxnet_cpsgd.run SCRIPT.py [ARGS...]

is ``python SCRIPT.py ARGS...`` after ``import mxnet_cpsgd``: the script sees its
own path as ``sys.argv[0]`` and its directory first on ``sys.path`` (so its local
imports, e.g. ``from common import fit``, work), and ``--kv-store cpsgd`` (or any
store of this package) reaches ``mx.kv.create``.  Editing the script to add
``import mxnet_cpsgd`` does the same.  On a scheduler or server node the script's
``import mxnet`` runs that node, as it does without the wrapper.
"""
import os
import runpy
import sys

import mxnet_cpsgd  # noqa: F401  (registers the stores; see the module docstring)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(__doc__.split("\n\n")[1] + "\n")
        return 0 if argv else 2
    script = argv[0]
    if not os.path.isfile(script):
        sys.stderr.write("mxnet_cpsgd.run: no such script: %s\n" % script)
        return 2
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
