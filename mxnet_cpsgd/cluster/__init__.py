"""Running jobs: :mod:`.launch` starts scheduler, servers and workers (on this
machine, or over ssh on the hosts of a host file through :mod:`.ssh`);
:mod:`.netem` emulates a cluster network (namespaces, veth pairs, tbf);
:mod:`.hosts` emulates machines (namespaces, each with its own sshd);
:mod:`.mxlaunch` runs MXNet's own tools/launch.py on Python 3.11."""
