"""HAMi compatibility is byte-exact, so its formats live in one place.

Covers the node register annotation, card ids, the lupine port label rule, endpoints, and the
pod device codec (``<card id>,RemoteGPU,<memMiB>,<cores>:`` per card, ``;`` per container).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import _validate as v
from .errors import ContractError
from .ids import CardId, GpuUuid, ServerName

__all__ = [
    "ANNOTATION_ALLOCATED",
    "ANNOTATION_DEVICE_CORDON",
    "ANNOTATION_ENDPOINT",
    "ANNOTATION_REGISTER",
    "ANNOTATION_TO_ALLOCATE",
    "DEFAULT_LUPINE_PORT",
    "DEVICE_TYPE",
    "LABEL_SERVER",
    "DeviceEntry",
    "PortRule",
    "RegisteredCard",
    "card_id",
    "decode_device_cordon",
    "decode_devices",
    "decode_register",
    "encode_device_cordon",
    "encode_devices",
    "join_endpoint",
    "port_from_label",
    "split_card_id",
    "split_endpoint",
]

LABEL_SERVER = "hami.io/lupine-server"
ANNOTATION_REGISTER = "hami.io/node-nvidia-register"
ANNOTATION_TO_ALLOCATE = "hami.io/remote-gpu-devices-to-allocate"
ANNOTATION_ALLOCATED = "hami.io/remote-gpu-devices-allocated"
ANNOTATION_ENDPOINT = "hami.io/lupine-endpoint"
ANNOTATION_DEVICE_CORDON = "hami.io/device-cordon"
DEVICE_TYPE = "RemoteGPU"
DEFAULT_LUPINE_PORT = 14833


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisteredCard:
    """One entry of ``hami.io/node-nvidia-register`` that belongs to the remote pool.

    ``count`` is forced to 1: HAMi's count is a sharing factor, and a remote card is exclusive.
    """

    uuid: GpuUuid
    index: int
    count: int
    memory_mib: int
    cores: int
    model: str
    numa: int
    healthy: bool


def decode_register(text: str) -> tuple[RegisteredCard, ...]:
    """Decode the register annotation, keeping only ``mode == "remote"`` cards.

    Every key may be absent; absent ``health`` means unhealthy. Raises ``ContractError`` when
    the text is not a JSON array of objects or a present key has the wrong type.
    """
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ContractError("", f"not JSON ({exc}); expected HAMi's JSON array of cards") from None
    entries = v.as_list(raw, "")
    cards = (_register_entry(entry, f"[{i}]") for i, entry in enumerate(entries))
    return tuple(card for card in cards if card is not None)


def _register_entry(raw: object, path: str) -> RegisteredCard | None:
    m = v.as_mapping(raw, path)
    mode = v.string(m, "mode", path, "")
    uuid = v.string(m, "id", path, "")
    if mode != "remote":
        return None
    if not uuid:
        raise ContractError(v.join(path, "id"), "a remote card needs its GPU UUID")
    return RegisteredCard(
        uuid=GpuUuid(uuid),
        index=v.integer(m, "index", path, 0, minimum=0),
        count=1,
        memory_mib=v.integer(m, "devmem", path, 0, minimum=0),
        cores=v.integer(m, "devcore", path, 0, minimum=0),
        model=v.string(m, "type", path, ""),
        numa=v.integer(m, "numa", path, 0),
        healthy=v.boolean(m, "health", path, False),
    )


def decode_device_cordon(text: str | None) -> frozenset[GpuUuid]:
    """The GPUs listed in ``hami.io/device-cordon`` (``"GPU-x,GPU-y"``).

    Blanks around an entry and empty entries (a trailing comma) are ignored, as an operator
    typing the value by hand would expect; nothing in it can be unreadable.
    """
    entries = (entry.strip() for entry in (text or "").split(","))
    return frozenset(GpuUuid(entry) for entry in entries if entry)


def encode_device_cordon(uuids: Iterable[str]) -> str:
    """``hami.io/device-cordon`` for ``uuids``: sorted, comma-joined, each once."""
    return ",".join(sorted({uuid.strip() for uuid in uuids if uuid.strip()}))


def _is_uint(text: str) -> bool:
    return text.isascii() and text.isdigit()


def card_id(server: str, uuid: str) -> CardId:
    """Make a card id ``<server>/<uuid>``."""
    return CardId(f"{server}/{uuid}")


def split_card_id(card: str) -> tuple[ServerName, GpuUuid]:
    """Split ``<server>/<uuid>``; node names never contain ``/``, so the first one separates."""
    server, sep, uuid = card.partition("/")
    if not (sep and server and uuid):
        raise ContractError("", f"card id {card!r} is not '<server>/<GPU UUID>'")
    return ServerName(server), GpuUuid(uuid)


@dataclass(frozen=True, slots=True, kw_only=True)
class PortRule:
    """The port a server label means, and why it fell back to the default (or ``None``)."""

    port: int
    problem: str | None


def port_from_label(value: str | None, default: int = DEFAULT_LUPINE_PORT) -> PortRule:
    """Apply HAMi's rule: empty, non-numeric, 0 or > 65535 → the default port (server kept)."""
    if not value:
        return PortRule(port=default, problem=None if value is not None else "label missing")
    if not _is_uint(value):
        return PortRule(port=default, problem=f"label value {value!r} is not a port number")
    port = int(value)
    if not 1 <= port <= 65535:
        return PortRule(port=default, problem=f"label value {value!r} is outside 1..65535")
    return PortRule(port=port, problem=None)


def join_endpoint(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    try:
        is_v6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        is_v6 = ":" in host
    return f"[{host}]:{port}" if is_v6 else f"{host}:{port}"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """Inverse of ``join_endpoint``; raises ``ContractError`` on anything else."""
    if endpoint.startswith("["):
        host, sep, rest = endpoint[1:].partition("]:")
    else:
        host, sep, rest = endpoint.rpartition(":")
    if not (sep and host and _is_uint(rest) and 1 <= int(rest) <= 65535):
        raise ContractError("", f"endpoint {endpoint!r} is not 'host:port' (IPv6 as '[addr]:port')")
    return host, int(rest)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceEntry:
    """One card in HAMi's pod device codec."""

    card: CardId
    memory_mib: int
    cores: int
    type: str = DEVICE_TYPE


def encode_devices(containers: Sequence[Sequence[DeviceEntry]]) -> str:
    """Encode per-container card lists; a container without cards is an empty part."""
    return "".join(
        "".join(f"{d.card},{d.type},{d.memory_mib},{d.cores}:" for d in entries) + ";"
        for entries in containers
    )


def decode_devices(text: str) -> tuple[tuple[DeviceEntry, ...], ...]:
    """Decode HAMi's pod device codec; every container part must end with ``;``."""
    if not text:
        return ()
    if not text.endswith(";"):
        raise ContractError("", "device list must end with ';' (one part per container)")
    parts = text[:-1].split(";")
    return tuple(_decode_part(part, f"[{i}]") for i, part in enumerate(parts))


def _decode_part(part: str, path: str) -> tuple[DeviceEntry, ...]:
    if not part:
        return ()
    if not part.endswith(":"):
        raise ContractError(path, f"container part {part!r} must end with ':'")
    return tuple(_decode_entry(e, f"{path}[{i}]") for i, e in enumerate(part[:-1].split(":")))


def _decode_entry(entry: str, path: str) -> DeviceEntry:
    fields = entry.split(",")
    if len(fields) != 4:
        raise ContractError(path, f"expected '<card id>,<type>,<memMiB>,<cores>', got {entry!r}")
    card, kind, memory, cores = fields
    if not (_is_uint(memory) and _is_uint(cores)):
        raise ContractError(path, f"memory and cores must be whole numbers in {entry!r}")
    try:
        split_card_id(card)
    except ContractError as exc:
        raise ContractError(path, exc.reason) from None
    return DeviceEntry(card=CardId(card), memory_mib=int(memory), cores=int(cores), type=kind)
