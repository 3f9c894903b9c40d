"""All-reduce stores: :mod:`.horovod` (Horovod over Gloo) and :mod:`.compressors`
(signsgd, topk, powersgd, acpsgd on the Horovod store)."""
