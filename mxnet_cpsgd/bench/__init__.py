"""Measuring the stores: ``cpsgd-bench`` (:mod:`.cli`), the process it runs on
every worker (:mod:`.worker`) and per-iteration timelines (:mod:`.timeline`)."""
