"""Running jobs: :mod:`.launch` starts scheduler, servers and workers;
:mod:`.netem` emulates a cluster network (namespaces, veth pairs, tbf)."""
