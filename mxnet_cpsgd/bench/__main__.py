"""``python -m mxnet_cpsgd.bench`` is ``cpsgd-bench``."""
import sys

from mxnet_cpsgd.bench.cli import main

sys.exit(main())
