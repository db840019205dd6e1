from __future__ import annotations

import pytest

from rgpu_contracts import ContractError, Reason, ReasonCount, parse_reasons, render_reasons


def test_render_sorts_by_reason_name_and_skips_zero_counts() -> None:
    text = render_reasons(
        {
            Reason.NODE_INSUFFICIENT_DEVICE: 2,
            Reason.CARD_INSUFFICIENT_MEMORY: 3,
            Reason.CARD_NOT_HEALTH: 0,
        },
        3,
    )
    assert text == "3/3 CardInsufficientMemory, 2/3 NodeInsufficientDevice"


def test_parse_is_the_inverse_of_render() -> None:
    counts = (
        ReasonCount(reason=Reason.CARD_BUSY_ON_SERVER, count=4),
        ReasonCount(reason=Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, count=8),
    )
    parsed, total = parse_reasons(render_reasons(counts, 12))
    assert parsed == counts and total == 12


@pytest.mark.parametrize("text", ["3 CardNotHealth", "x/3 CardNotHealth", "1/3 Nope"])
def test_parse_rejects_foreign_text(text: str) -> None:
    with pytest.raises(ContractError):
        parse_reasons(text)


def test_hami_reason_names_are_exact() -> None:
    assert {r.value for r in Reason} >= {
        "CardNotHealth",
        "ExclusiveDeviceAllocateConflict",
        "CardInsufficientMemory",
        "NodeInsufficientDevice",
    }
