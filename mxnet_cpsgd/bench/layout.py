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


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def table(rows: List[Tuple[str, dict]]) -> str:
    lines = ["| model | servers | keys (uncut) | busiest / mean: cut (the stores) "
             "| whole parameters | MXNet's placement |",
             "|---|---:|---:|---:|---:|---:|"]
    for model, r in rows:
        lines.append("| %s | %d | %d (%d) | %.3f | %.2f | %.2f |"
                     % (model, r["servers"], r["keys"], r["keys_whole"], r["cut"],
                        r["whole"], r["mxnet"]))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m mxnet_cpsgd.bench.layout",
        description="Busiest server's share of the bytes per round over the mean share, "
                    "per model and number of servers (no job is started).")
    p.add_argument("--model", nargs="+", default=["resnet20", "resnet50"],
                   help="models (%s)" % ", ".join(sorted(MODEL_ALIASES)))
    p.add_argument("--servers", nargs="+", type=int, default=[4, 8, 16, 32])
    p.add_argument("--state-per-element", type=float, default=1,
                   help="server optimizer state per weight element (1: momentum SGD, "
                        "as cpsgd-bench trains; it sizes the chunks MXNet's big-array "
                        "bound allows)")
    args = p.parse_args(argv)
    for model in args.model:
        if MODEL_ALIASES.get(model.lower(), model) not in WORKLOADS:
            p.error("unknown model %r" % model)
    if any(s < 1 for s in args.servers):
        p.error("--servers must be >= 1")
    rows = []
    for model in args.model:
        shapes, moving = model_parameters(model)
        for num_servers in args.servers:
            rows.append((model, balance(shapes, moving, num_servers, args.state_per_element)))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
