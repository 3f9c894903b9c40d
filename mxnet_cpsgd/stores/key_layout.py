"""Which MXNet keys carry which part of which parameter.

MXNet splits arrays of ``MXNET_KVSTORE_BIGARRAY_BOUND`` (default 1e6) elements or
more across all servers, and it splits dense and 2-bit pushes of such arrays
differently, so a round that mixes the two kinds would be summed wrongly with
two or more servers.  Parameters whose arrays (or optimizer-state mirrors) would
reach the bound are therefore cut into contiguous chunks, each its own key, each
below the bound.  Every chunk key ``k`` also has a mirror key
``mirror_base + k`` for its server-side optimizer state, chosen so that MXNet
places it on the same server as ``k`` (server = key * 9973 mod num_servers).

With several servers the chunks are cut and their keys *chosen* so that every
server carries the same share of the bytes that travel each round
(:func:`balanced_keys`): chunks by size, largest first, each to the server
with the fewest elements so far, and a chunk that would take that server past
its share (the mean plus a 2 % slack) is cut there, its rest placed like any
other chunk.  Each cut leaves a server at or above the mean share, where no
chunk with elements goes again, so a layout has at most ``num_servers - 1``
more keys than the bound alone needs, and no server holds more than about
1.02 x the mean share.  With the Trainer's indices as keys,
MXNet's hash leaves ResNet-20's busiest of 4 servers with 1.32 x the mean, and
whole keys cannot do better than its largest layer: 2.16 x the mean of 16
servers.  In a colocated cluster the busiest server's host link sets the
iteration time.  Which server holds a key changes nothing that is computed.

What counts: the elements of the parameters that are pushed and pulled every
round (``moving``); gluon never pushes parameters without gradients
(BatchNorm's running statistics), so they are placed but weigh nothing.  The
mirror keys travel only when a store registers, saves or loads them, not each
round; they sit on their chunk's server and grow with its size, so the
servers' memory is balanced along with the bytes.
"""
import heapq
import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import mxnet as mx

from .server_optimizer import MIRROR_TRAILER

# MXNet computes key * 9973 in a 32-bit int to pick a server
_MAX_KEY = (2 ** 31 - 1) // 9973


def bigarray_bound():
    """The bound MXNet's dist kvstore uses (same environment variable)."""
    return int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", 1000 * 1000))


@dataclass(frozen=True)
class Chunk:
    key: int     # MXNet key of this chunk
    start: int   # first element in the flattened parameter
    stop: int    # one past the last element

    @property
    def size(self):
        return self.stop - self.start


class KeyLayout:
    """Chunks and mirror keys for a list of parameters.

    Args:
        shapes: parameter index -> shape, for every parameter the store will see.
        num_servers: servers in the job.
        state_per_element: optimizer-state elements per weight element on the
            servers (0 for plain SGD, 1 for momentum, 2 for Adam).
        bound: MXNet's big-array bound.
        moving: indices of the parameters pushed and pulled every round (None:
            all); only their elements count towards a server's share.
        key_base: with several servers, the smallest key the layout may use (a
            multiple of ``num_servers``; keys below it are taken elsewhere).
    """

    def __init__(self, shapes: Dict[int, Tuple[int, ...]], num_servers: int,
                 state_per_element: float, bound: int,
                 moving: Optional[Iterable[int]] = None, key_base: int = 0):
        self.limit = limit = chunk_limit(bound, state_per_element)
        self.shapes = dict(shapes)
        self.moving = frozenset(shapes if moving is None else moving)
        self.chunks: Dict[int, List[Chunk]] = {}
        indices = sorted(shapes)
        next_key = (max(indices) + 1) if indices else 0
        for index in indices:
            size = _numel(shapes[index])
            bounds = list(range(0, size, limit)) + [size]
            chunks = []
            for j, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
                if j == 0:
                    key = index  # keep the Trainer's index as the key of the first chunk
                else:
                    key, next_key = next_key, next_key + 1
                chunks.append(Chunk(key, start, stop))
            if not chunks:  # a parameter with no elements still gets one key
                chunks.append(Chunk(index, 0, 0))
            self.chunks[index] = chunks
        if num_servers > 1:
            self.chunks = balanced_keys(self.chunks, num_servers, moving=self.moving,
                                        key_base=key_base)
            next_key = max(c.key for chunks in self.chunks.values() for c in chunks) + 1
        # the mirror of k is k + mirror_base; a multiple of num_servers keeps both on one server
        self.mirror_base = -(-max(next_key, 1) // num_servers) * num_servers
        if self.mirror_base + next_key > _MAX_KEY:
            raise ValueError("too many parameter chunks (%d) for MXNet's key space" % next_key)

    def is_chunked(self, index):
        return len(self.chunks[index]) > 1

    def keys(self) -> Sequence[int]:
        return [c.key for index in sorted(self.chunks) for c in self.chunks[index]]

    def owner(self) -> Dict[int, int]:
        """chunk key -> parameter index"""
        return {c.key: index for index, chunks in self.chunks.items() for c in chunks}

    def server_loads(self, num_servers: int) -> List[int]:
        """Elements of the moving parameters each server carries per round."""
        load = [0] * num_servers
        for index, chunks in self.chunks.items():
            if index in self.moving:
                for c in chunks:
                    load[server_of(c.key, num_servers)] += c.size
        return load


class GrowingKeyLayout:
    """Chunks and mirror keys for parameters that arrive one at a time.

    The classic ``init`` calls and the Module API name their parameters one by one,
    so their keys cannot be balanced over the servers when they are initialised:
    chunk keys are handed out in arrival order (MXNet's hash spreads consecutive
    keys over the servers), and the mirrors start at a fixed base in the upper
    half of the key space.  With several servers the store moves the parameters
    to a balanced :class:`KeyLayout` above these keys (:meth:`balanced`) before
    the first step.  Every worker adds the same parameters in the same order, so every
    worker derives the same keys.  Same attributes as :class:`KeyLayout`.
    """

    def __init__(self, num_servers: int, state_per_element: float, bound: int):
        self.limit = chunk_limit(bound, state_per_element)
        self.state_per_element = state_per_element
        self.shapes: Dict[int, Tuple[int, ...]] = {}
        self.chunks: Dict[int, List[Chunk]] = {}
        self.mirror_base = (_MAX_KEY // 2 // num_servers) * num_servers
        self._next_key = 0

    def add(self, index: int, shape: Tuple[int, ...]):
        size = _numel(shape)
        bounds = list(range(0, size, self.limit)) + [size]
        spans = list(zip(bounds[:-1], bounds[1:])) or [(0, 0)]
        if self._next_key + len(spans) > self.mirror_base:
            raise ValueError("too many parameter chunks for MXNet's key space")
        chunks = []
        for start, stop in spans:
            chunks.append(Chunk(self._next_key, start, stop))
            self._next_key += 1
        self.shapes[index] = tuple(shape)
        self.chunks[index] = chunks

    def is_chunked(self, index):
        return len(self.chunks[index]) > 1

    def balanced(self, num_servers: int, state_per_element: float, bound: int) -> KeyLayout:
        """The same parameters in the balanced layout of a Trainer's store, with
        keys above every key handed out here (every parameter moves)."""
        base = -(-self._next_key // num_servers) * num_servers
        return KeyLayout(self.shapes, num_servers, state_per_element, bound, key_base=base)


def chunk_limit(bound, state_per_element):
    """Largest chunk whose weights and whose mirror (state + weights) stay below
    MXNet's big-array bound."""
    limit = int((bound - 1 - MIRROR_TRAILER) / (1.0 + state_per_element))
    if limit < 1:
        raise ValueError("MXNET_KVSTORE_BIGARRAY_BOUND=%d is too small" % bound)
    return limit


class ParamBuffers:
    """A parameter's buffers in a store, and its chunks' views of them."""

    def __init__(self, index, value, chunks):
        self.index = index
        self.shape = value.shape
        self.chunks = chunks
        ctx = value.context
        self.send = mx.nd.zeros(value.shape, ctx=ctx, dtype=value.dtype)
        self.glob = mx.nd.zeros(value.shape, ctx=ctx, dtype=value.dtype)

    @property
    def chunked(self):
        return len(self.chunks) > 1

    def parts(self, array):
        """(key, view) for each chunk of ``array`` (the array itself when unchunked)."""
        if not self.chunked:
            return [(self.chunks[0].key, array)]
        flat = array.reshape(-1)
        return [(c.key, flat[c.start:c.stop]) for c in self.chunks]

    def pull_targets(self, targets):
        """Split ``targets`` into (arrays MXNet pulls into, arrays copied from glob after).

        A chunked parameter is pulled into views of ``glob`` only and then
        copied whole into the worker's weights: after an inference forward,
        MKL-DNN holds the weights in its own layout and MXNet aborts when an
        operation writes a view of such an array ("Check failed: !is_view").
        ``glob`` never enters a forward pass, so its views are safe.
        """
        if not self.chunked or not targets:
            return targets, []
        assert targets[0] is self.glob, "a chunked pull must land in glob first"
        return targets[:1], targets[1:]


def server_of(key: int, num_servers: int) -> int:
    """The server MXNet's dist kvstore sends a (non-big) key to."""
    return (key * 9973) % num_servers


#: how far above the mean share a server may go before a chunk is cut for it
SHARE_SLACK = 0.02


def balanced_keys(chunks: Dict[int, List[Chunk]], num_servers: int,
                  moving: Optional[Iterable[int]] = None,
                  split: bool = True, key_base: int = 0) -> Dict[int, List[Chunk]]:
    """The same parameters in chunks whose keys spread the moving elements
    evenly over the servers.

    Chunks by size, largest first (ties: parameter index, then position), each
    to the server with the fewest elements so far (ties: the lowest server),
    given the smallest unused key MXNet sends to that server.  With ``split``,
    a chunk that would take its server above ``capacity`` (the mean share,
    rounded up, plus ``SHARE_SLACK`` of it) is cut: the part that fills the
    server stays, the rest goes back into the queue; a rest smaller than the
    slack is avoided by cutting earlier.  Deterministic, so every worker
    derives the same keys.

    Args:
        chunks: parameter index -> its contiguous chunks (keys are replaced).
        num_servers: servers in the job (>= 1).
        moving: parameter indices whose elements count (None: all).
        split: cut chunks (False: place whole chunks only).
        key_base: the smallest key handed out (a multiple of ``num_servers``).
    """
    assert key_base % num_servers == 0, "key_base must keep MXNet's server of each key"
    moving = set(chunks if moving is None else moving)
    # 9973 is prime, so key -> key * 9973 mod S is a bijection on residues mod S
    residue = {server_of(r, num_servers): r for r in range(num_servers)}
    total = sum(c.size for index, cs in chunks.items() if index in moving for c in cs)
    mean = -(-total // num_servers)
    slack = int(SHARE_SLACK * total / num_servers)
    capacity = mean + slack
    min_piece = max(1, slack)
    used = [0] * num_servers  # keys already handed out per server
    load = [0] * num_servers
    # (-weight, index, start, stop): weight 0 for parameters that never travel
    queue = [(-(c.size if index in moving else 0), index, c.start, c.stop)
             for index, cs in chunks.items() for c in cs]
    heapq.heapify(queue)
    placed = {index: [] for index in chunks}
    while queue:
        neg_weight, index, start, stop = heapq.heappop(queue)
        weight = -neg_weight
        server = min(range(num_servers), key=lambda s: (load[s], s))
        if split and load[server] + weight > capacity:
            # the least loaded server holds at most the mean: at least the slack is free
            cut = min(capacity - load[server], weight - min_piece)
            heapq.heappush(queue, (-(weight - cut), index, start + cut, stop))
            stop, weight = start + cut, cut
        placed[index].append(Chunk(key_base + residue[server] + num_servers * used[server],
                                   start, stop))
        used[server] += 1
        load[server] += weight
    return {index: sorted(cs, key=lambda c: c.start) for index, cs in placed.items()}


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n
