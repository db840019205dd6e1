"""The Binding must carry exactly HAMi's annotations (docs/design.md §3), and
the allocator is the one that knows the cards, so it renders them from the claim at commit.

Per container in pod order (init first): ``<card id>,RemoteGPU,<card memory MiB>,<cores>:``
per card, ``;`` per container, the whole card since the pod holds it; the same value under
``hami.io/remote-gpu-devices-to-allocate`` and ``-allocated``; the lupine endpoint; and, in
card granularity, ``rgpu.io/visible-devices`` (comma-joined GPU UUIDs) for
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from collections.abc import Mapping

from rgpu_contracts import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_ENDPOINT,
    ANNOTATION_TO_ALLOCATE,
    Card,
    CardId,
    Claim,
    DeviceEntry,
    encode_devices,
    split_card_id,
)
from rgpu_placement import Granularity

from .errors import CardsGone

__all__ = ["ANNOTATION_RETRY_AT", "ANNOTATION_VISIBLE_DEVICES", "binding_annotations"]

ANNOTATION_VISIBLE_DEVICES = "rgpu.io/visible-devices"
ANNOTATION_RETRY_AT = "rgpu.io/retry-at"


def _entry(card: CardId, cards: Mapping[CardId, Card]) -> DeviceEntry:
    found = cards.get(card)
    if found is None:
        raise CardsGone(
            f"card {card} is no longer in the fleet; release the claim and schedule again"
        )
    return DeviceEntry(card=card, memory_mib=found.memory_mib, cores=found.cores)


def binding_annotations(
    claim: Claim, *, endpoint: str, cards: Mapping[CardId, Card], granularity: Granularity
) -> tuple[tuple[str, str], ...]:
    """The annotations the Binding must carry for ``claim``; raises ``CardsGone``."""
    devices = encode_devices([[_entry(c, cards) for c in a.cards] for a in claim.containers])
    out = [
        (ANNOTATION_TO_ALLOCATE, devices),
        (ANNOTATION_ALLOCATED, devices),
        (ANNOTATION_ENDPOINT, endpoint),
    ]
    if granularity == "card":
        uuids = ",".join(split_card_id(c)[1] for c in claim.cards)
        out.append((ANNOTATION_VISIBLE_DEVICES, uuids))
    return tuple(out)
