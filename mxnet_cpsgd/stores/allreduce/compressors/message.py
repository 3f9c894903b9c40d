"""One round of communication of one key: what a compressor hands to the collectives."""

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"


class Message:
    """Tensors of one key for one collective, plus what decompression needs.

    Attributes:
        tensors: the NDArrays to send (1-D for all-gather).
        op: :data:`ALLREDUCE` (summed in place into ``tensors``) or
            :data:`ALLGATHER` (``outputs[j]`` receives every worker's
            ``tensors[j]``, rank 0 first).
        tag: short name of the round (``'p'``, ``'q'``, ``'bits'`` ...), part of
            the Horovod operation's name.
        state: anything the compressor keeps between compress and decompress.
        outputs: filled by the collectives: the arrays that hold the result.
    """

    __slots__ = ("tensors", "op", "tag", "state", "outputs")

    def __init__(self, tensors, op, tag, state=None):
        if op not in (ALLREDUCE, ALLGATHER):
            raise ValueError("unknown collective %r" % (op,))
        self.tensors = list(tensors)
        self.op = op
        self.tag = tag
        self.state = state if state is not None else {}
        self.outputs = None
