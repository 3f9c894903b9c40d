"""Every command's --help shows each option's default and choices.

Walks the parser of every command and ``python -m`` entry point (built by its
module's own function, no subprocess) and fails on an option with no help, a
value-taking option whose help does not say what leaving it out means (the word
"default", with the value where there is one), and an option that takes one of
a fixed set of values without listing them.
"""
import argparse
import importlib
import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script_parser(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts",
                                                                     name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_parser()


class _Built(Exception):
    def __init__(self, parser):
        super().__init__("parser built")
        self.parser = parser


def _parser_of_main(module_name):
    """The parser a module's main() builds and parses with (for a CLI whose parser
    has no function of its own): main runs up to parse_args, which hands the
    parser back instead of parsing."""
    module = importlib.import_module(module_name)

    def hand_back(parser, args=None, namespace=None):
        raise _Built(parser)

    saved = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = hand_back
    try:
        module.main([])
    except _Built as built:
        return built.parser
    finally:
        argparse.ArgumentParser.parse_args = saved
    raise AssertionError("%s.main() parsed no arguments" % module_name)


def _built_by(module_name, function="_parser"):
    return lambda: getattr(importlib.import_module(module_name), function)()


#: command -> what builds its parser
PARSERS = {
    "cpsgd-launch": _built_by("mxnet_cpsgd.cluster.launch_options", "build_parser"),
    "cpsgd-bench": _built_by("mxnet_cpsgd.bench.options", "build_parser"),
    "cpsgd-reproduce": _built_by("mxnet_cpsgd.repro.runner"),
    "train_mnist.py": lambda: _script_parser("train_mnist"),
    "train_cifar.py": lambda: _script_parser("train_cifar"),
    "train_imagenet.py": lambda: _script_parser("train_imagenet"),
    "mxnet_cpsgd.repro.report": _built_by("mxnet_cpsgd.repro.report"),
    "mxnet_cpsgd.bench.faults": _built_by("mxnet_cpsgd.bench.faults"),
    "mxnet_cpsgd.bench.layout": _built_by("mxnet_cpsgd.bench.layout"),
    "mxnet_cpsgd.bench.worker": _built_by("mxnet_cpsgd.bench.worker"),
    "mxnet_cpsgd.training.knob_table": _built_by("mxnet_cpsgd.training.knob_table"),
    "mxnet_cpsgd.cluster.rendezvous": _built_by("mxnet_cpsgd.cluster.rendezvous"),
    "mxnet_cpsgd.cluster.gloo_host": _built_by("mxnet_cpsgd.cluster.gloo_host"),
    "mxnet_cpsgd.cluster.netem": lambda: _parser_of_main("mxnet_cpsgd.cluster.netem"),
}


def _fixed_sets():
    """(command, option) -> the values an option takes one (or a list) of, for the
    options that check them after parsing rather than with argparse's choices."""
    from mxnet_cpsgd.bench.faults import CONFIGS, KINDS
    from mxnet_cpsgd.bench.runs import MODEL_ALIASES
    from mxnet_cpsgd.cluster.netem import QUEUES
    return {
        ("cpsgd-bench", "--model"): tuple(set(MODEL_ALIASES.values())),
        ("mxnet_cpsgd.bench.layout", "--model"): tuple(MODEL_ALIASES),
        ("mxnet_cpsgd.bench.faults", "--configs"): tuple(CONFIGS),
        ("mxnet_cpsgd.bench.faults", "--kinds"): tuple(KINDS),
        ("cpsgd-launch", "--emulate-network"): tuple(QUEUES),
    }


def _help_text(parser, action):
    """The option's help as --help prints it (defaults added by the formatter)."""
    formatter = parser._get_formatter()
    return re.sub(r"\s+", " ", formatter._expand_help(action))


def _renderings(value):
    """Ways a help text may write a default value."""
    if isinstance(value, str) and "," in value:  # a comma-separated list
        value = value.split(",")
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
        return {",".join(items), " ".join(items), ", ".join(items)}
    shown = {str(value)}
    if isinstance(value, float):
        shown.add("%g" % value)
    return shown


def _is_switch(action):
    return action.nargs == 0


def _empty(value):
    return value is None or (isinstance(value, (str, list, tuple)) and not value)


def defects(command, parser):
    """What the parser's --help fails to show, one line per defect."""
    fixed = _fixed_sets()
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        name = "%s %s" % (command, "/".join(action.option_strings))
        if not action.help or action.help == argparse.SUPPRESS:
            found.append("%s: no help" % name)
            continue
        text = _help_text(parser, action)
        listed = text + " " + parser._get_formatter()._format_action_invocation(action)
        if action.choices is not None:
            missing = [str(c) for c in action.choices if str(c) not in listed]
            if missing:
                found.append("%s: choices not listed: %s" % (name, ", ".join(missing)))
        for option in action.option_strings:
            values = fixed.get((command, option))
            missing = [v for v in values or () if v not in text]
            if missing:
                found.append("%s: values not listed: %s" % (name, ", ".join(missing)))
        if _is_switch(action) or action.required:
            continue
        if not re.search(r"\bdefault", text, re.IGNORECASE):
            found.append("%s: help does not say what leaving it out means (default)" % name)
        elif not _empty(action.default) and not any(
                shown in text for shown in _renderings(action.default)):
            found.append("%s: default %r not shown" % (name, action.default))
    return found


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_shows_its_default_and_choices(command):
    parser = PARSERS[command]()
    bad = defects(command, parser)
    assert not bad, "\n".join(bad)


def test_the_check_finds_what_it_is_for():
    p = argparse.ArgumentParser()
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--iters", type=int, default=30, help="timed iterations")
    p.add_argument("--rate", default="1gbit", help="link rate (default 100mbit)")
    p.add_argument("--out", default=None, help="results directory")
    p.add_argument("--queue", choices=("fifo", "fair"), metavar="Q", default=None,
                   help="link queue (default: the system's)")
    p.add_argument("--fine", type=float, default=0.5, help="a threshold (default 0.5)")
    p.add_argument("--unset", default=None, help="a file (default: none)")
    bad = defects("x", p)
    assert bad == ["x --quiet: no help",
                   "x --iters: help does not say what leaving it out means (default)",
                   "x --rate: default '1gbit' not shown",
                   "x --out: help does not say what leaving it out means (default)",
                   "x --queue: choices not listed: fifo, fair"], bad


def test_knobs_with_a_fixed_set_of_values_list_them():
    # every knob whose validator accepts one of a fixed set: its script flag lists it
    from mxnet_cpsgd.stores.config import KNOBS
    from mxnet_cpsgd.training.options import KNOB_FLAGS
    parser = _script_parser("train_mnist")
    by_dest = {a.dest: a for a in parser._actions}
    with_choices = [k for k, (check, _) in KNOBS.items() if getattr(check, "choices", None)]
    assert "correction_schedule" in with_choices and "correction_residual" in with_choices
    for knob in with_choices:
        if knob in KNOB_FLAGS:
            assert tuple(by_dest[knob].choices) == tuple(KNOBS[knob][0].choices), knob
