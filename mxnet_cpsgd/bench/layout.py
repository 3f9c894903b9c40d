"""How evenly the parameter servers share a model's bytes.

``python -m mxnet_cpsgd.bench.layout --model resnet20 resnet50 --servers 4 8 16 32``
prints, per model and server count, the busiest server's share of the bytes
that travel each round (pushes and pulls of the parameters with gradients)
over the mean share, for the stores' key layout and two others: whole
parameters placed by the same greedy rule, and MXNet's own placement of the
Trainer's indices.  Nothing is trained and no job starts: the parameters'
shapes come from the model's symbol.
"""
import argparse
from typing import Dict, List, Tuple

from mxnet_cpsgd.stores.key_layout import KeyLayout, balanced_keys, bigarray_bound, server_of

from .runs import MODEL_ALIASES
from .worker import WORKLOADS


def model_parameters(model: str) -> Tuple[Dict[int, Tuple[int, ...]], List[int]]:
    """The Trainer's view of ``model``: parameter index -> shape, and the
    indices of the parameters with gradients (the ones pushed every round).

    Indices follow ``net.collect_params()``, as ``gluon.Trainer`` numbers them;
    shapes come from the symbol's shape inference (no forward pass).
    """
    import mxnet as mx

    from mxnet_cpsgd.training import models

    name = MODEL_ALIASES.get(model.lower(), model)
    sample_shape, classes = WORKLOADS[name]
    net = models.get_model(name, classes=classes)
    sym = net(mx.sym.var("data"))
    arg_shapes, _, aux_shapes = sym.infer_shape(data=(1,) + tuple(sample_shape))
    inferred = dict(zip(sym.list_arguments(), arg_shapes))
    inferred.update(zip(sym.list_auxiliary_states(), aux_shapes))
    shapes, moving = {}, []
    for index, (pname, param) in enumerate(net.collect_params().items()):
        shapes[index] = tuple(inferred[pname])
        if param.grad_req != "null":
            moving.append(index)
    return shapes, moving


def balance(shapes, moving, num_servers: int, state_per_element: float = 1,
            bound: int = None) -> dict:
    """Busiest / mean share of the moving elements over ``num_servers``
    servers, for the stores' layout, whole parameters and MXNet's placement."""
    bound = bigarray_bound() if bound is None else bound
    layout = KeyLayout(shapes, num_servers, state_per_element, bound, moving=moving)
    whole = KeyLayout(shapes, 1, state_per_element, bound, moving=moving)  # bound cuts only
    moving = set(moving)
    mean = sum(_numel(shapes[i]) for i in moving) / float(num_servers)

    def ratio(chunks):
        load = [0] * num_servers
        for index, cs in chunks.items():
            if index in moving:
                for c in cs:
                    load[server_of(c.key, num_servers)] += c.size
        return max(load) / mean

    return {
        "servers": num_servers,
        "elements": int(mean * num_servers),
        "keys": len(layout.keys()),
        "keys_whole": len(whole.keys()),
        "cut": ratio(layout.chunks),
        "whole": ratio(balanced_keys(whole.chunks, num_servers, moving=moving, split=False)),
        "mxnet": ratio(whole.chunks),
    }


def link_bytes(chunks, moving, num_workers: int, correction_period: int = 5) -> dict:
    """Bytes per round on the busiest host link, colocated: worker i and server i
    on host i, one server per worker, a worker's traffic with its own host's
    server not crossing the link.  Payload only (float32; no TCP/IP or ps-lite
    headers).

    Per chunk of n elements on server j and every worker i != j: a dense push
    is 4n bytes (i up, j down), a 2-bit push 4 ceil(n / 16), a pull (always
    dense) 4n (j up, i down).  Returns the busiest direction's bytes of a dense
    round (ssgd; cpsgd's warm-up and corrections), a compressed round (bitsgd),
    cpsgd's mean over one correction period (k - 1 compressed rounds, one
    dense), and a ring all-reduce of the same gradients (2 (N - 1) / N x the
    model each way), and the model's bytes.
    """
    n = num_workers
    moving = set(moving)
    # per host: bytes the host's server holds (dense, 2-bit) and the model's
    held = [[0, 0] for _ in range(n)]
    for index, cs in chunks.items():
        if index in moving:
            for c in cs:
                h = server_of(c.key, n)
                held[h][0] += 4 * c.size
                held[h][1] += 4 * (-(-c.size // 16))
    model = sum(d for d, _ in held)
    model_2bit = sum(q for _, q in held)

    def busiest(push):  # push: 0 dense, 1 2-bit; one (up, down) pair per host
        links = []
        for d, q in held:
            own_push = (d, q)[push]
            all_push = (model, model_2bit)[push]
            up = (all_push - own_push) + (n - 1) * d       # its worker's pushes, its pulls served
            down = (model - d) + (n - 1) * own_push        # its worker's pulls, pushes received
            links.append((up, down))
        return links

    dense, compressed = busiest(0), busiest(1)
    k = correction_period
    mean = [((k - 1) * cu + du) / k for (du, _), (cu, _) in zip(dense, compressed)] + \
        [((k - 1) * cd + dd) / k for (_, dd), (_, cd) in zip(dense, compressed)]
    return {"workers": n, "model": model,
            "ssgd": max(max(p) for p in dense),
            "bitsgd": max(max(p) for p in compressed),
            "cpsgd": max(mean),
            "ring": 2.0 * (n - 1) / n * model}


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def table(rows: List[Tuple[str, dict]]) -> str:
    lines = ["| model | servers | keys (without balance cuts) | busiest / mean: the stores "
             "| whole parameters | MXNet's placement |",
             "|---|---:|---:|---:|---:|---:|"]
    for model, r in rows:
        lines.append("| %s | %d | %d (%d) | %.3f | %.3f | %.3f |"
                     % (model, r["servers"], r["keys"], r["keys_whole"], r["cut"],
                        r["whole"], r["mxnet"]))
    return "\n".join(lines)


def link_table(rows: List[Tuple[str, str, dict]], correction_period: int) -> str:
    lines = ["| model | workers | layout | ssgd | bitsgd | cpsgd (k = %d, mean) "
             "| ring all-reduce |" % correction_period, "|---|---:|---|---:|---:|---:|---:|"]
    for model, layout, r in rows:
        cells = ["%.0f KB (%.2f)" % (r[a] / 1e3, r[a] / r["model"])
                 for a in ("ssgd", "bitsgd", "cpsgd", "ring")]
        lines.append("| %s (%.0f KB) | %d | %s | %s |"
                     % (model, r["model"] / 1e3, r["workers"], layout, " | ".join(cells)))
    return "\n".join(lines)


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m mxnet_cpsgd.bench.layout",
        description="Busiest server's share of the bytes per round over the mean share, "
                    "per model and number of servers (no job is started).")
    p.add_argument("--model", nargs="+", default=["resnet20", "resnet50"],
                   help="models, of %s (default resnet20 resnet50)"
                        % ", ".join(sorted(MODEL_ALIASES)))
    p.add_argument("--servers", nargs="+", type=int, default=[4, 8, 16, 32],
                   help="numbers of servers (default 4 8 16 32)")
    p.add_argument("--state-per-element", type=float, default=1,
                   help="server optimizer state per weight element (default 1: momentum "
                        "SGD, as cpsgd-bench trains; it sizes the chunks MXNet's big-array "
                        "bound allows)")
    p.add_argument("--link-bytes", action="store_true",
                   help="also print the bytes per round on the busiest host link with a "
                        "server on every worker's host (as many workers as servers), for "
                        "the stores' layout and whole parameters")
    p.add_argument("--correction-period", type=int, default=5,
                   help="cpsgd's k for --link-bytes (default 5)")
    return p


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    for model in args.model:
        if MODEL_ALIASES.get(model.lower(), model) not in WORKLOADS:
            p.error("unknown model %r" % model)
    if any(s < 1 for s in args.servers):
        p.error("--servers must be >= 1")
    if args.correction_period < 1:
        p.error("--correction-period must be >= 1")
    rows, links = [], []
    for model in args.model:
        shapes, moving = model_parameters(model)
        for num_servers in args.servers:
            rows.append((model, balance(shapes, moving, num_servers, args.state_per_element)))
            if args.link_bytes:
                bound = bigarray_bound()
                cut = KeyLayout(shapes, num_servers, args.state_per_element, bound,
                                moving=moving).chunks
                whole = balanced_keys(KeyLayout(shapes, 1, args.state_per_element, bound,
                                                moving=moving).chunks,
                                      num_servers, moving=moving, split=False)
                for name, chunks in (("the stores", cut), ("whole parameters", whole)):
                    links.append((model, name, link_bytes(chunks, moving, num_servers,
                                                          args.correction_period)))
    print(table(rows))
    if args.link_bytes:
        print()
        print("Bytes per round on the busiest host link (payload; in brackets: x the "
              "model's bytes), a server on every worker's host:")
        print()
        print(link_table(links, args.correction_period))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
