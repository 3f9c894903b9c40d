"""What a bench worker reads from the system around its timed window.

Byte counters of the emulated links (its own namespace's ``eth0`` and the
servers'), packets the links' queues dropped, CPU time of the job's processes
and of the whole machine, and this process's memory.  Everything is read from
``/proc``, ``/sys`` and ``ip``/``tc``; nothing here changes the system.
"""
import os
import re
import subprocess


def read_counters(prefix=""):
    """(tx_bytes, rx_bytes) of eth0, in this namespace or through ``prefix`` argv."""
    if not prefix:
        base = "/sys/class/net/eth0/statistics/"
        with open(base + "tx_bytes") as f:
            tx = int(f.read())
        with open(base + "rx_bytes") as f:
            rx = int(f.read())
        return tx, rx
    out = subprocess.run(list(prefix) + ["cat", "/sys/class/net/eth0/statistics/tx_bytes",
                                         "/sys/class/net/eth0/statistics/rx_bytes"],
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def read_stall_counters():
    """(retransmission timeouts, retransmitted segments, machine busy CPU seconds).

    What tells a slow iteration's losses or a starved machine from a wait on
    something else.  The TCP counters are this network namespace's
    (``TCPTimeouts`` of /proc/net/netstat, ``RetransSegs`` of /proc/net/snmp):
    with colocated placement, every socket of this worker's host, its server's
    included.  At a timeout a sender has heard nothing back for a whole RTO; it
    resends from the first unacknowledged byte with a window of one segment.
    """
    timeouts = retrans = None
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            timeouts = int(dict(zip(names.split(), values.split()))["TCPTimeouts"])
    with open("/proc/net/snmp") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("Tcp:"):
            retrans = int(dict(zip(names.split(), values.split()))["RetransSegs"])
    return timeouts, retrans, system_cpu_seconds()[0]


def server_namespaces(num_servers):
    """Names of the servers' namespaces, derived from this worker's own.

    The launcher names a job's namespaces ``<job>-<i>`` with i = 0 for the
    scheduler and 1..S for the servers (mxnet_cpsgd.cluster.local_nodes.build_local_nodes).
    Returns [] when this process's namespace cannot be identified.
    """
    try:
        name = subprocess.run(["ip", "netns", "identify", str(os.getpid())],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    match = re.match(r"^(.*)-(\d+)$", name)
    if not match:
        return []
    return ["%s-%d" % (match.group(1), i) for i in range(1, num_servers + 1)]


def job_namespaces():
    """(job name, this worker's node index) from ``ip netns identify``, or (None, None)."""
    try:
        name = subprocess.run(["ip", "netns", "identify", str(os.getpid())],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    match = re.match(r"^(.*)-(\d+)$", name)
    return (match.group(1), int(match.group(2))) if match else (None, None)


def _tbf_drops(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # a 'fair' link's htb root counts its leaves' drops again: count the leaves
    found, kind = [], None
    for line in out.splitlines():
        if line.startswith("qdisc "):
            kind = line.split()[1]
        match = re.search(r"dropped (\d+)", line)
        if match and kind != "htb":
            found.append(int(match.group(1)))
    return sum(found) if found else None


def read_drops(job, num_nodes, root_pid):
    """Packets the queues of every node's link (tbf, or a fair link's leaves) dropped so far.

    Returns ``{'send': n, 'receive': n}`` summed over the job's nodes: a node's
    sending side is the qdisc on ``eth0`` in its namespace, its receiving side
    the qdisc on its veth end in the root namespace (named ``<job>h<i>``).
    None when a counter cannot be read.
    """
    send = receive = 0
    for i in range(num_nodes):
        a = _tbf_drops(["ip", "netns", "exec", "%s-%d" % (job, i), "tc", "-s", "qdisc",
                        "show", "dev", "eth0"])
        b = _tbf_drops(["nsenter", "--net=/proc/%d/ns/net" % root_pid, "tc", "-s", "qdisc",
                        "show", "dev", "%sh%d" % (job, i)])
        if a is None or b is None:
            return None
        send += a
        receive += b
    return {"send": send, "receive": receive}


def read_server_counters(namespaces):
    result = []
    for ns in namespaces:
        try:
            result.append(read_counters(["ip", "netns", "exec", ns]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None
    return result


def job_peers(roles=("server", "scheduler")):
    """pid -> role of this job's processes with the given DMLC_ROLEs.

    Found through /proc (network namespaces share the pid namespace): the
    processes whose environment has this worker's DMLC_PS_ROOT_URI and
    DMLC_PS_ROOT_PORT.
    """
    want_port = os.environ.get("DMLC_PS_ROOT_PORT", "").encode()
    want_uri = os.environ.get("DMLC_PS_ROOT_URI", "").encode()
    found = {}
    for pid, env in process_environments():
        if env.get(b"DMLC_PS_ROOT_PORT") == want_port and \
                env.get(b"DMLC_PS_ROOT_URI") == want_uri:
            role = env.get(b"DMLC_ROLE", b"").decode()
            if role in roles:
                found[pid] = role
    return found


def process_environments():
    """(pid, environment as a dict of bytes) of every process whose environment
    this one may read, from /proc (processes that end meanwhile are left out)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0")
                           if b"=" in item)
        except OSError:
            continue
        yield int(pid), env


def cpu_seconds(pid=None):
    """utime + stime of a process (this one by default), in seconds."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def system_cpu_seconds():
    """(busy, total) CPU seconds of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    busy = sum(values[i] for i in (0, 1, 2, 5, 6, 7) if i < len(values))
    total = busy + sum(values[i] for i in (3, 4) if i < len(values))
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, total / tick


def memory_kb():
    """(VmHWM, VmRSS) of this process in KiB."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                found[key] = int(value.split()[0])
    return found.get("VmHWM"), found.get("VmRSS")
