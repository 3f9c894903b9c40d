"""The command line of ``cpsgd-launch`` (:mod:`.launch`): its options, with the
engines' own (:func:`.engines.add_arguments`).  :func:`.launch.main` parses them,
checks their combinations and runs the job.
"""
import argparse

from mxnet_cpsgd.cluster import engines
from mxnet_cpsgd.cluster.stall import (DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_STALL_TIMEOUT_S,
                                       LONG_PHASE_FACTOR)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``cpsgd-launch``'s options."""
    parser = argparse.ArgumentParser(
        prog="cpsgd-launch",
        usage="%(prog)s [-n WORKERS] [-s SERVERS] [options] -- COMMAND ARGS...",
        description="Start a ps-lite job (1 scheduler, S servers running "
                    "'import mxnet', M workers running COMMAND), or with --allreduce "
                    "a Horovod/Gloo job, on this machine, on the hosts of -H over ssh, "
                    "in a Slurm allocation or with mpirun; print every node's output "
                    "prefixed with its name, and stop everything when any node fails.")
    parser.add_argument("-n", "--num-workers", type=int, default=None,
                        help="workers (>= 1); no default (required), except with "
                             "--launcher slurm: one per task")
    parser.add_argument("-s", "--num-servers", type=int, default=None,
                        help="servers (>= 1); default with -H one per host, with "
                             "--launcher slurm one per node, with --allreduce none "
                             "(no servers run); otherwise required")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds from the end or failure of the job until every "
                             "process must be gone (default 60)")
    parser.add_argument("--job-timeout", type=float, default=None,
                        help="seconds the whole job may run (default: no limit)")
    parser.add_argument("--port", type=int, default=None,
                        help="scheduler port (default: a free one)")
    parser.add_argument("--env", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                        help="environment for every node (repeatable; default: none "
                             "beyond the launcher's own)")
    parser.add_argument("--emulate-network", metavar="RATE[,DELAY][,QUEUE]", default=None,
                        help="run each node in its own network namespace with links "
                             "shaped to RATE (e.g. 100mbit) and optional one-way DELAY "
                             "(e.g. 0.2ms; needs netem in the kernel); QUEUE fifo "
                             "(default: one FIFO per link direction) or fair (the TCP "
                             "flows of a link share its rate; not with DELAY); root only "
                             "(default: none, no emulated network)")
    parser.add_argument("--time-scale", metavar="D", default=None,
                        help="time dilation of --emulate-network: rates divided by D, "
                             "delays multiplied by D (D >= 1, default 1).  Only the network "
                             "is dilated: slow the workers' compute down by D yourself "
                             "(e.g. an emulated compute time x D) and divide the times you "
                             "measure by D (cpsgd-bench --time-scale does all of this)")
    parser.add_argument("--placement", choices=("separate", "colocated"), default="separate",
                        help="with --emulate-network: every node on its own host, or one "
                             "host per worker running it and one server (default separate)")
    parser.add_argument("--log-dir", default=None,
                        help="also write one log file per node here (default: none, "
                             "output only printed)")
    _add_failure_options(parser)
    engines.add_arguments(parser)
    hosts = parser.add_argument_group(
        "several machines (over ssh)",
        "The working directory (or --copy-workdir's) and the interpreter must be the same "
        "path on every host.  See docs/launcher.md.")
    hosts.add_argument("-H", "--hostfile", default=None,
                       help="run the nodes on these hosts: one host[:port] per line; "
                            "servers, then workers, round-robin (default: none, this "
                            "machine or the Slurm allocation)")
    hosts.add_argument("--ssh-user", default=None,
                       help="ssh login name (ssh -l; default: ssh's own)")
    hosts.add_argument("--ssh-identity", default=None,
                       help="ssh private key (ssh -i; default: ssh's own)")
    hosts.add_argument("--ssh-config", default=None,
                       help="ssh configuration file (ssh -F; default: ssh's own)")
    hosts.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                       help="ssh -o option (repeatable; overrides the launcher's defaults)")
    hosts.add_argument("--ssh-connect-timeout", type=float, default=10.0,
                       help="seconds for ssh to connect (default 10)")
    hosts.add_argument("--scheduler-on-first-host", action="store_true",
                       help="run the scheduler on the first host instead of here")
    hosts.add_argument("--scheduler-address", default=None,
                       help="this machine's address that every host reaches (default: "
                            "its address on the route to the first host)")
    hosts.add_argument("--python", default=None,
                       help="interpreter for servers, scheduler and the remote watchdog, "
                            "the same path on every host (default: this one)")
    hosts.add_argument("--copy-workdir", default=None, metavar="DIR",
                       help="copy the current directory to DIR on every host first "
                            "(tar over ssh) and run there (default: run in the current "
                            "directory's path on every host)")
    return parser


def _add_failure_options(parser: argparse.ArgumentParser) -> None:
    """Options for nodes that stall, never join or fail: when the job ends, and
    whether it starts again."""
    parser.add_argument("--stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT_S,
                        metavar="SECONDS",
                        help="end the job when a node makes no progress for this long: "
                             "its process stopped (state T), or no worker reporting "
                             "progress (phases start, eval and save may take %d times as "
                             "long); 0: off (default %g)" % (LONG_PHASE_FACTOR,
                                                             DEFAULT_STALL_TIMEOUT_S))
    parser.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                        metavar="SECONDS",
                        help="end the job when its workers wait this long in mx.kv.create "
                             "for the other nodes to register with the scheduler (one that "
                             "cannot reach it, or never started); with the stall watch on; "
                             "0: no limit (default %g)" % DEFAULT_CONNECT_TIMEOUT_S)
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="after a node died, failed or stalled, stop the whole job and "
                             "start it again, at most N times; every node then gets "
                             "MXNET_CPSGD_RESTART=<restart count> (default 0)")
    parser.add_argument("--host-wait", type=float, default=0.0, metavar="SECONDS",
                        help="with --max-restarts: a host that cannot be reached after a "
                             "failure is tried again for up to SECONDS, its leftover "
                             "processes killed once it answers, and the job restarted; "
                             "if it never answers the job ends naming it (default 0: "
                             "end at once)")
