"""Every store this package registers, by name: its transport and its knobs' defaults.

Read from the stores' own definitions (each policy's ``defaults``, each
compressing all-reduce store's ``knob_defaults()``; ``horovod`` has no knobs),
so a knob or store added there shows up here, in the training scripts' flags
and in the generated reference page docs/knobs.md without further edits.
Importing this module imports MXNet (the policies' and compressors' modules),
never Horovod.
"""

PARAMETER_SERVER = "parameter server"
ALLREDUCE = "all-reduce (Horovod)"


def stores():
    """name -> (transport, {knob: default}), parameter-server stores first, in the
    order their packages list them; a default of None means "not set" (the knob's
    meaning in :data:`~.config.KNOBS` says what the store does then)."""
    from .policies import POLICIES
    from .allreduce.horovod import NAME as HOROVOD
    from .allreduce.compressors import STORES as COMPRESSED

    found = {}
    for name, policy in POLICIES.items():
        found[name] = (PARAMETER_SERVER, dict(policy.defaults))
    found[HOROVOD] = (ALLREDUCE, {})
    # each compressor alone, then CP-SGD around each
    for name, cls in sorted(COMPRESSED.items(), key=lambda item: item[0].startswith("cpsgd_")):
        found[name] = (ALLREDUCE, dict(cls.knob_defaults()))
    return found


def knob_defaults(name):
    """{knob: default} of the store ``name``; KeyError lists the known names."""
    found = stores()
    try:
        return found[name.lower()][1]
    except KeyError:
        raise KeyError("unknown store %r; known: %s" % (name, ", ".join(found))) from None


__all__ = ["PARAMETER_SERVER", "ALLREDUCE", "stores", "knob_defaults"]
