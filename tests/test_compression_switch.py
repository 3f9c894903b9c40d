"""kvstore_ext.CompressionSwitch in a real 2-worker job on a plain dist_sync store.

One key, three rounds: compressed, dense (inside ``switch.dense()``), compressed.
The servers (no optimizer) store each round's sum of the dequantized pushes, so
the pulled values are predicted exactly by MXNet's 2-bit rule with a persistent
per-worker residual, computed here in float32:

    r += g;  send +tau if r >= tau (r -= tau), -tau if r <= -tau (r += tau), else 0

A dense round sends g exactly and leaves r untouched, so the residual of round 1
carries into round 3.
"""
import json
import os

import numpy as np

TAU = 0.5


def _load_worker_module():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                        "switch_worker.py")
    spec = importlib.util.spec_from_file_location("switch_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def predict(grads, kinds, tau, carry_residual=True):
    """Pulled sums per round under the 2-bit-with-residual rule (float32)."""
    tau = np.float32(tau)
    residual = {rank: np.zeros(len(g[0]), np.float32) for rank, g in grads.items()}
    sums = []
    for round_, kind in enumerate(kinds):
        total = np.zeros(len(grads[0][0]), np.float32)
        for rank in sorted(grads):
            g = np.asarray(grads[rank][round_], np.float32)
            if kind == "dense":
                sent = g
            else:
                if not carry_residual and round_ > 0:
                    residual[rank][:] = 0
                r = residual[rank] + g
                sent = np.where(r >= tau, tau, np.where(r <= -tau, -tau, np.float32(0)))
                sent = sent.astype(np.float32)
                residual[rank] = (r - sent).astype(np.float32)
            total = (total + sent).astype(np.float32)
        sums.append(total)
    return sums


def test_compressed_dense_compressed_rounds(worker_job, tmp_path):
    worker = _load_worker_module()
    result = worker_job("switch_worker.py", tmp_path, TAU, job_timeout=60)
    assert result.returncode == 0, result.text
    assert not result.leftover, result.leftover
    expected = predict(worker.GRADS, worker.KINDS, TAU)
    # the data makes the carried residual visible in round 3
    reset = predict(worker.GRADS, worker.KINDS, TAU, carry_residual=False)
    assert not np.array_equal(expected[2], reset[2])
    for rank in (0, 1):
        with open(os.path.join(tmp_path, "switch-rank%d.json" % rank)) as f:
            got = json.load(f)
        # a fresh store: type none, threshold_ as the member initializer leaves it (0;
        # GradientCompressionParam's default of 0.5 applies only once params are set)
        assert tuple(got["before"]) == (0, 0.0)
        assert tuple(got["after"]) == (1, TAU)
        assert tuple(got["after_rounds"]) == (1, TAU)  # dense() restored the type
        for round_, (kind, want) in enumerate(zip(worker.KINDS, expected)):
            np.testing.assert_array_equal(
                np.asarray(got["pulled"][round_], np.float32), want,
                err_msg="rank %d round %d (%s)" % (rank, round_ + 1, kind))
