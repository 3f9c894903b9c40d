"""The training scripts' logs: the ``mxnet_cpsgd.train`` logger and the per-epoch
JSON lines (one file per rank).
"""
import csv
import json
import logging
import os
import sys
from typing import Dict, Optional


LOG_FIELDS = ("algorithm", "epoch", "rank", "num_workers", "train_acc", "train_loss",
              "val_acc", "val_loss", "epoch_time", "comm_time", "samples_per_sec",
              "iterations", "total_iterations", "global_samples_per_sec", "lr",
              "dataset", "model", "batch_size")

logger = logging.getLogger("mxnet_cpsgd.train")

# ----------------------------------------------------------------------------
# logs

def rank_path(path: Optional[str], rank: int) -> Optional[str]:
    """``PATH`` for rank 0, ``stem.rank<r>.ext`` for other ranks."""
    if not path or rank == 0:
        return path
    stem, ext = os.path.splitext(path)
    return "%s.rank%d%s" % (stem, rank, ext)


class EpochLogWriter:
    """Appends one JSON line and/or CSV row per epoch.

    Args:
        json_path: JSON-lines file (``None``: none).
        csv_path: CSV file (``None``: none).
        append: keep existing content (``--resume``); otherwise start afresh.
    """

    def __init__(self, json_path: Optional[str], csv_path: Optional[str], append: bool):
        self.json_path = json_path
        self.csv_path = csv_path
        for path in (json_path, csv_path):
            if path:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                if not append and os.path.exists(path):
                    os.remove(path)

    def write(self, record: Dict[str, object]) -> None:
        if self.json_path:
            with open(self.json_path, "a") as f:
                f.write(json.dumps(record, sort_keys=False) + "\n")
        if self.csv_path:
            new = not os.path.exists(self.csv_path) or os.path.getsize(self.csv_path) == 0
            with open(self.csv_path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(LOG_FIELDS), extrasaction="ignore")
                if new:
                    writer.writeheader()
                writer.writerow(record)


def setup_logging(rank: int, quiet: bool = False) -> None:
    """Rank 0 logs progress to stdout; other ranks only warnings and errors."""
    level = logging.WARNING if (quiet or rank != 0) else logging.INFO
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(
        "%(message)s" if rank == 0 else "[rank %d] %%(message)s" % rank))
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
