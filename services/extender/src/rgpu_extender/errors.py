"""The extender's failures, named by meaning, on top of runtime's tree.

kube-scheduler's extender protocol carries errors inside its payloads (``Error``,
``FailedNodes``), so most of these never reach the HTTP edge: the verbs turn them into values.
The ones that do (a malformed AdmissionReview) become runtime's ``ErrorBody`` replies.

Hierarchy::

    RgpuError (rgpu_runtime.errors)
     ├── BadRequest
     │    ├── PodNotServable        the pod's own spec makes it unschedulable here (user must fix)
     │    │    ├── InvalidQuantity  a remote-GPU quantity is not a whole number in range (wraps
     │    │    │                    rgpu_placement.InvalidQuantity for the filter's reply)
     │    │    └── WebhookMissing   a requesting container lacks the webhook's env wiring
     │    ├── MalformedReview       an AdmissionReview we cannot read (no uid to echo)
     │    └── MalformedPod          a pod field of the wrong JSON type or length (denied, 400)
     ├── AdmissionDenied             403: the webhook refuses a pod change (message says the fix)
     ├── Conflict
     │    └── ClaimNotHeld          commit refused: this pod uid holds no claim (404/409)
     ├── Unavailable
     │    └── AllocatorUnavailable  allocator unreachable, timed out or answered 5xx  (retryable)
     └── UpstreamError
          └── PeerReplyInvalid      a peer answered with a status or body we cannot use
"""

from __future__ import annotations

import rgpu_placement as placement
from rgpu_runtime.errors import BadRequest, Conflict, RgpuError, Unavailable, UpstreamError

__all__ = [
    "AdmissionDenied",
    "AllocatorUnavailable",
    "ClaimNotHeld",
    "InvalidQuantity",
    "MalformedPod",
    "MalformedReview",
    "PeerReplyInvalid",
    "PodNotServable",
    "WebhookMissing",
]


class PodNotServable(BadRequest):
    """Raised when the pod's spec, not the cluster, prevents placement; no node can help."""

    default_code = "pod_not_servable"


class InvalidQuantity(PodNotServable):
    """Raised when a container's remote-GPU quantity is not an integer in 0..2^31-1.

    ``container`` and ``resource`` name where the value sits and ``value`` is the text found,
    so the message can point the user at the exact line of the manifest.
    """

    default_code = "invalid_quantity"

    def __init__(self, message: str, *, container: str, resource: str, value: str) -> None:
        super().__init__(message)
        self.container = container
        self.resource = resource
        self.value = value

    @classmethod
    def wrapping(cls, exc: placement.InvalidQuantity) -> InvalidQuantity:
        """The extender's error for a quantity ``rgpu_placement.read_demand`` refused."""
        return cls(str(exc), container=exc.container, resource=exc.resource, value=exc.value)


class WebhookMissing(PodNotServable):
    """Raised when a requesting container has no ``LUPINE_SERVER`` downward-API wiring.

    Without it the container starts and cannot find its GPU server; the usual cause is that the
    mutating webhook is not installed or excluded the pod's namespace.
    """

    default_code = "webhook_missing"


class MalformedReview(BadRequest):
    """Raised when an AdmissionReview is not JSON or not v1; there is no uid to answer with."""

    default_code = "malformed_review"


class AdmissionDenied(RgpuError):
    """Raised while mutating or guarding a pod when the change must be refused.

    The webhook answers it in-band (``allowed: false`` with this code and message), so the
    message is what ``kubectl`` prints: it names the field and says how to fix it.
    """

    status_code = 403
    default_code = "admission_denied"


class ClaimNotHeld(Conflict):
    """Raised when the allocator refuses a commit: the pod uid holds no (or another's) claim.

    Binding such a pod would hand it a server someone else may hold, so bind stops here.
    ``absent`` is true when the allocator knows no claim for the uid at all (404), as for a
    pod that asks for no cards, rather than a claim it cannot commit (409).
    """

    default_code = "claim_not_held"

    def __init__(self, message: str, *, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent


class AllocatorUnavailable(Unavailable):
    """Raised when the allocator cannot be reached, timed out, or answered 5xx; retry later."""

    default_code = "allocator_unavailable"


class PeerReplyInvalid(UpstreamError):
    """Raised when a peer service answered with a status or body outside its contract."""

    default_code = "peer_reply_invalid"


class MalformedPod(BadRequest):
    """Raised when a pod in a review has a field of the wrong JSON type or length.

    The apiserver would never send such a pod; a direct caller can. ``path`` names the field
    (``spec.containers[0].env[1].name``) so the message says exactly what to fix.
    """

    default_code = "malformed_pod"

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}; fix that field of the pod manifest")
        self.path = path
