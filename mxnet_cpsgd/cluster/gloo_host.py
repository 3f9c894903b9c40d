"""What every worker of a multi-host all-reduce job runs on its host before
the training command: ``python -m mxnet_cpsgd.cluster.gloo_host --hosts N --
COMMAND ARGS...`` (the launcher puts it there; N: how many hosts the job spans).

Horovod 0.28.1's Gloo listens on two kinds of address.  Its global, local and
cross contexts use the interface named by ``HOROVOD_GLOO_IFACE``; the context of
every process set (the global set included) is made without it, on the first
address the host's *name* resolves to (``gethostname`` then ``getaddrinfo``).
So this:

* sets ``HOROVOD_GLOO_IFACE`` to the interface that holds this host's address
  towards the rendezvous service (``HOROVOD_GLOO_RENDEZVOUS_ADDR``);
* with N > 1, checks that the host's name resolves to an address the other
  hosts can reach (not loopback), and otherwise ends at once (GlooHostError)
  saying what to change, instead of a Gloo connection error after the
  rendezvous (many distributions map the host name to 127.0.1.1);

and then runs COMMAND in its place (``exec``: same pid, same process).
"""
import argparse
import fcntl
import ipaddress
import os
import socket
import struct
import subprocess
import sys
from typing import List, Optional

class GlooHostError(RuntimeError):
    """This host cannot take part in the job as it is set up."""


#: ioctl SIOCGIFADDR: an interface's (first) IPv4 address
_SIOCGIFADDR = 0x8915


def local_address(peer: str, port: int) -> str:
    """This host's address on the route to ``peer`` (no packet is sent)."""
    family, _, _, _, address = socket.getaddrinfo(peer, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        return sock.getsockname()[0]


def interface_of(address: str) -> Optional[str]:
    """The name of the interface holding ``address``, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    try:  # secondary and IPv6 addresses: iproute2's listing
        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        words = line.split()
        if len(words) > 3 and words[3].split("/")[0] == address:
            return words[1]
    return None


def name_problem(hostname: str) -> Optional[str]:
    """Why Horovod's process-set contexts cannot be reached from other hosts
    here (the host name resolves to loopback or not at all), or None."""
    try:
        first = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as err:
        return "this host's name %r does not resolve (%s)" % (hostname, err)
    if ipaddress.ip_address(first.split("%")[0]).is_loopback:
        return "this host's name %r resolves to %s (loopback)" % (hostname, first)
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mxnet_cpsgd.cluster.gloo_host")
    p.add_argument("--hosts", type=int, default=1, help="how many hosts the job spans (default 1)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command")
    env = dict(os.environ)
    rendezvous = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    if rendezvous and not env.get("HOROVOD_GLOO_IFACE"):
        mine = local_address(rendezvous, int(env.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "0")))
        iface = interface_of(mine)
        if iface is None:
            raise GlooHostError("no interface holds %s, this host's address towards the "
                                "rendezvous service at %s" % (mine, rendezvous))
        env["HOROVOD_GLOO_IFACE"] = iface
    if args.hosts > 1:
        problem = name_problem(socket.gethostname())
        if problem:
            raise GlooHostError("%s; Horovod's Gloo listens on that address for its "
                                "process sets, so the other hosts cannot connect: map the "
                                "name to this host's own address (/etc/hosts or DNS)"
                                % problem)
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        raise GlooHostError("cannot run %s: %s" % (command[0], err)) from None


if __name__ == "__main__":
    sys.exit(main())
