"""The booking admission writes on a pod is read at ``/filter`` only while it stands."""

from __future__ import annotations

import pytest

from rgpu_contracts import BookingNote, ServerName
from rgpu_extender.booked import booked_server

NOW = 1_000_000.0


def pod(annotations: dict[str, str] | None) -> dict[str, object]:
    return {"metadata": {"name": "p", "annotations": annotations}}


def note(expires_at: float) -> dict[str, str]:
    return {
        "rgpu.io/booking": BookingNote(server=ServerName("gpu-a"), expires_at=expires_at).encode()
    }


def test_a_standing_booking_names_its_server() -> None:
    assert booked_server(pod(note(NOW + 30)), NOW) == "gpu-a"


@pytest.mark.parametrize("left", [-5.0, 0.0, 1.9])
def test_a_booking_lapsed_or_about_to_is_not_trusted(left: float) -> None:
    assert booked_server(pod(note(NOW + left)), NOW) is None


@pytest.mark.parametrize(
    "value",
    [
        "gpu-a",
        "{}",
        '{"server": "", "expiresAt": 2e6}',
        '{"server": "gpu-a", "expiresAt": "soon"}',
        '{"server": "gpu-a", "expiresAt": 1e999}',
        '{"server": "gpu-a", "expiresAt": 2e6, "pad": "' + "x" * 600 + '"}',
    ],
    ids=["not-json", "empty", "no-server", "text-time", "infinite", "too-long"],
)
def test_an_unreadable_note_is_ignored_not_trusted(value: str) -> None:
    assert booked_server(pod({"rgpu.io/booking": value}), NOW) is None


def test_a_pod_without_a_note_goes_to_the_allocator() -> None:
    assert booked_server(pod(None), NOW) is None
    assert booked_server({}, NOW) is None
