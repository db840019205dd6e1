"""The allocator's failures, by meaning, so the HTTP edge can answer
each with the right status and an ``ErrorBody`` that says what happened and what to do.

Hierarchy (bases from ``rgpu_runtime.errors``)::

    RgpuError
     ├── BadRequest
     │    └── TooLong              400  a uid or name past Kubernetes' own length limit
     ├── NotFound
     │    └── ClaimNotFound        404  no claim for that pod uid (never booked, released, swept)
     ├── Conflict
     │    ├── BookingExpired       409  the booking lapsed before commit; filter again
     │    ├── ServerTaken          409  another pod holds the server the claim is on
     │    ├── CardsGone            409  the claimed cards left the fleet before commit
     │    ├── StillRunning         409  a release of a claim whose pod is bound and running
     │    └── LeaseUnreadable      409  a claim Lease holds claims we cannot read; fix it
     └── Unavailable                    (retryable)
          ├── FleetUnknown         503  discovery has not delivered a fleet yet
          ├── NotSynced            503  the pod or Lease cache has not been listed yet
          ├── Contended            503  compare-and-swap kept losing; retry shortly
          ├── NamespaceMissing     503  RGPU_NAMESPACE does not exist; create it (not retryable)
          ├── DiscoveryUnavailable 503  discovery did not answer (client boundary)
          └── EvictionRefused      503  a PodDisruptionBudget forbids evicting a victim now

A "nothing fits" answer is not an error: it is a ``NoFit`` value served with status 409.
"""

from __future__ import annotations

from rgpu_runtime.errors import BadRequest, Conflict, NotFound, Unavailable

__all__ = [
    "BookingExpired",
    "CardsGone",
    "ClaimNotFound",
    "Contended",
    "DiscoveryUnavailable",
    "EvictionRefused",
    "FleetUnknown",
    "LeaseUnreadable",
    "NamespaceMissing",
    "NotSynced",
    "ServerTaken",
    "StillRunning",
    "TooLong",
]


class TooLong(BadRequest):
    """Raised at the HTTP edge for a pod uid, name or node name longer than Kubernetes allows:
    no such object can exist, so the request is refused before anything looks it up."""

    default_code = "too_long"


class ClaimNotFound(NotFound):
    """Raised by commit and get when no claim exists for the pod uid."""

    default_code = "claim_not_found"


class BookingExpired(Conflict):
    """Raised by commit when the booking is older than the booking TTL and the pod is unbound."""

    default_code = "booking_expired"


class ServerTaken(Conflict):
    """Raised by commit when another pod's claim overlaps the one being committed."""

    default_code = "server_taken"


class CardsGone(Conflict):
    """Raised by commit when a claimed card is no longer in discovery's fleet."""

    default_code = "cards_gone"


class StillRunning(Conflict):
    """Raised by a release when the claim's pod, read fresh, is bound and has not finished:
    its containers may be using the server, and handing it out again would double-book it.
    A claim leaves with its pod (deletion or a terminal phase), whoever asks otherwise."""

    default_code = "still_running"


class LeaseUnreadable(Conflict):
    """Raised by a Lease write when the Lease's claims cannot be read; it is never
    overwritten blindly (that could erase a real holder): fix or delete it by hand."""

    default_code = "lease_unreadable"


class FleetUnknown(Unavailable):
    """Raised by allocation before discovery delivered the first fleet."""

    default_code = "fleet_unknown"


class NotSynced(Unavailable):
    """Raised by allocation before the pod and Lease caches were listed."""

    default_code = "not_synced"


class Contended(Unavailable):
    """Raised when a Lease write lost the compare-and-swap race more times than allowed."""

    default_code = "contended"


class NamespaceMissing(Unavailable):
    """Raised when a claim Lease cannot be created because its namespace does not exist."""

    default_code = "namespace_missing"
    default_retryable = False


class DiscoveryUnavailable(Unavailable):
    """Raised by the discovery client when discovery cannot be reached or answers badly."""

    default_code = "discovery_unavailable"


class EvictionRefused(Unavailable):
    """Raised by the apiserver client when the Eviction API answers 429 for a
    PodDisruptionBudget: it forbids evicting that pod now (preemption tries another server)."""

    default_code = "eviction_refused"
