"""Which MXNet key (and so which server) carries which parameter chunk.

Pure layout checks; the stores' jobs with several servers (tests/test_reference.py,
tests/test_real_models.py) check that training is unchanged by it."""
import numpy as np
import pytest

from mxnet_cpsgd.stores.key_layout import KeyLayout, server_of

#: parameter sizes of a small ResNet-like model (convs, BN gammas/betas, a dense head)
SHAPES = {i: s for i, s in enumerate(
    [(16, 3, 3, 3), (16,), (16,)] + [(16, 16, 3, 3), (16,), (16,)] * 6
    + [(32, 16, 3, 3), (32,), (32,)] + [(32, 32, 3, 3), (32,), (32,)] * 5
    + [(64, 32, 3, 3), (64,), (64,)] + [(64, 64, 3, 3), (64,), (64,)] * 5 + [(10, 64), (10,)])}


def _loads(layout, num_servers):
    load = np.zeros(num_servers)
    for chunks in layout.chunks.values():
        for c in chunks:
            load[server_of(c.key, num_servers)] += c.size
    return load


@pytest.mark.parametrize("num_servers", [2, 3, 4, 8])
def test_keys_spread_the_elements_over_the_servers(num_servers):
    layout = KeyLayout(SHAPES, num_servers, 1, 10 ** 6)
    keys = layout.keys()
    assert len(keys) == len(set(keys)) == len(SHAPES)
    load = _loads(layout, num_servers)
    largest = max(int(np.prod(s)) for s in SHAPES.values())
    # greedy, largest first: no server above the mean by more than the largest chunk
    assert load.max() <= load.mean() + largest
    hashed = np.zeros(num_servers)  # MXNet's placement of the Trainer's indices
    for index, shape in SHAPES.items():
        hashed[server_of(index, num_servers)] += int(np.prod(shape))
    assert load.max() <= hashed.max()
    # every mirror key sits on its chunk's server; keys stay below the mirrors
    for key in keys:
        assert key < layout.mirror_base
        assert server_of(layout.mirror_base + key, num_servers) == server_of(key, num_servers)
    # deterministic: every worker derives the same keys
    assert KeyLayout(SHAPES, num_servers, 1, 10 ** 6).chunks == layout.chunks


def test_one_server_keeps_the_trainer_indices_and_chunks_stay_in_order():
    layout = KeyLayout(SHAPES, 1, 0, 10 ** 6)
    assert {i: [c.key for c in cs] for i, cs in layout.chunks.items()} == \
        {i: [i] for i in SHAPES}
    big = KeyLayout({0: (3000,), 1: (10,)}, 2, 0, 1000)
    chunks = big.chunks[0]
    assert len(chunks) > 1 and chunks[0].start == 0 and chunks[-1].stop == 3000
    assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
    assert all(c.size < 1000 for c in chunks)
    keys = [c.key for cs in big.chunks.values() for c in cs]
    assert len(set(keys)) == len(keys) == len(chunks) + 1
