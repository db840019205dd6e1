"""On the embedded default there is no collector and no trace store, yet every pod's story
must be there to read: the stack receives its services' spans itself.

``receiving`` serves an OTLP/HTTP trace receiver on loopback (``POST /v1/traces``, protobuf,
plain or gzip, as OpenTelemetry's SDK exporters send it) and appends every span it is sent
to a file (``spans``), for ``rgpu trace``. The services point their standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` at it, exactly as they would at a collector.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from rgpu_runtime.serving import Listener, running

from .spans import records_of

__all__ = ["MAX_EXPORT_BYTES", "receiver_app", "receiving"]

MAX_EXPORT_BYTES = 16 << 20
"""Largest export accepted, after decompression; an SDK batch of 512 spans is well under 1 MiB."""
PROTOBUF = "application/x-protobuf"


def receiver_app(path: Path) -> Starlette:
    """The receiver, appending to ``path`` (created if missing)."""
    path.touch()

    async def traces(request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != PROTOBUF:
            return PlainTextResponse(f"send OTLP as {PROTOBUF}", status_code=415)
        body = await _body(request)
        if body is None:
            return PlainTextResponse("export too large or badly compressed", status_code=413)
        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(body)
        except DecodeError:
            return PlainTextResponse("not an OTLP ExportTraceServiceRequest", status_code=400)
        _append(path, message)
        answer = ExportTraceServiceResponse().SerializeToString()
        return Response(answer, media_type=PROTOBUF)

    return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])


async def _body(request: Request) -> bytes | None:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_EXPORT_BYTES:
            return None
    if request.headers.get("content-encoding", "").lower() != "gzip":
        return bytes(raw)
    try:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        inflated = inflater.decompress(bytes(raw), MAX_EXPORT_BYTES + 1)
    except zlib.error:
        return None
    return inflated if len(inflated) <= MAX_EXPORT_BYTES else None


def _append(path: Path, message: ExportTraceServiceRequest) -> None:
    # Written as they come, in the event loop: a batch is a few kilobytes, and one writer
    # keeps lines whole and in order.
    lines = "".join(json.dumps(record.to_dict()) + "\n" for record in records_of(message))
    with path.open("a", encoding="utf-8") as out:
        out.write(lines)


@asynccontextmanager
async def receiving(path: Path) -> AsyncIterator[str]:
    """Receive spans into ``path`` while the block runs; yields the base URL to export to
    (the value of ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    async with running(receiver_app(path), Listener(listen="127.0.0.1:0")) as (url,):
        yield url
