"""A-SGD: MXNet's dist_async; the server applies each push on arrival."""
from .base import SYNC_SGD, Policy


class ASGD(Policy):
    name = "asgd"
    inner_kvstore = "dist_async"

    def plan(self, step, key):
        return SYNC_SGD
