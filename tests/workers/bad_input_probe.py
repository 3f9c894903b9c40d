"""Probe of tests/test_bad_input.py: misconfigurations that must fail before any
process blocks.

Run as a plain process (no job).  The caller points DMLC_* at a port where no
scheduler listens, so a store that tried to join a job would block there (the
caller's timeout catches that); every case must raise before it gets so far.

For each case it prints one JSON line when it starts and one with the outcome:
``{"case": NAME, "raised": TYPE or null, "message": TEXT}``.

Usage: python bad_input_probe.py [CASE ...]   (default: all, in order)
"""
import json
import os
import sys

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd

CASES = {}
DMLC_VARS = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
             "DMLC_NUM_WORKER", "DMLC_NODE_HOST")


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def one_step(kvstore="cpsgd", compression_params=None, net=None, data=None, **trainer_kw):
    """Build a Trainer and run one training step: the store starts at the step."""
    if net is None:
        net = gluon.nn.Dense(3, in_units=4)
        net.initialize()
    x = data if data is not None else mx.nd.ones((2, 4))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            kvstore=kvstore, compression_params=compression_params, **trainer_kw)
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(2)
    mx.nd.waitall()


class env:
    """Temporarily set (value) or remove (None) environment variables."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        for k, v in self.values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@case
def unknown_key():
    one_step(compression_params={"threshold": 0.5, "bogus_knob": 1})


def _correction_period(value):
    one_step(compression_params={"correction_period": value})


@case
def correction_period_0():
    _correction_period(0)


@case
def correction_period_negative():
    _correction_period(-1)


@case
def correction_period_fraction():
    _correction_period(2.5)


@case
def correction_period_text():
    _correction_period("x")


@case
def threshold_0():
    one_step(compression_params={"threshold": 0})


@case
def threshold_negative():
    one_step(compression_params={"threshold": -0.5})


@case
def warmup_steps_negative():
    one_step(compression_params={"warmup_steps": -1})


@case
def compression_type_not_2bit():
    one_step(compression_params={"type": "1bit"})


@case
def knob_not_used_by_algorithm():
    one_step(kvstore="odsgd", compression_params={"threshold": 0.5})


@case
def create_with_bad_config():
    mxnet_cpsgd.create(mxnet_cpsgd.AlgorithmConfig("cpsgd", correction_period=0))


@case
def env_correction_period_0():
    with env(MXNET_CPSGD_CORRECTION_PERIOD="0"):
        one_step()


@case
def env_unknown_variable():
    with env(MXNET_CPSGD_TYPO="1"):
        one_step()


@case
def update_on_kvstore_false():
    one_step(compression_params={"threshold": 0.5}, update_on_kvstore=False)


@case
def update_on_kvstore_env_0():
    with env(MXNET_UPDATE_ON_KVSTORE="0"):
        one_step()


@case
def sparse_gradients():
    net = gluon.nn.Embedding(10, 4, sparse_grad=True)
    net.initialize()
    one_step(net=net, data=mx.nd.array([[1, 2]]))


@case
def no_job():
    with env(**{name: None for name in DMLC_VARS}):
        one_step()


def _as_mxnet_190(fn):
    from kvstore_ext import compression_switch
    mx.__version__ = "1.9.0"
    try:
        fn(compression_switch)
    finally:
        mx.__version__ = compression_switch.SUPPORTED_VERSION


@case
def unsupported_build_check():
    # unit test of the switch's build check: MXNet reports another version
    _as_mxnet_190(lambda cs: cs.check_build())


@case
def unsupported_build_switch():
    # the switch refuses before it reads anything through the (here bogus) store
    _as_mxnet_190(lambda cs: cs.CompressionSwitch(object()))


def main():
    names = sys.argv[1:] or list(CASES)
    for name in names:
        print(json.dumps({"case": name, "started": True}), flush=True)
        try:
            CASES[name]()
        except Exception as err:  # noqa: BLE001 - the outcome is what is reported
            outcome = {"raised": type(err).__name__,
                       "module": type(err).__module__, "message": str(err)}
        else:
            outcome = {"raised": None, "message": ""}
        outcome["case"] = name
        print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
