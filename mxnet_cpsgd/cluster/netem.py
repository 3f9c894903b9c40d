"""Emulate a cluster network on one Linux machine (root only).

Every node gets its own network namespace, joined to one bridge in the root
namespace by a veth pair, with both directions of its link shaped by
``tc ... tbf`` (the namespace end shapes what the node sends, the bridge end
what it receives) and, when a delay is given, a ``netem`` delay on the
namespace end, so that the one-way delay between any two nodes is DELAY.

Queue discipline (``queue``): ``'fifo'`` (default) queues what a link direction sends in
one FIFO (tbf's, 400 ms deep); ``'fair'`` shares the rate between TCP flows, like a host's
fq_codel: an HTB class at the rate with :data:`FAIR_BUCKETS` leaves (deficit round robin,
packets hashed to a leaf by destination port; this kernel has neither fq_codel nor sfq),
each as deep as tbf's queue or ``$CPSGD_FAIR_LEAF_LIMIT`` bytes.  With one FIFO a burst of
one flow holds back the others (reports/perf/colocated-2-4-workers.md).  A namespace's
TCP congestion control is the machine's default unless ``$CPSGD_TCP_CONGESTION`` names one.

Nodes get addresses 198.18.0.10, .11, ... from 198.18.0.0/15 (reserved for
benchmarks).  The bridge gets no address: nodes talk at layer 2 only, so the root
namespace's routing table is never touched and several jobs can use the same
addresses at once on their own bridges.  Parsing the settings: :mod:`.netspec`.

Every namespace and link gets the job's unique name prefix ``cpsgd`` + five
hex digits; :meth:`EmulatedNetwork.close` removes exactly those (and kills any
process still inside its namespaces).  It runs on leaving the ``with`` block,
at interpreter exit (atexit) and on SIGTERM/SIGHUP (turned into
``SystemExit`` while a network is up, unless the program has its own
handler).  Only a SIGKILL of the owning process can leave anything behind;
``python -m mxnet_cpsgd.cluster.netem --list`` / ``--cleanup`` finds and removes such
leftovers.

Example::

    with EmulatedNetwork(2, "100mbit", delay="0.2ms") as net:
        server = subprocess.Popen(net.nodes[0].wrap(["python", "srv.py"]))
        ...
"""
import argparse
import atexit
import ipaddress
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import sys
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

# the settings' parsing lives in netspec; re-exported, these stay this module's names
from .netspec import (QUEUES, NetemError, NetworkSpec, _check_queue, fair_leaf_limit,  # noqa: F401
                      dilate_spec, parse_delay, parse_rate, parse_spec, parse_time_scale,
                      tcp_congestion_setting)

#: every name this module creates starts with this prefix + five hex digits
NAME_PREFIX = "cpsgd"
_NAME_RE = re.compile(r"^%s[0-9a-f]{5}" % NAME_PREFIX)
_FIRST_ADDRESS = ipaddress.IPv4Address("198.18.0.10")
_PREFIX_LEN = 16  # 198.18.0.0/16, inside the reserved 198.18.0.0/15
#: interface names are at most 15 bytes: 10 (job) + 1 + up to 4 digits
MAX_NODES = 1000

#: leaf classes of a 'fair' link; two flows share one with probability 1/64
FAIR_BUCKETS = 64

# Networks that are set up and not yet closed, for the atexit/signal cleanup.
_LIVE: Set["EmulatedNetwork"] = set()
_LIVE_LOCK = threading.Lock()


def check_available() -> None:
    """Fail clearly unless this process can build emulated networks.

    Raises:
        NetemError: not root, ``ip``/``tc`` missing, or ``ip netns`` unusable.
    """
    if os.geteuid() != 0:
        raise NetemError("network emulation needs root (it creates network "
                         "namespaces, a bridge and tc qdiscs)")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetemError("network emulation needs %s (package iproute2), not "
                         "found on PATH" % " and ".join(missing))
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise NetemError("'ip netns list' failed: %s" % probe.stderr.strip())


def _run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one ip/tc command; raise NetemError with its stderr when it fails."""
    done = subprocess.run(list(args), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetemError("%s failed: %s" % (" ".join(args), done.stderr.strip()))
    return done


@dataclass(frozen=True)
class EmulatedNode:
    """One node of an emulated network.

    Args:
        index: position in :attr:`EmulatedNetwork.nodes`.
        netns: the network namespace's name.
        address: the node's IPv4 address (on ``eth0`` inside the namespace).
        host_link: the veth end on the bridge, in the root namespace.
    """
    index: int
    netns: str
    address: str
    host_link: str

    def wrap(self, cmd: Sequence[str]) -> List[str]:
        """The command line that runs ``cmd`` inside this node's namespace.

        Args:
            cmd: program and arguments.
        """
        # ip netns exec execs the program, so the pid is the program's own.
        return ["ip", "netns", "exec", self.netns] + list(cmd)


def _new_job_name() -> str:
    """A name prefix that no existing namespace or link uses."""
    taken = leftovers()
    used = {_NAME_RE.match(name).group(0) for name in taken["namespaces"] + taken["links"]}
    while True:
        name = NAME_PREFIX + secrets.token_hex(3)[:5]
        if name not in used:
            return name


def _tbf_args(rate_bps: float, rate: str) -> List[str]:
    """tbf settings: a burst of at least 64 KiB (one GSO packet) or 1 ms of
    traffic, and a queue of 400 ms of traffic (at least 4 bursts, at most 64 MiB).

    The queue is deep on purpose: with 50 ms, the parameter server's fan-out
    (one sender, several TCP streams) overflowed it and lost 30-150 packets per
    iteration at 50mbit; the retransmissions then showed up in the byte counts.
    400 ms removed every drop in that measurement (reports/perf/colocated-2-4-workers.md)."""
    burst, limit = _queue_sizes(rate_bps)
    return ["tbf", "rate", rate, "burst", str(burst), "limit", str(limit)]


def _queue_sizes(rate_bps: float) -> Tuple[int, int]:
    """(burst, limit) in bytes of a link direction's queue at ``rate_bps``: see
    :func:`_tbf_args`; a 'fair' link uses them for its htb class and leaves."""
    rate_bytes = rate_bps / 8.0
    burst = max(64 * 1024, int(rate_bytes * 1e-3))
    limit = min(max(4 * burst, int(rate_bytes * 0.4)), 64 * 1024 * 1024)
    return burst, limit


def _fair_queue_batch(dev: str, rate_bps: float, rate: str) -> str:
    """``tc -batch`` lines that give ``dev`` a 'fair' queue at ``rate``.

    One HTB class at the rate (tbf's burst) over FAIR_BUCKETS leaves, each guaranteed
    1/FAIR_BUCKETS of it and allowed all of it, so busy leaves split the rate by deficit
    round robin (16 KiB quantum); each leaf queues in a bfifo as deep as tbf's queue (or
    $CPSGD_FAIR_LEAF_LIMIT bytes).  A u32 hash on the low bits of the TCP destination
    port picks the leaf; other packets go to the first leaf."""
    burst, limit = _queue_sizes(rate_bps)
    limit = fair_leaf_limit(burst) or limit
    share = max(8000, int(rate_bps / FAIR_BUCKETS))
    lines = ["qdisc add dev %s root handle 1: htb default 10 r2q 1000" % dev,
             "class add dev %s parent 1: classid 1:1 htb rate %s ceil %s burst %d cburst %d"
             % (dev, rate, rate, burst, burst)]
    for bucket in range(FAIR_BUCKETS):
        leaf = "%x" % (0x10 + bucket)
        lines.append("class add dev %s parent 1:1 classid 1:%s htb rate %dbit ceil %s "
                     "burst %d cburst %d quantum 16384" % (dev, leaf, share, rate, burst, burst))
        lines.append("qdisc add dev %s parent 1:%s bfifo limit %d" % (dev, leaf, limit))
    lines.append("filter add dev %s parent 1: prio 1 handle 2: protocol ip u32 divisor %d"
                 % (dev, FAIR_BUCKETS))
    for bucket in range(FAIR_BUCKETS):
        lines.append("filter add dev %s parent 1: prio 1 protocol ip u32 ht 2:%x: "
                     "match u32 0 0 flowid 1:%x" % (dev, bucket, 0x10 + bucket))
    # offset 20: the TCP header of an IPv4 packet without options; the mask keeps
    # the destination port's low bits (the word holds source and destination port)
    lines.append("filter add dev %s parent 1: prio 1 protocol ip u32 ht 800:: "
                 "match ip protocol 6 0xff hashkey mask 0x%08x at 20 link 2:"
                 % (dev, FAIR_BUCKETS - 1))
    return "\n".join(lines) + "\n"


def _tc_batch(text: str, netns: Optional[str] = None) -> None:
    """Run ``tc [-n netns] -batch -`` on ``text``; NetemError when it fails."""
    argv = ["tc"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    done = subprocess.run(argv, input=text, capture_output=True, text=True)
    if done.returncode != 0:
        raise NetemError("%s failed: %s" % (" ".join(argv), done.stderr.strip()))


class EmulatedNetwork:
    """Namespaces joined by one bridge, with shaped links; a context manager.

    Args:
        num_nodes: how many nodes (namespaces), 1..1000.
        rate: link rate in tc syntax for each direction of every node's link,
            e.g. ``'100mbit'``, or None for unshaped links.
        delay: optional one-way delay between two nodes in tc syntax, e.g.
            ``'0.2ms'`` (added as netem on each node's sending side).
        queue: ``'fifo'`` (default) or ``'fair'``, the queue discipline of
            every shaped link direction (see the module docstring); ``'fair'``
            needs a rate and no delay.

    Raises:
        NetemError: bad arguments, or emulation unavailable (checked on enter).
    """

    def __init__(self, num_nodes: int, rate: Optional[str],
                 delay: Optional[str] = None, queue: str = "fifo") -> None:
        if not 1 <= num_nodes <= MAX_NODES:
            raise NetemError("num_nodes must be in 1..%d, got %r" % (MAX_NODES, num_nodes))
        self.rate = rate.strip().lower() if rate else None
        self.rate_bps = parse_rate(self.rate) if self.rate else 0.0
        self.delay = delay.strip().lower() if delay else None
        self.delay_s = parse_delay(self.delay) if self.delay else 0.0
        _check_queue(queue, self.rate, self.delay)
        self.queue = queue
        self.num_nodes = num_nodes
        self.name = ""
        self.bridge = ""
        self.nodes: List[EmulatedNode] = []
        self._created_ns: List[str] = []
        self._created_links: List[str] = []
        self._old_handlers: Dict[int, object] = {}

    @classmethod
    def from_spec(cls, num_nodes: int, spec: NetworkSpec) -> "EmulatedNetwork":
        """Build from a parsed ``RATE[,DELAY][,QUEUE]``.

        Args:
            num_nodes: how many nodes.
            spec: the result of :func:`parse_spec`.
        """
        return cls(num_nodes, spec.rate, spec.delay, spec.queue)

    def __enter__(self) -> "EmulatedNetwork":
        self.setup()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def setup(self) -> None:
        """Create the bridge, namespaces, veth pairs and qdiscs.

        On any failure everything created so far is removed again.

        Raises:
            NetemError: emulation unavailable or an ip/tc command failed.
        """
        check_available()
        congestion = tcp_congestion_setting()  # checked once, before anything is made
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._install_signal_handlers()
        try:
            self.name = _new_job_name()
            self.bridge = self.name + "br"
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            self._created_links.append(self.bridge)
            _run(["ip", "link", "set", self.bridge, "up"])
            if self.delay:
                self._check_netem()
            for index in range(self.num_nodes):
                self.nodes.append(self._add_node(index, congestion))
        except BaseException:
            self.close()
            raise

    def _check_netem(self) -> None:
        # Probe on our own bridge: kernels built without CONFIG_NET_SCH_NETEM
        # (like the sandbox VMs this project is tested on) cannot add delay.
        probe = _run(["tc", "qdisc", "add", "dev", self.bridge, "root", "netem",
                      "delay", self.delay], check=False)
        if probe.returncode != 0:
            raise NetemError("cannot emulate a delay of %s: the kernel refused a netem "
                             "qdisc (%s); it is probably built without "
                             "CONFIG_NET_SCH_NETEM. Give a rate only."
                             % (self.delay, probe.stderr.strip()))
        _run(["tc", "qdisc", "del", "dev", self.bridge, "root"])

    def _add_node(self, index: int, congestion: Optional[str]) -> EmulatedNode:
        netns = "%s-%d" % (self.name, index)
        host_link = "%sh%d" % (self.name, index)
        address = str(_FIRST_ADDRESS + index)
        _run(["ip", "netns", "add", netns])
        self._created_ns.append(netns)
        if congestion:  # every socket made in the namespace from now on uses it
            _run(["ip", "netns", "exec", netns, "sysctl", "-qw",
                  "net.ipv4.tcp_congestion_control=" + congestion])
        # Create the pair with its second end directly inside the namespace,
        # named eth0 there, so the root namespace only ever sees host_link.
        _run(["ip", "link", "add", host_link, "type", "veth",
              "peer", "name", "eth0", "netns", netns])
        self._created_links.append(host_link)
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        _run(["ip", "-n", netns, "addr", "add", "%s/%d" % (address, _PREFIX_LEN), "dev", "eth0"])
        _run(["ip", "-n", netns, "link", "set", "eth0", "up"])
        _run(["ip", "link", "set", host_link, "master", self.bridge])
        _run(["ip", "link", "set", host_link, "up"])
        if not self.rate:  # unshaped; a delay alone is a plain netem qdisc
            if self.delay:
                _run(["tc", "-n", netns, "qdisc", "add", "dev", "eth0", "root", "netem",
                      "delay", self.delay])
            return EmulatedNode(index, netns, address, host_link)
        if self.queue == "fair":  # same two directions, htb+u32 instead of tbf
            _tc_batch(_fair_queue_batch(host_link, self.rate_bps, self.rate))
            _tc_batch(_fair_queue_batch("eth0", self.rate_bps, self.rate), netns)
            return EmulatedNode(index, netns, address, host_link)
        tbf = _tbf_args(self.rate_bps, self.rate)
        # What the node receives: shaped where the bridge sends into its link.
        _run(["tc", "qdisc", "add", "dev", host_link, "root"] + tbf)
        # What the node sends: delay (netem) first, then the rate (tbf child),
        # the layout the netem documentation gives for delay plus rate.
        if self.delay:
            packets = max(1000, math.ceil(self.rate_bps / 8 * self.delay_s / 1500 * 2))
            _run(["tc", "-n", netns, "qdisc", "add", "dev", "eth0", "root", "handle",
                  "1:", "netem", "delay", self.delay, "limit", str(packets)])
            _run(["tc", "-n", netns, "qdisc", "add", "dev", "eth0", "parent", "1:1",
                  "handle", "10:"] + tbf)
        else:
            _run(["tc", "-n", netns, "qdisc", "add", "dev", "eth0", "root"] + tbf)
        return EmulatedNode(index, netns, address, host_link)

    def close(self) -> None:
        """Kill processes left in the namespaces, then delete every link and
        namespace this network created (and nothing else).  Idempotent."""
        # `ip netns exec` started just before close() may enter its namespace a few
        # milliseconds later: scan until two scans in a row find nobody
        quiet = 0
        for _ in range(50):
            found = sum(kill_namespace_processes(netns) for netns in self._created_ns)
            quiet = quiet + 1 if not found else 0
            if quiet == 2:
                break
            time.sleep(0.05)
        errors = []
        # Links first: deleting a namespace frees its veth only asynchronously.
        for link in reversed(self._created_links):
            done = _run(["ip", "link", "del", link], check=False)
            if done.returncode != 0 and _link_exists(link):
                errors.append(done.stderr.strip())
        for netns in reversed(self._created_ns):
            done = _run(["ip", "netns", "del", netns], check=False)
            if done.returncode != 0 and netns in list_namespaces():
                errors.append(done.stderr.strip())
        self._created_links.clear()
        self._created_ns.clear()
        self._restore_signal_handlers()
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if errors:
            raise NetemError("cleanup of %s incomplete: %s" % (self.name, "; ".join(errors)))

    def _install_signal_handlers(self) -> None:
        # SIGTERM/SIGHUP would end the process without atexit or ``finally``: make them
        # SystemExit, unless the program chose its own handling (the launcher has)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) == signal.SIG_DFL:
                self._old_handlers[signum] = signal.signal(signum, _exit_on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self._old_handlers.clear()


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def netem_available() -> bool:
    """Whether this kernel can add a netem delay (probed in a scratch namespace; needs
    root and ``ip``/``tc``, see :func:`check_available`)."""
    check_available()
    probe = _new_job_name() + "-probe"
    _run(["ip", "netns", "add", probe])
    try:
        return _run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem",
                     "delay", "1ms"], check=False).returncode == 0
    finally:
        _run(["ip", "netns", "del", probe], check=False)


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def list_namespaces() -> List[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kill_namespace_processes(netns: str) -> int:
    """SIGKILL every process inside a namespace (``ip netns pids``).

    Args:
        netns: namespace name.

    Returns:
        how many processes were found.
    """
    out = _run(["ip", "netns", "pids", netns], check=False).stdout
    pids = out.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    return len(pids)


def leftovers() -> Dict[str, List[str]]:
    """Namespaces and root-namespace links whose names this module makes.

    Returns:
        ``{'namespaces': [...], 'links': [...]}`` (names matching
        ``cpsgd`` + five hex digits), possibly of jobs still running.
    """
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    links = []
    for line in out.splitlines():
        # "12: cpsgd1a2b3h0@if2: <...>" -> "cpsgd1a2b3h0"
        fields = line.split(":")
        if len(fields) > 1:
            name = fields[1].strip().split("@")[0]
            if _NAME_RE.match(name):
                links.append(name)
    namespaces = [n for n in list_namespaces() if _NAME_RE.match(n)]
    return {"namespaces": namespaces, "links": links}


def remove_leftovers(namespaces: Sequence[str], links: Sequence[str]) -> None:
    """Delete the given leftovers (killing processes inside namespaces); only names
    made by this module are touched, others raise.

    Args:
        namespaces: namespace names, e.g. from :func:`leftovers`.
        links: link names, e.g. from :func:`leftovers`.

    Raises:
        NetemError: a name this module would not have created.
    """
    for name in list(namespaces) + list(links):
        if not _NAME_RE.match(name):
            raise NetemError("refusing to remove %r: not created by %s" % (name, __name__))
    for netns in namespaces:
        kill_namespace_processes(netns)
    for link in links:
        _run(["ip", "link", "del", link], check=False)
    for netns in namespaces:
        _run(["ip", "netns", "del", netns], check=False)


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for net in live:
        try:
            net.close()
        except Exception as err:  # atexit: report, go on with the others
            print("mxnet_cpsgd.cluster.netem: %s" % err, file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m mxnet_cpsgd.cluster.netem --list|--cleanup``.

    Args:
        argv: arguments (default ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(
        prog="python -m mxnet_cpsgd.cluster.netem",
        description="List or remove namespaces/links left by emulated networks (only after "
                    "a launcher was SIGKILLed; --cleanup also removes those of jobs running).")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--list", action="store_true", help="print leftovers")
    group.add_argument("--cleanup", action="store_true", help="remove leftovers")
    args = parser.parse_args(argv)
    found = leftovers()
    for kind in ("namespaces", "links"):
        for name in found[kind]:
            print("%s %s" % (kind[:-1], name))
    if args.cleanup:
        remove_leftovers(found["namespaces"], found["links"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
