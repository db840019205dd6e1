"""A 5,000-server fleet is 10 MB of JSON, sent to every long-poll
waiter on every change; gzip cuts that twentyfold, but only for clients that said they can
read it (``Accept-Encoding``, RFC 9110 §12.5.3), and never for one that refused it with
``q=0``.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["accepts_gzip"]


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header value allows a gzip-encoded answer.

    An explicit ``gzip`` (or ``x-gzip``) offer wins over ``*``; a quality of 0 refuses.
    """
    offers = dict(_offers(header or ""))
    quality = offers.get("gzip", offers.get("x-gzip", offers.get("*")))
    return quality is not None and quality > 0


def _offers(header: str) -> Iterator[tuple[str, float]]:
    for offer in header.split(","):
        coding, _, params = offer.partition(";")
        if coding.strip():
            yield coding.strip().lower(), _quality(params)


def _quality(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 1.0
    return 1.0
