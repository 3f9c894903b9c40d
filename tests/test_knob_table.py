"""docs/knobs.md is what the stores' definitions generate, and every knob is
reachable from the training scripts with the store's own check."""
import importlib.util
import os
import subprocess
import sys

import pytest

import mxnet_cpsgd
from mxnet_cpsgd.stores import catalog
from mxnet_cpsgd.stores.config import KNOBS, ConfigError
from mxnet_cpsgd.training import knob_table, options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "knobs.md")


def _script(name):
    spec = importlib.util.spec_from_file_location(
        "script_" + name, os.path.join(ROOT, "scripts", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_is_what_the_code_generates():
    with open(PAGE) as f:
        committed = f.read()
    assert committed == knob_table.render(), (
        "docs/knobs.md is out of date: python -m mxnet_cpsgd.training.knob_table docs/knobs.md")


def test_check_mode_fails_on_a_stale_page(tmp_path):
    stale = tmp_path / "knobs.md"
    stale.write_text(knob_table.render().replace("| `cpsgd` |", "| `cpsgd-old` |"))
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "mxnet_cpsgd.training.knob_table", "--check", str(stale)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "out of date" in proc.stderr
    # writing it makes the check pass
    subprocess.run(cmd[:3] + [str(stale)], env=env, check=True, timeout=300)
    assert subprocess.run(cmd, env=env, timeout=300).returncode == 0


def test_every_store_and_knob_is_in_the_table():
    found = catalog.stores()
    assert set(found) == set(mxnet_cpsgd.ALGORITHMS)
    page = knob_table.render()
    for name in found:
        assert "| `%s` |" % name in page
    for knob in KNOBS:
        assert "| `%s` |" % knob in page


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_the_range_shown_is_the_one_the_check_enforces(knob):
    """The check refuses -1 or a non-number with the message the table quotes."""
    shown = knob_table.knob_range(knob)
    refused = []
    for value in (-1, "", object()):
        try:
            KNOBS[knob][0](knob, value)
        except ConfigError as err:
            refused.append(str(err))
    assert refused and any(shown in message for message in refused)


def _accepting_store(knob):
    """A store that accepts ``knob`` and has a value for it by default."""
    for name, (_, defaults) in catalog.stores().items():
        if defaults.get(knob) is not None:
            return name, defaults[knob]
    return None, None


@pytest.mark.parametrize("knob", sorted(k for k in KNOBS if k not in options.NO_FLAG_KNOBS))
def test_every_knob_has_a_script_flag_that_reaches_the_store(knob):
    name, default = _accepting_store(knob)
    if name is None:
        pytest.skip("no store sets %s by default" % knob)
    flag = options.KNOB_FLAGS[knob][0]
    parser = _script("train_mnist").get_parser()
    args = options.parse_args(parser, ["--algorithm", name, flag, str(default)])
    params = options.compression_params(args)
    assert params[knob] == default and type(params[knob]) is type(default)


def test_correction_schedule_flag():
    parser = _script("train_mnist").get_parser()
    args = options.parse_args(parser, ["--algorithm", "cpsgd",
                                       "--correction-schedule", "staggered"])
    assert options.compression_params(args)["correction_schedule"] == "staggered"
    with pytest.raises(SystemExit):
        options.parse_args(parser, ["--algorithm", "cpsgd", "--correction-schedule", "x"])


def test_script_warmup_default_reaches_every_store_with_a_warmup():
    """train_mnist's warm-up of 100 iterations replaces the store's default on every
    store that warms up by default (the cpsgd_<compressor> stores included) and is
    never passed to one whose warm-up is off or absent."""
    parser = _script("train_mnist").get_parser()
    for name, (_, defaults) in catalog.stores().items():
        params = options.compression_params(options.parse_args(parser, ["--algorithm", name]))
        if defaults.get("warmup_steps") is not None:
            assert params.get("warmup_steps") == 100, name
        else:
            assert "warmup_steps" not in params, name


def test_help_shows_no_meaningless_defaults():
    text = _script("train_mnist").get_parser().format_help()
    assert "(default: None)" not in text
    assert "(default: True)" not in text and "(default: False)" not in text
    assert "(default: not passed" not in text
    assert "--correction-schedule" in text and "docs/knobs.md" in text
