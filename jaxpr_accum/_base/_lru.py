"""A least-recently-used cache, bounded as ``jax.jit``'s caches are."""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Any


class LRU(collections.OrderedDict):
    """A dict that keeps the ``size`` most recently used entries."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get(self, key: Hashable, default: object = None) -> Any:  # the values: its user's
        if key not in self:
            return default
        self.move_to_end(key)
        return self[key]

    def put(self, key: Hashable, value: object) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
