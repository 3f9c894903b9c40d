"""Probe of tests/test_server_optimizer.py: a load push as MXNet's dist_async server
delivers it, with the engine busy.

Usage: python async_load_probe.py   (MXNET_CPU_WORKER_NTHREADS=1 set by the test)

Under dist_async, MXNet 1.9.1's server passes the received message itself to the
updater as the pushed array and, once the updater has returned, waits only for
the key's stored array before ps-lite frees the message (src/kvstore/
kvstore_dist_server.h, DataHandleDefault/ApplyUpdates).  Any engine operation
the updater left behind that still reads the pushed array then reads freed
memory.  This probe does exactly what the server does, in one process, with the
single engine worker busy on a long matrix product so that a left-behind
operation runs late: a registration push and a load push to the mirror key of
key 0, a wait for the mirror (the stored array), the message's memory
overwritten with NaN, then one gradient push of key 0.  It prints the weights
after that update, the loaded weights, the gradient and the learning rate.
"""
import json

import numpy as np
import mxnet as mx

from mxnet_cpsgd.stores.server_optimizer import MIRROR_TRAILER, ServerOptimizer

SIZE, LR, BASE, COUNT = 512, 0.1, 1000, 5


def main():
    rng = np.random.RandomState(3)
    loaded = rng.uniform(-1, 1, SIZE).astype(np.float32)
    grad = rng.uniform(-1, 1, SIZE).astype(np.float32)
    server = ServerOptimizer(mx.optimizer.SGD(learning_rate=LR, momentum=0.0),
                             lr_mult={}, wd_mult={}, mirror_base=BASE)
    weight = mx.nd.zeros((SIZE,))                       # stored array of key 0
    mirror = mx.nd.zeros((SIZE + MIRROR_TRAILER,))       # stored array of its mirror key
    server.update_multi_precision(BASE, mirror, mx.nd.zeros(mirror.shape), None)  # register
    message = np.zeros(SIZE + MIRROR_TRAILER, dtype=np.float32)
    message[:SIZE] = loaded
    message[SIZE:] = [COUNT, SIZE, 1.0]                # update count, weight count, load flag
    # the pushed array is the message's own memory (from_numpy makes its argument
    # read-only, not the buffer: the probe keeps writing through ``message``)
    pushed = mx.nd.from_numpy(message.view(), zero_copy=True)
    big = mx.nd.ones((1500, 1500))
    busy = mx.nd.dot(big, big)                          # keeps the one engine worker busy
    server.update_multi_precision(BASE, mirror, pushed, None)
    mirror.wait_to_read()                               # all the server waits for
    message[:] = np.nan                                 # ps-lite reuses the memory
    state = server.create_state_multi_precision(0, weight)
    server.update_multi_precision(0, weight, mx.nd.array(grad), state)
    busy.wait_to_read()
    print(json.dumps({"weights": weight.asnumpy().tolist(), "loaded": loaded.tolist(),
                      "grad": grad.tolist(), "lr": LR}))


if __name__ == "__main__":
    main()
