"""A spec's emulated hosts: where a run's nodes go and how its links are shaped.

``placement`` (spec or experiment key): ``separate`` (the default: every node on its
own emulated host, ``num_servers`` servers, 1 unless given) or ``colocated`` (one
host per worker running that worker and one server, the scheduler on host 0, as
``cpsgd-bench``'s default and MXNet's tools/launch.py; ``num_servers`` defaults to
the run's worker count).  A run's ``rates`` entry is the link of every host
(``RATE[,DELAY][,QUEUE]``, e.g. ``150mbit,fair``); when the run's training flags
include ``time-scale`` D, the links are emulated D times slower (rates / D, delays x
D), as ``cpsgd-bench --time-scale`` does, while the script pads its compute x D
(``--emulate-compute``).
"""
from typing import Dict, Optional

PLACEMENTS = ("separate", "colocated")


def check_placement(value: object) -> Optional[str]:
    """What is wrong with a ``placement`` value (None: nothing)."""
    if value is None or value in PLACEMENTS:
        return None
    return "placement must be one of %s, got %r" % (", ".join(PLACEMENTS), value)


def num_servers(placement: str, given: Optional[object], num_workers: int) -> int:
    """The servers of a run: ``given`` if set, else one per worker when colocated,
    else 1."""
    if given is not None:
        return int(given)
    return num_workers if placement == "colocated" else 1


def job_network(rate: Optional[str], args: Dict[str, object]) -> Optional[str]:
    """The launcher's ``emulate_network`` for a run of ``rate`` with training flags
    ``args`` (dilated by their ``time-scale``; None for an unshaped run)."""
    if not rate:
        return None
    scale = args.get("time-scale")
    if scale in (None, False, 1, 1.0, "1"):
        return rate
    from ..cluster import netspec
    return netspec.dilate_spec(rate, scale)


def launcher_flags(rate: Optional[str], args: Dict[str, object], placement: str) -> str:
    """The network flags of ``cpsgd-launch`` for such a run (with a leading space;
    empty for an unshaped run on separate hosts)."""
    text = " --emulate-network %s" % rate if rate else ""
    scale = args.get("time-scale")
    if rate and scale not in (None, False, 1, 1.0, "1"):
        text += " --time-scale %s" % scale
    if placement != "separate":
        text += " --placement %s" % placement
    return text
