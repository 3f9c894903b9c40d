"""FP16: half-precision all-reduce, the compression every all-reduce user knows.

Per key, every step::

    h = float16(g)              round to nearest (MXNet ``astype``)
    all-reduce (sum) h          in float16 (Horovod/Gloo adds two halves in float32
                                and rounds the sum back to float16)
    out = float32(sum_i h_i)

No error feedback, as Horovod's own ``Compression.fp16``: the rounding error of
one element is at most 2**-11 of it, below what error feedback is for.  Message:
2 bytes per element instead of 4; one all-reduce per key, queued as soon as the key's
gradient is pushed (``exchange='per_key'``, this compressor's default).
"""
from .base import Compressor
from .message import ALLREDUCE, Message


class FP16(Compressor):
    """Half-precision all-reduce (see the module docstring)."""

    name = "fp16"
    defaults = {"warmup_steps": 0}
    # measured with cpsgd-bench where the exchange is about as long as the compute:
    # per key, the all-reduce overlaps the backward pass (docs/performance.md)
    default_exchange = "per_key"

    def compress(self, key, tensor, step):
        half = tensor.astype("float16")
        return Message([half], ALLREDUCE, "fp16", {"shape": tensor.shape,
                                                   "dtype": tensor.dtype})

    def decompress(self, key, message, step):
        return message.outputs[0].astype(message.state["dtype"])
