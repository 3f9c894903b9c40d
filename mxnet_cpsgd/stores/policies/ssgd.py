"""S-SGD: MXNet's dist_sync, full precision."""
from .base import SYNC_SGD, Policy


class SSGD(Policy):
    name = "ssgd"

    def plan(self, step, key):
        return SYNC_SGD
