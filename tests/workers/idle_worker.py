"""Worker of tests/test_mxlaunch.py: join a dist_sync job, say so, then wait.

Prints "JOINED <rank>" once MXNet's store has joined the job and sleeps for up to
120 s (the test stops the job long before).
"""
import time

import mxnet as mx

kv = mx.kv.create("dist_sync")
print("JOINED %d" % kv.rank, flush=True)
time.sleep(120)
