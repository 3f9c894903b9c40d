"""All-reduce stores: :mod:`.horovod` (Horovod over Gloo)."""
