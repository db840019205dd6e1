"""Placement's own failures, kept free of any service's error tree so every service can use
the rules and translate these at its own edge.

Hierarchy::

    PlacementError (ValueError)
     └── InvalidQuantity   a remote-GPU quantity in a pod spec is not a whole number in range,
                           or the pod's CUDA major label is not one
"""

from __future__ import annotations

__all__ = ["InvalidQuantity", "PlacementError"]


class PlacementError(ValueError):
    """Base of every error the placement rules raise; the input, not the cluster, is at fault."""


class InvalidQuantity(PlacementError):
    """Raised when a container's remote-GPU quantity is not an integer in 0..2^31-1, or the
    pod's ``rgpu.io/cuda-major`` label is not a whole number up to 999.

    ``container`` and ``resource`` name where the value sits (``container`` is empty and
    ``resource`` the label's key for the label) and ``value`` is the text found, so the
    message can point the user at the exact line of the manifest.
    """

    def __init__(self, message: str, *, container: str, resource: str, value: str) -> None:
        super().__init__(message)
        self.message = message
        self.container = container
        self.resource = resource
        self.value = value
