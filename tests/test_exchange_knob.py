"""The knob ``exchange`` of the compressing all-reduce stores: 'per_step' (a step's
messages exchanged as one grouped Horovod operation) or 'per_key' (each key at once).

Its checks and defaults (stores/config.py, the stores' ``knob_defaults``), and the
routes that set it on a real store (one Horovod process, no job): the Trainer's
``compression_params``, ``MXNET_CPSGD_EXCHANGE``, ``mxnet_cpsgd.create`` and the
attribute ``group_per_step``.  That both values train to the same weights, and that
the store then really exchanges key by key, is checked on 2-worker jobs in
tests/test_cp_compressors.py.
"""

import pytest

from mxnet_cpsgd.stores import catalog, config
from mxnet_cpsgd.stores.allreduce.compressors import (COMPRESSORS, FP16, STORES,
                                                      cp_store_class, store_class)
from mxnet_cpsgd.stores.config import AlgorithmConfig, ConfigError
from test_horovod import _python_c, tag  # noqa: F401  (tag: the fixture)


def test_every_compressing_allreduce_store_accepts_it_with_its_compressors_default():
    assert len(STORES) == 2 * len(COMPRESSORS)
    for name, cls in STORES.items():
        default = cls.knob_defaults()["exchange"]
        # fp16 (and cpsgd_fp16) exchange per key by default, the others per step
        expected = "per_key" if cls.compressor_class is FP16 else "per_step"
        assert default == cls.compressor_class.default_exchange == expected, name
        assert config.resolve(name, cls.knob_defaults(), {}, {}).exchange == expected


def test_stores_without_a_compressed_exchange_do_not_accept_it():
    found = catalog.stores()
    others = [n for n in found if n not in STORES]
    assert "horovod" in others and "cpsgd" in others and "bitsgd" in others
    for name in others:
        assert "exchange" not in found[name][1], name
    for name, accepts in [("horovod", "no settings"),
                          ("cpsgd", "correction_delay, correction_period"),
                          ("bitsgd", "correction_period")]:
        with pytest.raises(ConfigError) as err:
            config.resolve(name, found[name][1], {"exchange": "per_key"}, {})
        assert ("compression_params['exchange'] is not used by kvstore '%s'; it accepts: %s"
                % (name, accepts)) in str(err.value)
        with pytest.raises(ConfigError) as err:
            config.resolve(name, found[name][1], {}, {"MXNET_CPSGD_EXCHANGE": "per_key"})
        assert ("environment variable MXNET_CPSGD_EXCHANGE is not used by kvstore '%s'"
                % name) in str(err.value)


def test_one_class_attribute_sets_the_default_of_both_stores_of_a_compressor():
    class PerStepFP16(FP16):
        default_exchange = "per_step"

    for cls in (store_class(PerStepFP16), cp_store_class(PerStepFP16)):
        assert cls.knob_defaults()["exchange"] == "per_step"
        assert config.resolve(cls.store_name(), cls.knob_defaults(), {}, {}).exchange == \
            "per_step"
    # the registered fp16 stores keep theirs
    assert STORES["fp16"].knob_defaults()["exchange"] == "per_key"
    assert STORES["cpsgd_fp16"].knob_defaults()["exchange"] == "per_key"


@pytest.mark.parametrize("value", ["grouped", "", "per-key", 1])
def test_bad_values_are_refused_naming_the_choices(value):
    defaults = STORES["topk"].knob_defaults()
    with pytest.raises(ConfigError) as err:
        config.resolve("topk", defaults, {"exchange": value}, {})
    assert ("compression_params['exchange'] must be one of 'per_step', 'per_key', got %r"
            % (value,)) == str(err.value)


def test_environment_and_compression_params_routes():
    defaults = STORES["cpsgd_signsgd"].knob_defaults()
    env = {"MXNET_CPSGD_EXCHANGE": "per_key"}
    assert config.resolve("cpsgd_signsgd", defaults, {}, env).exchange == "per_key"
    # compression_params over the environment; values are case-insensitive
    assert config.resolve("cpsgd_signsgd", defaults, {"exchange": "PER_STEP"},
                          env).exchange == "per_step"
    with pytest.raises(ConfigError) as err:
        config.resolve("cpsgd_signsgd", defaults, {}, {"MXNET_CPSGD_EXCHANGE": "later"})
    assert ("environment variable MXNET_CPSGD_EXCHANGE must be one of 'per_step', "
            "'per_key', got 'later'") in str(err.value)
    cfg = AlgorithmConfig("fp16", exchange="per_key")
    assert cfg.as_compression_params() == {"exchange": "per_key"}


STORE_ROUTES = r"""
import os
import mxnet as mx, mxnet_cpsgd
from mxnet_cpsgd import AlgorithmConfig
kv = mx.kv.create('topk')
assert kv.group_per_step is True and kv.config.exchange == 'per_step'
kv.set_gradient_compression({'exchange': 'per_key'})
assert kv.group_per_step is False and kv.config.exchange == 'per_key'
kv = mx.kv.create('fp16')
assert kv.group_per_step is False and kv.config.exchange == 'per_key'
kv.set_gradient_compression({'exchange': 'per_step'})
assert kv.group_per_step is True and kv.config.exchange == 'per_step'
assert mxnet_cpsgd.create('cpsgd_topk', exchange='per_key').group_per_step is False
assert mxnet_cpsgd.create(AlgorithmConfig('signsgd', exchange='per_key')).group_per_step \
    is False
assert mxnet_cpsgd.create(AlgorithmConfig('cpsgd_fp16')).group_per_step is False
assert mxnet_cpsgd.create(AlgorithmConfig('cpsgd_topk')).group_per_step is True
os.environ['MXNET_CPSGD_EXCHANGE'] = 'per_key'
kv = mx.kv.create('cpsgd_powersgd')
assert kv.group_per_step is False
kv.set_gradient_compression({'rank': 2})
assert kv.group_per_step is False
kv.set_gradient_compression({'exchange': 'per_step'})   # over the environment
assert kv.group_per_step is True
del os.environ['MXNET_CPSGD_EXCHANGE']
# the attribute overrides the knob until compression_params set it again
kv = mx.kv.create('acpsgd')
kv.group_per_step = False
kv.set_gradient_compression({'rank': 2})
assert kv.group_per_step is False and kv.config.exchange == 'per_step'
kv.set_gradient_compression({'exchange': 'per_step'})
assert kv.group_per_step is True
# a subclass that sets the attribute (a prototype registering a per-key store) keeps it
per_key_fp16 = type('FP16PerKey', (mx.kv.KVStoreBase.kv_registry['fp16'],),
                    {'group_per_step': False})
assert per_key_fp16().group_per_step is False
print('ROUTES OK')
"""


def test_every_route_reaches_a_real_store(tag):
    pytest.importorskip("horovod.mxnet")
    code, out = _python_c(STORE_ROUTES, tag)
    assert code == 0 and "ROUTES OK" in out, out[-4000:]
