"""rgpu_testkit: the helpers every rgpu test suite shares, written once.

``eventually`` waits for state a test cannot await; ``FakeDiscovery`` is discovery's HTTP
API (long-poll included) over values the test publishes; the builders make contract values
(``card``, ``server``, ``fleet``, ...) and raw Kubernetes objects (``pod_manifest``,
``binding_manifest``, ...)
with defaults, so a test states only what it is about; ``flat`` reads a command's output
whatever width the terminal wrapped it at. Tests import it; production code
never does (an import-linter contract says so).
"""

from __future__ import annotations

from ._contracts import (
    AUTO_ENDPOINT,
    allocation_request,
    card,
    claim,
    claim_set,
    container_request,
    fleet,
    gpu_uuid,
    pod_ref,
    server,
    topology,
)
from ._discovery import FakeDiscovery
from ._eventually import eventually
from ._manifests import (
    Json,
    binding_manifest,
    container_manifest,
    node_manifest,
    pod_manifest,
    register_annotation,
    register_card,
)
from ._text import flat

__all__ = [
    "AUTO_ENDPOINT",
    "FakeDiscovery",
    "Json",
    "allocation_request",
    "binding_manifest",
    "card",
    "claim",
    "claim_set",
    "container_manifest",
    "container_request",
    "eventually",
    "flat",
    "fleet",
    "gpu_uuid",
    "node_manifest",
    "pod_manifest",
    "pod_ref",
    "register_annotation",
    "register_card",
    "server",
    "topology",
]
