"""How often to try again and how fast to spend: the two rates every loop and budget shares.

``Backoff`` spaces retries (watches, probes, peer calls); ``TokenBucket`` is a rate with a
burst (fresh pod reads, Event writes, TokenReviews). Both are plain values with no I/O, so
every room above may pace itself with them.
"""

from __future__ import annotations

from ._backoff import Backoff
from ._bucket import TokenBucket

__all__ = ["Backoff", "TokenBucket"]
