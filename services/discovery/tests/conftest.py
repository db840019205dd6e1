"""Shared builders for discovery's tests: Node manifests shaped like a kubelet's, register
annotations shaped like HAMi's device plugin writes them, and settings dicts."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from rgpu_contracts.hami import ANNOTATION_REGISTER, LABEL_SERVER
from rgpu_discovery.nodes import NodeView, node_view
from rgpu_runtime import Settings

TOPOLOGY_KEYS = ("topology.rgpu.io/rack", "topology.kubernetes.io/zone")
RACK = "topology.rgpu.io/rack"
ZONE = "topology.kubernetes.io/zone"


def _register(*cards: Mapping[str, object]) -> str:
    """A register annotation value (compact JSON, as Go writes it)."""
    return json.dumps(list(cards), separators=(",", ":"))


def _card(uuid: str, index: int = 0, **extra: object) -> dict[str, object]:
    """One remote, healthy register entry; ``extra`` overrides or removes (value ``None``)."""
    entry: dict[str, object] = {
        "id": uuid,
        "index": index,
        "count": 10,
        "devmem": 40960,
        "devcore": 100,
        "type": "NVIDIA-A100-SXM4-40GB",
        "numa": 0,
        "mode": "remote",
        "health": True,
    }
    entry.update(extra)
    return {key: value for key, value in entry.items() if value is not None}


def _node(
    name: str,
    *,
    server: str | None = "",
    ip: str | None = "10.0.0.1",
    addresses: Sequence[Mapping[str, str]] | None = None,
    ready: str | None = "True",
    annotation: str | None = None,
    labels: Mapping[str, str] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """A Node manifest; ``server=None`` makes a client node, a string is the label value."""
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if server is not None:
        all_labels[LABEL_SERVER] = server
    annotations = {} if annotation is None else {ANNOTATION_REGISTER: annotation}
    if addresses is None:
        addresses = [] if ip is None else [{"type": "InternalIP", "address": ip}]
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "labels": all_labels,
            "annotations": annotations,
        },
        "status": {"addresses": [dict(a) for a in addresses], "conditions": conditions},
    }


def _view(manifest: Mapping[str, object]) -> NodeView:
    """The ``NodeView`` of a manifest, with the test topology keys."""
    return node_view(manifest, TOPOLOGY_KEYS)


class Builders:
    """The builders above, handed to tests as one fixture (tests cannot import conftest)."""

    rack = RACK
    zone = ZONE
    keys = TOPOLOGY_KEYS
    register = staticmethod(_register)
    card = staticmethod(_card)
    node = staticmethod(_node)
    view = staticmethod(_view)


@pytest.fixture
def build() -> type[Builders]:
    """Manifest and annotation builders."""
    return Builders


@pytest.fixture
def make_settings() -> Callable[..., Settings]:
    """Settings for discovery from ``RGPU_*`` overrides (probing fast by default)."""

    def make(**overrides: str) -> Settings:
        env = {
            "RGPU_PROBE_INTERVAL_SECONDS": "0.2",
            "RGPU_PROBE_TIMEOUT_SECONDS": "0.5",
            "RGPU_TOPOLOGY_KEYS": ",".join(TOPOLOGY_KEYS),
            **overrides,
        }
        return Settings.from_env(env, service="discovery")

    return make
