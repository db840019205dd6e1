"""A pod's process opening a connection to a lupine server, from the pod's own address.

The simulated network judges a connection by its source address, so the connection must
really come from the pod's address: the socket is bound to it before connecting (every
127.0.0.0/8 address is local on Linux). The client then says what every lupine build answers
first: the HTTP/2 client preface and an empty SETTINGS frame, to which the server replies with
its own SETTINGS. Bytes back mean the server took the connection; a reset or a close before
any byte means something in between refused it (the network, like a CNI rejecting the
packets); nothing listening is ``refused``; silence past the timeout (a dropped packet, a hung
server) is ``timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from typing import Final

import anyio

from rgpu_contracts.hami import split_endpoint

__all__ = ["Dialed", "dial"]

logger = logging.getLogger(__name__)

_HELLO: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""The HTTP/2 client preface, then an empty SETTINGS frame (length 0, type 4, stream 0)."""


class Dialed(enum.Enum):
    """How one attempt to connect ended."""

    CONNECTED = "connected"
    RESET = "reset"
    """Accepted, then reset or closed before the server said anything: refused on the way."""
    REFUSED = "refused"
    """Nothing listens there (or the address is not local)."""
    TIMEOUT = "timeout"

    @property
    def retry(self) -> bool:
        """Whether trying again may help (the network's verdict can change; nothing listening
        is the server's own answer)."""
        return self in (Dialed.RESET, Dialed.TIMEOUT)


async def dial(endpoint: str, source: str, *, timeout: float) -> Dialed:
    """Connect from ``source`` to lupine at ``endpoint`` (``host:port``) and see what answers."""
    host, port = split_endpoint(endpoint)
    writer: asyncio.StreamWriter | None = None
    try:
        with anyio.fail_after(timeout):
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            writer.write(_HELLO)
            await writer.drain()
            answer = await reader.read(1)
    except TimeoutError:
        return Dialed.TIMEOUT
    except ConnectionRefusedError:
        return Dialed.REFUSED
    except (ConnectionResetError, BrokenPipeError):
        return Dialed.RESET
    except OSError as exc:
        logger.debug("kubelet: dialling %s from %s failed: %s", endpoint, source, exc)
        return Dialed.REFUSED
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return Dialed.CONNECTED if answer else Dialed.RESET
