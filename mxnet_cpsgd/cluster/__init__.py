"""Running jobs: :mod:`.launch` (the command line and ``run_job``) starts
scheduler, servers and workers on this machine (:mod:`.local_nodes`) or over
ssh on the hosts of a host file (:mod:`.remote_nodes`, :mod:`.ssh`,
:mod:`.watchdog`), and :mod:`.supervise` watches them (failures, stalls:
:mod:`.stall`) and tears them down;
:mod:`.netem` emulates a cluster network (namespaces, veth pairs, tbf);
:mod:`.hosts` emulates machines (namespaces, each with its own sshd);
:mod:`.mxlaunch` runs MXNet's own tools/launch.py on Python 3.11."""
