"""Reproducing the paper: ``cpsgd-reproduce`` (:mod:`.runner`) runs the
experiments of a spec, :mod:`.report` turns their logs into the report."""
