"""Worker of tests/test_store_names.py: create a store by name, as MXNet's scripts do.

Usage (inside a job, through ``python -m mxnet_cpsgd.run``): named_store_worker.py NAME

Calls ``mx.kvstore.create(NAME)`` (what example/image-classification's fit.py
calls) and prints "STORE <type> <num_workers>"; a refused name raises.
"""
import sys

import mxnet as mx

kv = mx.kvstore.create(sys.argv[1])
print("STORE %s %d" % (kv.type, kv.num_workers), flush=True)
