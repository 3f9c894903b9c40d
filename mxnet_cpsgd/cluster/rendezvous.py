"""The rendezvous service of a Horovod/Gloo job started by :func:`launch.run_job`
with ``allreduce=True`` (what ``horovodrun --gloo`` runs inside itself).

``python -m mxnet_cpsgd.cluster.rendezvous --port P --hosts A,B,... [--bind ADDR]``
serves Horovod's HTTP rendezvous at port P on ADDR (default: every address of
its network namespace; the launcher gives 127.0.0.1 on one machine) for one
slot per listed host (``localhost`` repeated M times: M slots on one host), and
runs until it is stopped.  Horovod is imported
only here, so the launcher itself never needs it.

A worker aborts after three failed requests in a row ("HTTP GET request failed
too many times").  Two ways Horovod's own server fails them, both changed here:

* its listen backlog is Python's default of 5; every worker polls with a new
  connection per request, and at 32 workers behind a slow link the queue
  overflowed (the host's ListenOverflows counter) and workers read "Connection
  reset by peer".  This service listens with ``LISTEN_BACKLOG``;
* its handler closes a connection whose request has not arrived whole within
  3 s, without an answer; on a slow link, a dilated one or a loaded machine 3 s
  of real time is not enough.  Here a request may take ``--request-timeout``
  seconds (default 60).
"""
import argparse
import signal
import sys
import time

REQUEST_TIMEOUT_S = 60.0
#: pending connections the listening socket holds (the kernel caps it at
#: net.core.somaxconn)
LISTEN_BACKLOG = 1024


def _parser():
    p = argparse.ArgumentParser(prog="python -m mxnet_cpsgd.cluster.rendezvous")
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument("--bind", default="0.0.0.0",
                   help="address to listen on (default 0.0.0.0: every address)")
    p.add_argument("--hosts", required=True,
                   help="comma-separated host names, one per worker in rank order")
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                   help="seconds a request may take to arrive whole (default %(default)s)")
    return p


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    if not args.request_timeout > 0:
        p.error("--request-timeout must be positive")
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    import threading

    names = args.hosts.split(",")
    counts = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    hosts = ",".join("%s:%d" % (name, n) for name, n in counts.items())
    plan = get_host_assignments(parse_hosts(hosts), len(names))
    # a subclass per process: the timeout is a class attribute of the handler
    handler = type("PatientRendezvousHandler", (RendezvousHandler,),
                   {"timeout": args.request_timeout})
    server_class = type("RendezvousServer", (RendezvousHTTPServer,),
                        {"request_queue_size": LISTEN_BACKLOG})
    server = server_class((args.bind, args.port), handler, 0)
    server.init(plan)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print("rendezvous: serving %d slots on port %d" % (len(names), args.port), flush=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
