"""Settings of the training algorithms: one typed object, three sources.

Settings come, in increasing precedence, from each algorithm's defaults, from
environment variables ``MXNET_CPSGD_<KNOB>`` (for jobs started by MXNet's
``tools/launch.py``), and from the ``compression_params`` dict that
``gluon.Trainer`` hands to the store (or an :class:`AlgorithmConfig` built in
Python).  A knob that the chosen algorithm does not use is an error, never
silently ignored.
"""
import math
import os
from dataclasses import dataclass, fields
from typing import Optional

ENV_PREFIX = "MXNET_CPSGD_"
# MXNET_CPSGD_* variables that are not algorithm knobs (set by the launcher and scripts:
# the worker index, progress reports wanted, the restart count)
NON_KNOB_ENV = ("algorithm", "worker_index", "progress", "restart")


class ConfigError(ValueError):
    """A setting is unknown, not used by the chosen algorithm, or out of range."""


def _positive_float(name, value):
    value = _as_float(name, value)
    if not value > 0 or math.isinf(value):
        raise ConfigError("%s must be a finite number > 0, got %r" % (name, value))
    return value


def _unit_float(name, value):
    value = _as_float(name, value)
    if not 0 <= value < 1:
        raise ConfigError("%s must be in [0, 1), got %r" % (name, value))
    return value


def _closed_unit_float(name, value):
    value = _as_float(name, value)
    if not 0 <= value <= 1:
        raise ConfigError("%s must be in [0, 1], got %r" % (name, value))
    return value


def _nonnegative_float(name, value):
    value = _as_float(name, value)
    if not value >= 0 or math.isinf(value):
        raise ConfigError("%s must be a finite number >= 0, got %r" % (name, value))
    return value


def _optimizer_name(name, value):
    if not isinstance(value, str) or not value:
        raise ConfigError("%s must be the name of an MXNet optimizer, got %r" % (name, value))
    from mxnet.optimizer import Optimizer  # only when the knob is set
    if value.lower() not in Optimizer.opt_registry:
        raise ConfigError("%s: %r is not an MXNet optimizer; known: %s"
                          % (name, value, ", ".join(sorted(Optimizer.opt_registry))))
    return value.lower()


def _ratio(name, value):
    value = _as_float(name, value)
    if not 0 < value <= 1:
        raise ConfigError("%s must be in (0, 1] (the fraction of each tensor's elements "
                          "sent), got %r" % (name, value))
    return value


def _as_float(name, value):
    if isinstance(value, bool):
        raise ConfigError("%s must be a number, got %r" % (name, value))
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ConfigError("%s must be a number, got %r" % (name, value)) from None
    if math.isnan(value):
        raise ConfigError("%s must be a number, got NaN" % name)
    return value


def _int_at_least(minimum):
    def check(name, value):
        if isinstance(value, bool):
            raise ConfigError("%s must be an integer >= %d, got %r" % (name, minimum, value))
        try:
            as_float = float(value)
            as_int = int(as_float)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError("%s must be an integer >= %d, got %r"
                              % (name, minimum, value)) from None
        if as_int != as_float or as_int < minimum:
            raise ConfigError("%s must be an integer >= %d, got %r" % (name, minimum, value))
        return as_int
    return check


def _int_choice(*choices):
    def check(name, value):
        try:
            ok = not isinstance(value, bool) and float(value) in choices
        except (TypeError, ValueError):
            ok = False
        if not ok or int(float(value)) != float(value):
            names = [str(c) for c in choices]
            raise ConfigError("%s must be %s, got %r"
                              % (name, ", ".join(names[:-1]) + " or " + names[-1], value))
        return int(float(value))
    check.choices = choices  # what a command line lists
    return check


def _compression_type(name, value):
    if value != "2bit":
        raise ConfigError("%s must be '2bit' (MXNet's 2-bit quantizer), got %r"
                          % (name, value))
    return value


def _choice(*choices):
    def check(name, value):
        if not isinstance(value, str) or value.lower() not in choices:
            raise ConfigError("%s must be one of %s, got %r"
                              % (name, ", ".join(repr(c) for c in choices), value))
        return value.lower()
    check.choices = choices  # what a command line lists
    check.ignores_case = True  # 'Staggered' is 'staggered'
    return check


#: correction_residual values: what a correction step does with the error memory
CORRECTION_RESIDUAL = ("carry", "fold")


def _correction_residual(name, value):
    if value not in CORRECTION_RESIDUAL:
        raise ConfigError("%s must be 'carry' (the memory skips the dense step, as the "
                          "2-bit store's residual) or 'fold' (the dense step sends gradient "
                          "+ memory and empties it), got %r" % (name, value))
    return value


_correction_residual.choices = CORRECTION_RESIDUAL


# knob -> (validator, meaning); the defaults live with each algorithm's policy
KNOBS = {
    "type": (_compression_type, "compression type; only '2bit'"),
    "threshold": (_positive_float, "2-bit quantization threshold tau"),
    "correction_period": (_int_at_least(1),
                          "every correction_period-th iteration pushes full precision"),
    "correction_schedule": (_choice("aligned", "staggered"),
                            "cpsgd, cpsgd_<compressor>: 'aligned' (every parameter "
                            "corrected on the same iteration, the authors' rule) or "
                            "'staggered' (each parameter at "
                            "its own phase, about 1/correction_period of the bytes per "
                            "iteration)"),
    "correction_delay": (_int_choice(0, 1, 2),
                         "cpsgd: 1 lets the correction round take two compute periods (the "
                         "step after a correction builds on the worker's own weights); 2 "
                         "also the compressed round before it (the correction step builds "
                         "on the own weights too); 0 the authors' rule (default: 2 from 8 "
                         "workers where the other knobs allow it, else 0)"),
    "warmup_steps": (_int_at_least(0), "iterations of plain S-SGD before the algorithm starts"),
    "sync_period": (_int_at_least(1), "iterations between synchronisations with the global model"),
    "local_lr": (_positive_float,
                 "learning rate of the local optimizer at the start; it follows the Trainer's "
                 "schedule (default: num_workers x the Trainer's lr; localsgd: the Trainer's)"),
    "local_momentum": (_unit_float,
                       "momentum of the local optimizer (default: cpsgd and localsgd the Trainer's, "
                       "0 with momentum_path='worker'; odsgd, ssdsgd 0, the authors' value)"),
    "glu_weight": (_closed_unit_float,
                   "SSD-SGD GLU: weight of the snapshot term lr * glu_weight * (w_s - w)"),
    "local_optimizer": (_optimizer_name,
                        "MXNet optimizer name of the local optimizer (default 'sgd')"),
    "local_wd": (_nonnegative_float,
                 "weight decay of the local optimizer (cpsgd default 0; odsgd/ssdsgd default "
                 "the Trainer's)"),
    "ratio": (_ratio, "top-k: fraction of each tensor's elements sent, in (0, 1]"),
    "rank": (_int_at_least(1), "PowerSGD / ACP-SGD: rank of the low-rank approximation"),
    "correction_residual": (_correction_residual,
                            "CP-SGD on all-reduce: 'carry' (the error memory skips a "
                            "correction step) or 'fold' (it is sent with it and emptied)"),
    "momentum_path": (_choice("server", "worker"),
                      "'server' (the servers run the Trainer's momentum, default) or "
                      "'worker' (each worker pushes its own momentum u = beta u + g "
                      "through the compressor; the servers run plain SGD)"),
    "local_input": (_choice("momentum", "gradient"),
                    "cpsgd with momentum_path='worker': what the local step reads, "
                    "'momentum' (u, default) or 'gradient' (g)"),
    "exchange": (_choice("per_step", "per_key"),
                 "compressing all-reduce stores: 'per_step' (a step's messages exchanged "
                 "as one grouped operation once its last key is pushed) or 'per_key' "
                 "(each key exchanged as soon as it is pushed)"),
}


@dataclass(frozen=True)
class AlgorithmConfig:
    """Settings of one store; ``None`` means "not set here".

    Build one in Python and pass it to :func:`mxnet_cpsgd.create`, or turn it
    into the Trainer's ``compression_params`` with :meth:`as_compression_params`.
    A resolved config (``store.config``) has every knob its algorithm uses filled
    in and the others ``None``.

    Args:
        algorithm: registered store name, e.g. ``'cpsgd'``.
        threshold: 2-bit quantization threshold tau (``bitsgd``, ``cpsgd``).
        correction_period: every correction_period-th iteration the push is the
            full-precision gradient (``cpsgd``).
        correction_schedule: ``'aligned'`` (every parameter's correction on the
            same iteration, the authors' rule) or ``'staggered'`` (each parameter
            still every ``correction_period``-th iteration, at a phase of its own
            chosen so that each iteration corrects about 1/correction_period of
            the model's bytes) (``cpsgd``).
        correction_delay: ``cpsgd``: 1 lets the correction round take two compute
            periods (the step after a correction builds on the worker's own
            weights, the next one on the newest global weights again); 2 also
            leaves the compressed round before the correction unwaited for (the
            correction step builds on the own weights too); 0 the authors'
            rule.  Unset: 2 from 8 workers (with correction_period >= 3, the
            aligned schedule and momentum_path 'server'), else 0.
        warmup_steps: iterations of plain S-SGD first (local-update algorithms).
        sync_period: iterations between pulls of the global model (``ssdsgd``)
            or model averages (``localsgd``).
        local_lr: learning rate of the local optimizer at the start; it keeps its
            ratio to the Trainer's learning rate along the Trainer's schedule
            (default: ``num_workers`` x the Trainer's; ``localsgd``: the Trainer's).
        local_momentum: momentum of the local optimizer (default: ``cpsgd``,
            ``cpsgd_<compressor>`` and ``localsgd`` the Trainer's, 0 with
            ``momentum_path='worker'``; ``odsgd``, ``ssdsgd`` 0, the authors' value;
            ``local_momentum=0`` is the authors' CD-SGD setting).
        glu_weight: SSD-SGD's GLU coefficient of the snapshot term.
        type: compression type, only ``'2bit'``.
        local_optimizer: MXNet optimizer name of the local optimizer (default
            ``'sgd'``; ``odsgd``, ``cpsgd``, ``ssdsgd``).
        local_wd: weight decay of the local optimizer (``cpsgd``: 0; ``odsgd``,
            ``ssdsgd``: the Trainer's).
        ratio: fraction of each tensor's elements that ``topk`` sends, in (0, 1].
        rank: rank of the low-rank approximation (``powersgd``, ``acpsgd``), >= 1.
        correction_residual: ``cpsgd_<compressor>`` stores: ``'carry'`` (default;
            a correction step sends the plain gradient and leaves the error memory
            alone) or ``'fold'`` (it sends gradient + memory and empties the memory).
        momentum_path: ``'server'`` (default: the servers run the Trainer's
            momentum) or ``'worker'`` (every worker keeps u = beta u + g, pushes u
            through the compressor, the servers run plain SGD; ``bitsgd``, ``cpsgd``).
        local_input: ``cpsgd`` with ``momentum_path='worker'``: what the local step
            reads, ``'momentum'`` (u, default) or ``'gradient'`` (g).
        exchange: the compressing all-reduce stores (``fp16``, ``signsgd``,
            ``topk``, ``powersgd``, ``acpsgd`` and every ``cpsgd_<compressor>``):
            ``'per_step'`` (a step's compressed messages are held until its last key
            is pushed, then exchanged as one grouped Horovod operation per round) or
            ``'per_key'`` (each key is exchanged as soon as it is pushed, overlapping
            the rest of the backward pass).  Default: ``'per_key'`` for ``fp16`` and
            ``cpsgd_fp16``, ``'per_step'`` for the others.  The update rule is the
            same; only when the collectives run differs.
    """
    algorithm: str
    threshold: Optional[float] = None
    correction_period: Optional[int] = None
    correction_schedule: Optional[str] = None
    correction_delay: Optional[int] = None
    warmup_steps: Optional[int] = None
    sync_period: Optional[int] = None
    local_lr: Optional[float] = None
    local_momentum: Optional[float] = None
    glu_weight: Optional[float] = None
    type: Optional[str] = None
    local_optimizer: Optional[str] = None
    local_wd: Optional[float] = None
    ratio: Optional[float] = None
    rank: Optional[int] = None
    correction_residual: Optional[str] = None
    momentum_path: Optional[str] = None
    local_input: Optional[str] = None
    exchange: Optional[str] = None

    def knobs(self):
        """The knobs that are set, as a dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "algorithm" and getattr(self, f.name) is not None}

    def as_compression_params(self):
        """The dict to pass as ``gluon.Trainer(compression_params=...)``."""
        return self.knobs()


def env_settings(environ=None):
    """Knob values found in ``MXNET_CPSGD_*`` environment variables.

    Unknown ``MXNET_CPSGD_*`` names are an error (a misspelt variable would
    otherwise be ignored).
    """
    environ = os.environ if environ is None else environ
    found = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        knob = key[len(ENV_PREFIX):].lower()
        if knob in NON_KNOB_ENV:
            continue
        if knob not in KNOBS:
            raise ConfigError("unknown environment variable %s; known: %s" % (
                key, ", ".join(ENV_PREFIX + k.upper() for k in sorted(KNOBS))))
        found[knob] = value
    return found


def resolve(algorithm, defaults, params=None, environ=None):
    """Merge defaults < environment < params and validate.

    Args:
        algorithm: the algorithm's registered name (used in messages).
        defaults: knob -> default value for every knob the algorithm accepts
            (``None`` for an optional knob).
        params: the Trainer's ``compression_params`` (or any mapping of knobs).
        environ: environment mapping (default ``os.environ``).

    Returns:
        AlgorithmConfig

    Raises:
        ConfigError: naming the offending setting and what is allowed.
    """
    params = dict(params or {})
    allowed = sorted(defaults)
    sources = [("environment variable " + ENV_PREFIX + "{}", env_settings(environ)),
               ("compression_params['{}']", params)]
    settings = dict(defaults)
    for describe, values in sources:
        for knob, value in values.items():
            label = describe.format(knob.upper() if describe.startswith("env") else knob)
            if knob not in KNOBS:
                raise ConfigError("unknown setting %s for kvstore '%s'; it accepts: %s"
                                  % (label, algorithm, ", ".join(allowed) or "no settings"))
            if knob not in defaults:
                raise ConfigError("%s is not used by kvstore '%s'; it accepts: %s"
                                  % (label, algorithm, ", ".join(allowed) or "no settings"))
            if value is None:
                settings[knob] = None
                continue
            validator = KNOBS[knob][0]
            settings[knob] = validator(label, value)
    if settings.get("local_input") is not None and settings.get("momentum_path") != "worker":
        raise ConfigError("local_input=%r needs momentum_path='worker' (kvstore '%s' runs "
                          "momentum_path=%r)" % (settings["local_input"], algorithm,
                                                 settings.get("momentum_path")))
    _check_correction_delay(settings, algorithm)
    return AlgorithmConfig(algorithm, **settings)


def correction_delay_clashes(settings, delay):
    """What a ``correction_delay`` of ``delay`` (>= 1) needs that ``settings`` (knob ->
    value) lacks, as phrases for an error message; empty when nothing."""
    clashes = []
    # every period keeps one step that builds on pulled global weights
    if (settings.get("correction_period") or 0) < delay + 1:
        clashes.append("correction_period >= %d (got %r)"
                       % (delay + 1, settings.get("correction_period")))
    if settings.get("correction_schedule") == "staggered":
        clashes.append("correction_schedule='aligned'")
    if settings.get("momentum_path") == "worker":
        clashes.append("momentum_path='server'")
    return clashes


def _check_correction_delay(settings, algorithm):
    delay = settings.get("correction_delay")
    if not delay:
        return
    clashes = correction_delay_clashes(settings, delay)
    if clashes:
        raise ConfigError("correction_delay=%d (kvstore '%s') needs %s"
                          % (delay, algorithm, " and ".join(clashes)))


__all__ = ["AlgorithmConfig", "ConfigError", "KNOBS", "resolve", "env_settings",
           "ENV_PREFIX"]


def store_knobs(store_name, config):
    """The knobs a store is built with: a dict, or an AlgorithmConfig for ``store_name``.

    Raises:
        ConfigError: the config names another algorithm.
    """
    if isinstance(config, AlgorithmConfig):
        if config.algorithm.lower() != store_name:
            raise ConfigError("config is for algorithm %r but the store is %r"
                              % (config.algorithm, store_name))
        return config.knobs()
    return dict(config or {})


def check_compression_params(compression_params):
    """What gluon.Trainer hands to ``set_gradient_compression`` must be a dict."""
    if not isinstance(compression_params, dict):
        raise ConfigError("compression_params must be a dict, got %r" % (compression_params,))
    return compression_params
