"""Why this module exists: discovery's own failures, named by meaning, in one place.

Most failures discovery meets are values, not exceptions: a probe that timed out is a
``ProbeOutcome``, a broken register annotation becomes ``Server.error``. What remains are the
few cases a caller must handle, all built on ``rgpu_runtime``'s tree so the HTTP edge maps
them to an ``ErrorBody`` without a handler of its own.

Hierarchy::

    RgpuError                          (rgpu_runtime.errors)
     ├── BadRequest
     │    └── BadPollParameter     400  ``since``/``wait`` of a long-poll is unusable
     ├── Unavailable
     │    └── NotListedYet         503  no successful Node list yet, so no fleet to serve
     └── MalformedNode             --   a Node object without the fields every Node has
"""

from __future__ import annotations

from rgpu_runtime.errors import BadRequest, RgpuError, Unavailable

__all__ = ["BadPollParameter", "MalformedNode", "NotListedYet"]


class BadPollParameter(BadRequest):
    """Raised when a long-poll query parameter is missing a value, malformed or out of range.

    ``parameter`` names it; the message says what a valid value looks like.
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"query parameter {parameter!r}: {message}", code="bad_parameter")
        self.parameter = parameter


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


class MalformedNode(RgpuError):
    """Raised when an apiserver object lacks what every Node has (``metadata.name``).

    The watch logs it and skips the object; it never reaches an HTTP caller.
    """

    default_code = "malformed_node"
