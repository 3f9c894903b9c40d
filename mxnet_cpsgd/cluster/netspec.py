"""Network settings as the launcher and the benchmark take them: ``RATE[,DELAY][,QUEUE]``
parsed into a :class:`NetworkSpec`, and time dilation of such a setting.

Pure parsing (no root, no ``ip``/``tc``); :mod:`mxnet_cpsgd.cluster.netem` builds the
networks and re-exports these names.
"""
import math
import os
import re
from dataclasses import dataclass
from typing import Optional

_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_DELAY_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
#: the queue disciplines a link can have (see the module docstring)
QUEUES = ("fifo", "fair")


class NetemError(RuntimeError):
    """Network emulation is unavailable, misconfigured, or a command failed."""


@dataclass(frozen=True)
class NetworkSpec:
    """A parsed ``RATE[,DELAY][,QUEUE]`` setting.

    Args:
        rate: rate in tc syntax, e.g. ``'100mbit'``.
        rate_bps: the rate in bits per second.
        delay: one-way delay in tc syntax (e.g. ``'0.2ms'``) or None.
        delay_s: the delay in seconds (0 when None).
        queue: ``'fifo'`` or ``'fair'`` (see the module docstring).
    """
    rate: str
    rate_bps: float
    delay: Optional[str] = None
    delay_s: float = 0.0
    queue: str = "fifo"


def parse_rate(text: str) -> float:
    """Bits per second of a tc rate such as ``'100mbit'`` (SI units, as tc).

    Args:
        text: the rate; units bit, kbit, mbit, gbit or tbit.

    Raises:
        NetemError: malformed or non-positive rate.
    """
    match = _RATE_RE.match(text.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise NetemError("bad rate %r: expected a positive number with unit "
                         "bit, kbit, mbit, gbit or tbit, e.g. 100mbit" % text)
    return float(match.group(1)) * _RATE_UNITS[match.group(2)]


def parse_delay(text: str) -> float:
    """Seconds of a tc time such as ``'0.2ms'``.

    Args:
        text: the delay; units us, ms or s.

    Raises:
        NetemError: malformed or negative delay.
    """
    match = _DELAY_RE.match(text.strip().lower())
    if not match:
        raise NetemError("bad delay %r: expected a number with unit us, ms "
                         "or s, e.g. 0.2ms" % text)
    return float(match.group(1)) * _DELAY_UNITS[match.group(2)]


def parse_spec(text: str) -> NetworkSpec:
    """Parse the launcher's ``--emulate-network RATE[,DELAY][,QUEUE]`` value.

    Args:
        text: e.g. ``'100mbit'``, ``'1gbit,0.2ms'`` or ``'50mbit,fair'``; QUEUE is
            ``fifo`` (the default) or ``fair``.

    Raises:
        NetemError: with a message naming the expected syntax.
    """
    parts = [part.strip().lower() for part in text.split(",")]
    queue = "fifo"
    if len(parts) > 1 and parts[-1] in QUEUES:
        queue = parts.pop()
    if len(parts) not in (1, 2) or not parts[0]:
        raise NetemError("bad --emulate-network value %r: expected RATE[,DELAY][,QUEUE] "
                         "with QUEUE fifo or fair, e.g. 100mbit, 1gbit,0.2ms or 50mbit,fair"
                         % text)
    rate_bps = parse_rate(parts[0])
    delay = parts[1] if len(parts) == 2 else None
    spec = NetworkSpec(parts[0], rate_bps, delay, parse_delay(delay) if delay else 0.0, queue)
    _check_queue(spec.queue, spec.rate, spec.delay)
    return spec


def parse_time_scale(text) -> float:
    """A time-dilation factor D (``--time-scale``): a finite number >= 1.

    Args:
        text: the factor as given (a string or a number).

    Raises:
        NetemError: not a number, not finite, or below 1.
    """
    try:
        scale = float(text)
    except (TypeError, ValueError):
        raise NetemError("bad time scale %r: expected a number >= 1, e.g. 10" % (text,)) \
            from None
    if not math.isfinite(scale) or scale < 1:
        raise NetemError("bad time scale %r: expected a number >= 1 (1 = real time; "
                         "D > 1 slows links and compute down D times)" % (text,))
    return scale


def _format_number(value: float) -> str:
    # plain decimals (the rate and delay syntax has no exponents)
    return ("%.6f" % value).rstrip("0").rstrip(".")


def dilate_spec(text: str, scale: float) -> str:
    """The ``RATE[,DELAY][,QUEUE]`` value of a network ``scale`` times slower:
    the rate divided by ``scale``, the delay multiplied by it (time-dilated
    emulation: the ratio of transfer time to compute stays the same when the
    compute is slowed down by the same factor).

    Args:
        text: a ``--emulate-network`` value, e.g. ``'100mbit,0.2ms'``.
        scale: the dilation factor D >= 1 (:func:`parse_time_scale`).

    Returns:
        e.g. ``'10000000bit,2ms'`` for D = 10; ``text`` itself for D = 1.

    Raises:
        NetemError: a bad value or factor.
    """
    spec = parse_spec(text)
    scale = parse_time_scale(scale)
    if scale == 1:
        return text
    # whole bits per second: tc's own resolution
    parts = ["%dbit" % max(1, round(spec.rate_bps / scale))]
    if spec.delay:
        parts.append("%sus" % _format_number(spec.delay_s * 1e6 * scale))
    if spec.queue != "fifo":
        parts.append(spec.queue)
    return ",".join(parts)


def _check_queue(queue: str, rate: Optional[str], delay: Optional[str]) -> None:
    if queue not in QUEUES:
        raise NetemError("bad queue %r: expected one of %s" % (queue, ", ".join(QUEUES)))
    if queue == "fair" and not rate:
        raise NetemError("queue 'fair' shares a rate between flows: give a rate")
    if queue == "fair" and delay:
        # netem's child would be the htb tree; not built (this kernel has no netem to
        # test it on)
        raise NetemError("queue 'fair' with a delay is not supported; give RATE,fair "
                         "or RATE,DELAY")


#: bytes each leaf of a 'fair' link may queue, instead of as much as the link's tbf
#: queue: an experiment's setting, read when a link is set up.  With N busy leaves a leaf
#: drains at 1/N of the rate, so a full leaf holds a packet N times as long as the whole
#: link's queue would; a host's fq_codel keeps each flow's queue near 5 ms instead
FAIR_LEAF_LIMIT_ENV = "CPSGD_FAIR_LEAF_LIMIT"


def fair_leaf_limit(burst: int) -> Optional[int]:
    """$CPSGD_FAIR_LEAF_LIMIT in bytes, or None when unset; NetemError below ``burst``."""
    text = os.environ.get(FAIR_LEAF_LIMIT_ENV)
    if not text:
        return None
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if limit < burst:
        raise NetemError("%s=%r: give a leaf's queue in bytes, at least the link's burst "
                         "(%d)" % (FAIR_LEAF_LIMIT_ENV, text, burst))
    return limit


TCP_CONGESTION_ENV = "CPSGD_TCP_CONGESTION"
_SYSCTL = "/proc/sys/net/ipv4/tcp_%s_congestion_control"


def machine_tcp_congestion() -> str:
    """This machine's default TCP congestion control, which a new namespace inherits."""
    with open(_SYSCTL.replace("%s_", "")) as f:
        return f.read().strip()


def check_tcp_congestion(name: str) -> str:
    """``name`` if a new namespace may use that TCP congestion control, else NetemError.

    The kernel lets a namespace other than the machine's own choose only the algorithms
    in ``net.ipv4.tcp_allowed_congestion_control``."""
    try:
        with open(_SYSCTL % "available") as f:
            available = f.read().split()
        with open(_SYSCTL % "allowed") as f:
            allowed = f.read().split()
    except OSError as err:
        raise NetemError("cannot choose a TCP congestion control here: %s" % err)
    if name not in available:
        raise NetemError("TCP congestion control %r: this kernel offers %s"
                         % (name, ", ".join(available)))
    if name not in allowed:
        raise NetemError("TCP congestion control %r: the kernel lets a namespace use only "
                         "%s; allow it (as root) with sysctl -w "
                         "net.ipv4.tcp_allowed_congestion_control='%s'"
                         % (name, ", ".join(allowed), " ".join(allowed + [name])))
    return name


def tcp_congestion_setting() -> Optional[str]:
    """``$CPSGD_TCP_CONGESTION``, checked, or None when unset (a new namespace then keeps
    the machine's default, e.g. bbr where the machine uses it).

    Raises:
        NetemError: a namespace may not use that congestion control.
    """
    name = os.environ.get(TCP_CONGESTION_ENV, "").strip()
    return check_tcp_congestion(name) if name else None
