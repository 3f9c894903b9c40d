"""Which MXNet key (and so which server) carries which parameter chunk.

Pure layout checks; the stores' jobs with several servers (tests/test_reference.py,
tests/test_real_models.py) check that training is unchanged by it."""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

from mxnet_cpsgd.stores.key_layout import Chunk, KeyLayout, server_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    # a cut server takes no more chunks: at most num_servers - 1 keys more than parameters
    assert len(keys) == len(set(keys)) <= len(SHAPES) + num_servers - 1
    _check_chunks(layout, SHAPES)
    load = _loads(layout, num_servers)
    assert load.max() <= 1.05 * load.mean()
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


@pytest.mark.parametrize("seed", range(20))
def test_random_models_stay_within_the_slack(seed):
    """Random parameter sizes (a few large, many small, some that never travel)
    and server counts: the busiest server holds at most the mean share rounded
    up plus 2 % of it, with at most num_servers - 1 extra keys."""
    rng = np.random.RandomState(seed)
    count = rng.randint(1, 60)
    sizes = [int(v) for v in np.exp(rng.uniform(0, 12, size=count))]
    shapes = {i: (v,) for i, v in enumerate(sizes)}
    moving = [i for i in shapes if rng.rand() < 0.85]
    num_servers = int(rng.choice([2, 3, 5, 8, 16, 32, 64]))
    bound = int(rng.choice([1000, 10 ** 6]))
    layout = KeyLayout(shapes, num_servers, 1, bound, moving=moving)
    _check_chunks(layout, shapes)
    total = sum(sizes[i] for i in moving)
    load = layout.server_loads(num_servers)
    assert sum(load) == total
    assert max(load) <= -(-total // num_servers) + int(0.02 * total / num_servers)
    bound_only = KeyLayout(shapes, 1, 1, bound, moving=moving)
    assert len(set(layout.keys())) == len(layout.keys()) <= \
        len(bound_only.keys()) + num_servers - 1


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


def _check_chunks(layout, shapes):
    """Each parameter is cut into contiguous chunks below the bound, in order."""
    for index, shape in shapes.items():
        chunks = layout.chunks[index]
        assert chunks[0].start == 0 and chunks[-1].stop == int(np.prod(shape))
        assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
        assert all(0 < c.size <= layout.limit for c in chunks) or int(np.prod(shape)) == 0


@functools.lru_cache(maxsize=None)
def _model(model):
    from mxnet_cpsgd.bench.layout import model_parameters
    return model_parameters(model)


@pytest.mark.parametrize("model", ["resnet20", "resnet50"])
@pytest.mark.parametrize("num_servers", [4, 8, 16, 32])
def test_real_models_are_shared_evenly(model, num_servers):
    """GluonCV's cifar_resnet20_v1 and resnet50_v1 (the Trainer's parameters,
    momentum state): the busiest server carries <= 1.05 x the mean share of
    the elements pushed and pulled every round."""
    shapes, moving = _model(model)
    assert len(moving) < len(shapes)  # BatchNorm's running statistics have no gradient
    layout = KeyLayout(shapes, num_servers, 1, 10 ** 6, moving=moving)
    _check_chunks(layout, shapes)
    load = np.zeros(num_servers)
    for index in moving:
        for c in layout.chunks[index]:
            load[server_of(c.key, num_servers)] += c.size
    total = sum(int(np.prod(shapes[i])) for i in moving)
    assert load.sum() == total
    assert load.max() <= 1.05 * total / num_servers, load.max() / (total / num_servers)
    assert layout.server_loads(num_servers) == list(load)
    # MXNet's bound alone cuts ResNet-50's largest parameters; the balance adds
    # at most num_servers - 1 keys
    bound_only = KeyLayout(shapes, 1, 1, 10 ** 6, moving=moving)
    keys = layout.keys()
    assert len(keys) == len(set(keys)) <= len(bound_only.keys()) + num_servers - 1
    for key in keys:
        assert server_of(layout.mirror_base + key, num_servers) == server_of(key, num_servers)
    if model == "resnet20" and num_servers >= 16:
        # its largest layer alone is above a server's share: it must be cut
        largest = max(moving, key=lambda i: int(np.prod(shapes[i])))
        assert layout.is_chunked(largest)
        assert len({server_of(c.key, num_servers) for c in layout.chunks[largest]}) > 1


def test_parameters_without_gradients_weigh_nothing():
    """Only the moving parameters count: a large parameter that never travels
    does not push the others off its server."""
    shapes = {0: (100,), 1: (100,), 2: (10000,)}
    layout = KeyLayout(shapes, 2, 0, 10 ** 6, moving=[0, 1])
    servers = {i: {server_of(c.key, 2) for c in layout.chunks[i]} for i in (0, 1)}
    assert servers[0] != servers[1] and not layout.is_chunked(2)
    assert layout.server_loads(2) == [100, 100]
    counted = KeyLayout(shapes, 2, 0, 10 ** 6)  # all counted: parameter 2 is cut in two
    assert counted.is_chunked(2) and max(counted.server_loads(2)) <= 1.02 * 10200 / 2 + 1


def test_link_bytes_of_an_even_layout():
    """Four equal parameters on four colocated servers, by the closed forms: a
    dense round moves 2 (N-1)/N of the model each way, a 2-bit round (N-1)/N
    of the model plus (N-1)/N of its 16-fold compressed pushes."""
    from mxnet_cpsgd.bench.layout import link_bytes
    n, size = 4, 160
    shapes = {i: (size,) for i in range(n)}
    layout = KeyLayout(shapes, n, 1, 10 ** 6)
    assert not any(layout.is_chunked(i) for i in shapes)
    model = 4 * size * n
    got = link_bytes(layout.chunks, list(shapes), n, correction_period=5)
    assert got["model"] == model
    assert got["ssgd"] == got["ring"] == 2 * (n - 1) / n * model
    assert got["bitsgd"] == (n - 1) / n * (model + model / 16)
    assert got["cpsgd"] == (4 * got["bitsgd"] + got["ssgd"]) / 5
    # all on one server: its host serves every pull
    lopsided = {i: [Chunk(n * i, c.start, c.stop) for c in cs]  # key n*i: server 0
                for i, cs in layout.chunks.items()}
    assert link_bytes(lopsided, list(shapes), n)["ssgd"] == (n - 1) * model


def test_layout_command_prints_the_balance():
    """Smoke run of ``python -m mxnet_cpsgd.bench.layout``."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "mxnet_cpsgd.bench.layout", "--model",
                          "resnet20", "--servers", "4", "16", "--link-bytes"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines()
            if line.startswith("| resnet20 |")]
    links = [line for line in out.stdout.splitlines() if line.startswith("| resnet20 (")]
    assert len(links) == 4 and "| 16 | the stores |" in links[2]
    assert [int(r[2]) for r in rows] == [4, 16]
    assert all(float(r[4]) <= 1.05 for r in rows)
    assert float(rows[1][5]) > 2  # whole parameters: the largest layer alone
    bad = subprocess.run([sys.executable, "-m", "mxnet_cpsgd.bench.layout", "--model",
                          "nosuchnet"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "unknown model" in bad.stderr
