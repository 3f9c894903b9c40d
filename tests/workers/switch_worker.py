"""Worker of tests/test_compression_switch.py: kvstore_ext.CompressionSwitch on a
plain MXNet dist_sync store (no mxnet_cpsgd store involved).

Usage (inside a job): python switch_worker.py OUT_DIR TAU

On key 3 (no optimizer on the server, so a pull returns the round's sum) every
worker pushes GRADS[rank][0] compressed, GRADS[rank][1] dense (inside
``switch.dense()``) and GRADS[rank][2] compressed, pulling after each round.
Writes OUT_DIR/switch-rank{r}.json: the (type, threshold) fields read before and
after enable(), and the three pulled sums.
"""
import json
import os
import sys

import mxnet as mx

from kvstore_ext import CompressionSwitch, read_compression_fields

KEY = 3
GRADS = {
    0: [[0.3, -0.7, 0.6, 1.2, -0.2, 0.0, 0.45, -0.5],
        [2.1, -2.1, 0.6, 4.2, 0.25, -1.3, 0.1, 0.7],
        [0.3, 0.0, -0.1, 0.2, -0.35, 0.4, 0.1, 0.05]],
    1: [[0.1, -0.3, 0.55, 0.2, -0.6, 0.9, -0.45, 0.3],
        [-1.0, 0.5, 3.3, -0.2, 1.75, 0.01, -2.5, 0.3],
        [0.25, -0.2, 0.0, 0.3, 0.1, -0.45, -0.1, 0.15]],
}
KINDS = ["compressed", "dense", "compressed"]


def main(out_dir, tau):
    kv = mx.kv.create("dist_sync")
    rank = kv.rank
    before = read_compression_fields(kv)
    switch = CompressionSwitch(kv)
    switch.enable(tau)
    after = read_compression_fields(kv)
    size = len(GRADS[0][0])
    kv.init(KEY, mx.nd.zeros((size,)))
    mx.nd.waitall()
    kv._barrier()  # every worker's first push/pull after rank 0's init
    pulled = []
    for kind, values in zip(KINDS, GRADS[rank]):
        grad = mx.nd.array(values, dtype="float32")
        if kind == "dense":
            with switch.dense():
                kv.push(KEY, grad)
        else:
            kv.push(KEY, grad)
        out = mx.nd.zeros((size,))
        kv.pull(KEY, out=out)
        pulled.append(out.asnumpy().tolist())
    after_rounds = read_compression_fields(kv)
    with open(os.path.join(out_dir, "switch-rank%d.json" % rank), "w") as f:
        json.dump({"before": before, "after": after, "after_rounds": after_rounds,
                   "pulled": pulled}, f)
    print("rank %d pulled %s" % (rank, pulled))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
