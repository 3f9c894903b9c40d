"""Does the order in which the server sums M pushes change the float32 result?

The parameter server adds each worker's push into its merge buffer as it arrives
(the first copied, the others added), so the order of the terms is the order of
arrival, which varies from run to run.  This script sums M float32 arrays in every
order and reports how many elements differ from the first order, for dense gradients
and for 2-bit dequantized pushes (multiples of the threshold).

    python reports/perf/summation-order.py [--elements 61706] [--seed 0]

61,706 elements is LeNet-5's parameter count.  Prints one line per (kind, M).
"""
import argparse
import itertools

import numpy as np


def merged(pushes, order):
    """The server's merge buffer: a copy of the first arrival, then += the others."""
    buf = pushes[order[0]].copy()
    for i in order[1:]:
        buf += pushes[i]
    return buf


def differing(pushes):
    """Over all arrival orders: the largest fraction of elements that differ from the
    first order's sum, and the largest relative difference."""
    orders = list(itertools.permutations(range(len(pushes))))
    first = merged(pushes, orders[0])
    frac, rel = 0.0, 0.0
    for order in orders[1:]:
        other = merged(pushes, order)
        diff = other != first
        frac = max(frac, float(diff.mean()))
        if diff.any():
            scale = np.maximum(np.abs(first[diff]), 1e-30)
            rel = max(rel, float((np.abs(other[diff] - first[diff]) / scale).max()))
    return frac, rel, len(orders)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--elements", type=int, default=61706)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.RandomState(args.seed)
    for m in (2, 3, 4):
        dense = [rng.standard_normal(args.elements).astype(np.float32) * 0.05
                 for _ in range(m)]
        # 2-bit pushes: -0.5, 0 or +0.5 per element
        twobit = [(rng.randint(-1, 2, args.elements) * 0.5).astype(np.float32)
                  for _ in range(m)]
        for kind, pushes in (("dense", dense), ("2-bit", twobit)):
            frac, rel, n = differing(pushes)
            print("%-6s M=%d: %5.1f %% of the elements differ between arrival orders "
                  "(largest relative difference %.1e; %d orders)"
                  % (kind, m, 100 * frac, rel, n))


if __name__ == "__main__":
    main()
