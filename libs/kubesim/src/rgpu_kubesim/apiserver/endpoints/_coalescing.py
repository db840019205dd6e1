"""One socket write per answer instead of two.

uvicorn writes a response's status line and headers, then its body, each with its own
``transport.write``, and each becomes a ``send`` on loopback, where the kernel runs the
receiver's TCP path inside the sender's call: measured under a burst, those two writes were a
quarter of the simulated apiserver's CPU. This protocol hands uvicorn a transport that keeps
what is written during one turn of the event loop and sends it as one write at the end of that
turn (at once past ``_FLUSH_BYTES``, so a big list or a watch's first chunks still meet the
real transport's flow control). Nothing waits longer than the current turn of the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol", "CoalescingTransport"]

_FLUSH_BYTES = 64 * 1024


class CoalescingTransport(asyncio.Transport):
    """A transport that joins the writes of one loop turn into one write of ``inner``."""

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = inner
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= _FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_soon)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush_soon(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand everything kept so far to the real transport (dropped once it is closing)."""
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self._inner.is_closing():
            self._inner.write(data)

    def close(self) -> None:
        self.flush()
        self._inner.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self._inner.abort()

    def write_eof(self) -> None:
        self.flush()
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._size + self._inner.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a ``CoalescingTransport`` (``http=`` in its Config)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))
