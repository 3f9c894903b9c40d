"""Algorithm policies, one file each, and a factory by name."""
from .asgd import ASGD
from .base import Local, Payload, Policy, Pull, Push, StepPlan
from .bitsgd import BITSGD
from .cpsgd import CPSGD
from .localsgd import LocalSGD
from .odsgd import ODSGD
from .ssdsgd import SSDSGD
from .ssgd import SSGD

POLICIES = {cls.name: cls for cls in (SSGD, BITSGD, ASGD, ODSGD, CPSGD, SSDSGD, LocalSGD)}


def policy_class(name):
    """The policy class registered under ``name``; KeyError lists the known names."""
    try:
        return POLICIES[name.lower()]
    except KeyError:
        raise KeyError("unknown algorithm %r; known: %s"
                       % (name, ", ".join(sorted(POLICIES)))) from None


__all__ = ["POLICIES", "policy_class", "Policy", "StepPlan", "Push", "Pull", "Local",
           "Payload", "SSGD", "BITSGD", "ASGD", "ODSGD", "CPSGD", "SSDSGD", "LocalSGD"]
