"""Discovery's own failures, named by meaning, in one place.

Most failures discovery meets are values, not exceptions: a probe that timed out is a
``ProbeOutcome``, a broken register annotation becomes ``Server.error``. What remains are the
few cases a caller must handle, all built on ``rgpu_runtime``'s tree so the HTTP edge maps
them to an ``ErrorBody`` without a handler of its own. A bad ``since``/``wait`` is
``rgpu_runtime``'s ``BadRequest`` (code ``bad_parameter``), raised by ``Poll``.

Hierarchy::

    RgpuError                          (rgpu_runtime.errors)
     ├── NotFound
     │    └── UnknownServer        404  an on-demand probe names no server of the fleet
     ├── Conflict
     │    └── NoEndpoint           409  an on-demand probe names a server without an endpoint
     ├── Unavailable
     │    └── NotListedYet         503  no successful Node list yet, so no fleet to serve
     └── MalformedNode             --   a Node object without the fields every Node has
"""

from __future__ import annotations

from rgpu_runtime.errors import Conflict, NotFound, RgpuError, Unavailable

__all__ = ["MalformedNode", "NoEndpoint", "NotListedYet", "UnknownServer"]


class NotListedYet(Unavailable):
    """Raised when the fleet or topology is asked for before the first Node list succeeded.

    Answering with an empty fleet instead would tell the allocator "no servers exist", and it
    would refuse every pod; a retryable 503 makes it wait for the truth.
    """

    def __init__(self, what: str) -> None:
        super().__init__(
            f"no {what} yet: the Node list from the apiserver has not succeeded since start; "
            "retry shortly (see /readyz and the service log for the apiserver error)",
            code="not_listed_yet",
            retry_after=1.0,
        )


class UnknownServer(NotFound):
    """Raised when an on-demand probe names a server the fleet does not list.

    ``server`` is the name asked for. The Node may be unlabelled, deleted, or not seen yet.
    """

    def __init__(self, server: str) -> None:
        super().__init__(
            f"no server named {_trim(server)!r} in the fleet: the Node does not exist or lacks "
            "the hami.io/lupine-server label; check the name against GET /v1/fleet",
            code="unknown_server",
        )
        self.server = server


class NoEndpoint(Conflict):
    """Raised when an on-demand probe names a server that has no lupine endpoint to probe.

    ``server`` is the name; the message carries the fleet's reason (usually no InternalIP).
    """

    def __init__(self, server: str, reason: str | None) -> None:
        super().__init__(
            f"server {server!r} has no lupine endpoint to probe "
            f"({reason or 'no address known'}); fix the Node's addresses",
            code="no_endpoint",
        )
        self.server = server


class MalformedNode(RgpuError):
    """Raised when an apiserver object lacks what every Node has (``metadata.name``).

    The watch logs it and skips the object; it never reaches an HTTP caller.
    """

    default_code = "malformed_node"


def _trim(text: str) -> str:
    """A caller-supplied name cut short enough for a message (names are at most 253 chars)."""
    return text if len(text) <= 253 else text[:250] + "..."
