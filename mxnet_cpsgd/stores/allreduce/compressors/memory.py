"""Error-feedback memory: per key, what compression has not yet delivered."""
import mxnet as mx


class ErrorFeedback:
    """Residuals ``e`` per key, zero until first written.

    A compressor adds the residual to the gradient (``p = g + e``), compresses
    ``p`` and stores what the message did not carry (``e = p - decoded``).  All
    reads and writes are MXNet engine operations (asynchronous).
    """

    def __init__(self):
        self._residual = {}

    def add_to(self, key, tensor):
        """``tensor + e[key]`` (a new array); ``tensor`` itself the first time."""
        e = self._residual.get(key)
        return tensor.copy() if e is None else tensor + e

    def store(self, key, value):
        """Remember ``value`` as the residual of ``key``."""
        self._residual[key] = value

    def get(self, key):
        """The residual of ``key`` or None (nothing stored yet)."""
        return self._residual.get(key)

    def zeros_like(self, key, tensor):
        """The residual of ``key``, created as zeros shaped like ``tensor`` if missing."""
        e = self._residual.get(key)
        if e is None:
            e = mx.nd.zeros(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
            self._residual[key] = e
        return e

    def keys(self):
        return list(self._residual)

    def items(self):
        return list(self._residual.items())

    def pop(self, key):
        """Forget the residual of ``key`` (zero again); returns it or None."""
        return self._residual.pop(key, None)

    def clear(self):
        self._residual = {}
