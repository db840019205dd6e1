"""Maintenance starts by stopping new bookings. ``rgpu cordon <server>`` does what an operator
would do by hand, on the Node the server runs on:

* a whole server Node: ``spec.unschedulable`` (what ``kubectl cordon`` sets), so none of its
  servers is booked;
* some cards (``--card GPU-…``): HAMi's ``hami.io/device-cordon`` annotation, so those cards
  are never booked and, in ``server`` granularity, neither is a server holding one;
* a lupine instance (``<node>@<port>``): its cards, through the same annotation, because its
  Node's other instances must keep serving.

``rgpu uncordon`` undoes each. Holders are never touched (``rgpu drain`` moves them). Every
write is a patch carrying the Node's ``resourceVersion``, so an edit racing another (a second
operator, HAMi's device plugin) is redone on the fresh Node instead of losing either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rgpu_contracts import (
    ANNOTATION_DEVICE_CORDON,
    ANNOTATION_INSTANCES,
    ANNOTATION_REGISTER,
    INSTANCE_SEPARATOR,
    LABEL_SERVER,
    ContractError,
    decode_device_cordon,
    decode_instances,
    decode_register,
    encode_device_cordon,
    node_of_server,
)
from rgpu_runtime.errors import KubeConflict, KubeError, RgpuError
from rgpu_runtime.settings import Settings

from .kube import cli_kube_client

if TYPE_CHECKING:
    from rgpu_runtime.kube import KubeClient

__all__ = ["CordonError", "Cordoned", "cordon", "server_cards"]

ATTEMPTS = 5
"""Patches retried after a conflict; more than a few writers at once is not maintenance."""


class CordonError(RgpuError):
    """Raised when the server cannot be cordoned as asked; the message says why and what to
    do instead (no such Node, not a server, unknown card or instance)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cordoned:
    """What the Node says after the change."""

    node: str
    unschedulable: bool
    cards: tuple[str, ...]
    """Its device cordon, sorted."""
    changed: bool

    def describe(self, server: str, *, on: bool) -> str:
        """One line for the operator."""
        what = "cordoned" if on else "uncordoned"
        state = "unschedulable" if self.unschedulable else "schedulable"
        cards = ", ".join(self.cards) or "none"
        unchanged = "" if self.changed else " (nothing to change)"
        return f"{server} {what}{unchanged}: node {self.node} {state}; cordoned cards: {cards}"


def server_cards(node: Mapping[str, Any], server: str) -> tuple[str, ...]:
    """The GPU UUIDs ``server`` serves on ``node``: an instance's, or the whole register's.

    Raises ``CordonError`` for an instance the Node does not declare.
    """
    annotations = _annotations(node)
    if INSTANCE_SEPARATOR not in server:
        try:
            return tuple(card.uuid for card in decode_register(annotations[ANNOTATION_REGISTER]))
        except (KeyError, ContractError):
            return ()
    port = server.partition(INSTANCE_SEPARATOR)[2]
    try:
        instances = decode_instances(annotations.get(ANNOTATION_INSTANCES) or "")
    except ContractError as exc:
        raise CordonError(f"node {node_of_server(server)}: {ANNOTATION_INSTANCES}: {exc}") from exc
    for instance in instances:
        if str(instance.port) == port:
            return tuple(instance.gpus)
    ports = ", ".join(str(i.port) for i in instances)
    raise CordonError(
        f"node {node_of_server(server)} runs no lupine on port {port} (it has {ports})"
    )


async def cordon(
    settings: Settings, server: str, *, cards: Sequence[str] = (), on: bool = True
) -> Cordoned:
    """Cordon (``on``) or uncordon ``server`` or its ``cards``; raises ``CordonError`` or
    ``KubeError``."""
    async with cli_kube_client(settings) as kube:
        for _ in range(ATTEMPTS):
            try:
                return await _once(kube, server, tuple(cards), on)
            except KubeConflict:
                continue
    raise CordonError(f"node {node_of_server(server)} kept changing under the edit; try again")


async def _once(kube: KubeClient, server: str, cards: tuple[str, ...], on: bool) -> Cordoned:
    name = node_of_server(server)
    node = await _server_node(kube, name)
    whole = not cards and INSTANCE_SEPARATOR not in server
    targets = () if whole else _targets(node, server, cards, on)
    patch = _patch(node, whole, targets, on)
    if patch is not None:
        patch["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
        node = await kube.call_raw(kube.core.patch_node, name, patch)
    return _state(node, changed=patch is not None)


async def _server_node(kube: KubeClient, name: str) -> dict[str, Any]:
    try:
        node = await kube.call_raw(kube.core.read_node, name)
    except KubeError as exc:
        if exc.kube_status == 404:
            raise CordonError(f"no node {name}: name a server as `rgpu status` lists it") from exc
        raise
    if LABEL_SERVER not in (node.get("metadata", {}).get("labels") or {}):
        raise CordonError(
            f"node {name} is not a lupine server (no {LABEL_SERVER} label); "
            "cordon client nodes with kubectl cordon"
        )
    return node


def _targets(
    node: Mapping[str, Any], server: str, cards: tuple[str, ...], on: bool
) -> tuple[str, ...]:
    served = server_cards(node, server)
    if not cards:
        return served
    unknown = [card for card in cards if card not in served]
    if unknown and on:
        listed = ", ".join(served) or "none"
        raise CordonError(f"{', '.join(unknown)} not served by {server} (it serves: {listed})")
    return cards


def _patch(
    node: Mapping[str, Any], whole: bool, targets: Iterable[str], on: bool
) -> dict[str, Any] | None:
    if whole:
        if bool(node.get("spec", {}).get("unschedulable")) == on:
            return None
        return {"metadata": {}, "spec": {"unschedulable": True if on else None}}
    current = decode_device_cordon(_annotations(node).get(ANNOTATION_DEVICE_CORDON))
    wanted = current | set(targets) if on else current - set(targets)
    if wanted == current:
        return None
    value = encode_device_cordon(wanted) or None
    return {"metadata": {"annotations": {ANNOTATION_DEVICE_CORDON: value}}}


def _state(node: Mapping[str, Any], *, changed: bool) -> Cordoned:
    cordoned = decode_device_cordon(_annotations(node).get(ANNOTATION_DEVICE_CORDON))
    return Cordoned(
        node=str(node["metadata"]["name"]),
        unschedulable=bool(node.get("spec", {}).get("unschedulable")),
        cards=tuple(sorted(cordoned)),
        changed=changed,
    )


def _annotations(node: Mapping[str, Any]) -> Mapping[str, str]:
    value = node.get("metadata", {}).get("annotations")
    return value if isinstance(value, Mapping) else {}
