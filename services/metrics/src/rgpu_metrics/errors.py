"""A source that fails must fail as a value the follower can judge.

The metrics service calls two peers (discovery for the fleet, the allocator for the claims).
Whatever goes wrong on that call, httpx errors included, leaves ``sources`` as one of these,
so the follower decides between "retry soon" and "the peer is broken" by type alone, and no
library exception reaches the rest of the service.

Hierarchy::

    RgpuError                       (rgpu_runtime.errors)
     ├── Unavailable                503, retryable
     │    └── SourceUnavailable     the peer could not be reached, timed out, or answered 5xx/429
     └── UpstreamError              502
          └── SourceInvalid         the peer answered, but not with its contract (4xx, bad JSON)

Both carry ``source`` (``discovery`` or ``allocator``). The follower retries both with
back-off: an invalid answer usually means a peer mid-upgrade, and the last good snapshot keeps
being served meanwhile.
"""

from __future__ import annotations

from rgpu_runtime.errors import Unavailable, UpstreamError

__all__ = ["SourceInvalid", "SourceUnavailable"]


class SourceUnavailable(Unavailable):
    """Raised when a source cannot be reached, does not answer in time, or answers 5xx or 429.

    Usually transient (the peer restarts or is overloaded); the follower backs off and retries.
    """

    default_code = "source_unavailable"

    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"{source}: {message}")
        self.source = source


class SourceInvalid(UpstreamError):
    """Raised when a source answers with a status or body that does not match its contract.

    Check that discovery and the allocator run a version that serves the same contracts as
    this exporter; the message names the offending field.
    """

    default_code = "source_invalid"

    def __init__(self, source: str, message: str, *, peer_status: int = 0) -> None:
        super().__init__(f"{source}: {message}", peer_status=peer_status, retryable=True)
        self.source = source
