"""Picking a scheduler port: standard library only.

:mod:`.ssh` sends this module's source to a remote host, which may not have
``mxnet_cpsgd`` installed, to pick the port a scheduler started there will bind;
:func:`mxnet_cpsgd.cluster.nodes.free_port` runs the same code here.
"""
import random
import socket

#: lowest port :func:`free_port` picks from (below the kernel's ephemeral range)
FREE_PORT_LOW = 20000


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(address="127.0.0.1"):
    """A TCP port that is free on ``address`` right now.

    Chosen below the kernel's ephemeral range where there is room: ps-lite's servers
    and workers bind ports the kernel hands out from that range, so a scheduler port
    from it could be taken by another node (of this job or another) between this call
    and the scheduler's bind, and that node would then receive the scheduler's messages.

    Args:
        address: the address to test the port on ('' for every interface).
    """
    low, high = FREE_PORT_LOW, _ephemeral_low() - 1
    if high - low >= 1000:  # else too little room: the kernel's choice below
        pick = random.SystemRandom()
        for _ in range(100):
            port = pick.randint(low, high)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((address, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]
