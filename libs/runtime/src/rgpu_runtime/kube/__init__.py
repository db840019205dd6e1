"""The Kubernetes API, reached one way: a client with timeouts and our errors, list+watch
caches that follow client-go's reflector rules, and Events that never hold up a decision.
"""

from __future__ import annotations

from ._client import KubeClient, Listing, kube_client
from ._recorder import EventRecorder, KubeEvent, ObjectRef
from ._reflector import ObjectChange, Reflector, ReflectorTiming, WatchTrouble, kube_pages
from ._watch import WatchEvent

__all__ = [
    "EventRecorder",
    "KubeClient",
    "KubeEvent",
    "Listing",
    "ObjectChange",
    "ObjectRef",
    "Reflector",
    "ReflectorTiming",
    "WatchEvent",
    "WatchTrouble",
    "kube_client",
    "kube_pages",
]
