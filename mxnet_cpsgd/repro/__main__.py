"""``python -m mxnet_cpsgd.repro`` is ``cpsgd-reproduce``."""
import sys

from mxnet_cpsgd.repro.runner import main

sys.exit(main())
