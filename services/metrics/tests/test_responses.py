"""Parts are sent as consecutive body messages under one exact Content-Length."""

from __future__ import annotations

import pytest
from starlette.types import Message

from rgpu_metrics.responses import PartsResponse

pytestmark = pytest.mark.anyio


async def send_all(response: PartsResponse) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await response({"type": "http", "method": "GET"}, receive, send)
    return sent


async def test_parts_are_sent_in_order_and_only_the_last_ends_the_body():
    sent = await send_all(PartsResponse([b"ab", b"", b"cde"], content_type="text/plain"))
    start, *bodies = sent
    assert dict(start["headers"])[b"content-length"] == b"5"
    assert [(m["body"], m["more_body"]) for m in bodies] == [(b"ab", True), (b"cde", False)]


async def test_no_parts_still_end_the_response_with_an_empty_body():
    start, body = await send_all(PartsResponse([], content_type="text/plain"))
    assert dict(start["headers"])[b"content-length"] == b"0"
    assert body == {"type": "http.response.body", "body": b""}
