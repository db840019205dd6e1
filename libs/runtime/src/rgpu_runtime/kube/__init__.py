"""The Kubernetes API, reached one way: a client with timeouts and our errors, list+watch
caches that follow client-go's reflector rules, and Events that never hold up a decision.

``decode_event`` is how every watch line becomes a ``WatchEvent`` (or the ``KubeError`` an
``ERROR`` event stands for); it is public so what it costs per event can be measured beside
kubernetes_asyncio's model decode (bench/bench_runtime.py).
"""

from __future__ import annotations

from ._client import KubeClient, Listing, kube_client
from ._recorder import EventRecorder, KubeEvent, ObjectRef
from ._reflector import ObjectChange, Reflector, ReflectorTiming, WatchTrouble, kube_pages
from ._watch import WatchEvent, decode_event

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
    "decode_event",
    "kube_client",
    "kube_pages",
]
