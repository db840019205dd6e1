"""How often to try again, how fast to spend, and one at a time: the pacing every loop and
budget shares.

``Backoff`` spaces retries (watches, probes, peer calls); ``TokenBucket`` is a rate with a
burst (fresh pod reads, Event writes, TokenReviews); ``KeyedLocks`` lets work on one key (a
pod, a Lease) go one at a time. None does I/O, so every room above may pace itself with them.
"""

from __future__ import annotations

from ._backoff import Backoff
from ._bucket import TokenBucket
from ._keyed_locks import KeyedLocks

__all__ = ["Backoff", "KeyedLocks", "TokenBucket"]
