"""Tests often wait for state they cannot await: a task in another server, an informer's
cache, a child process. One poller, so every such wait has the same interval and fails the
same way: with the thing awaited named, not a bare ``TimeoutError``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["eventually"]

Predicate = Callable[[], object] | Callable[[], Awaitable[object]]


async def eventually(
    predicate: Predicate,
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str | None = None,
) -> None:
    """Poll ``predicate`` (sync or async) every ``interval`` s until it returns something true.

    Raises ``AssertionError`` naming ``what`` (by default the predicate's source) and its last
    value when ``timeout`` seconds pass first.
    """
    last: object = None
    try:
        with anyio.fail_after(timeout):
            # Polling is the point: the state lives where no event reaches the test.
            while not (last := await _call(predicate)):  # noqa: ASYNC110
                await anyio.sleep(interval)
    except TimeoutError as exc:
        awaited = what if what is not None else describe(predicate)
        raise AssertionError(
            f"still false after {timeout:g} s: {awaited} (last value: {last!r})"
        ) from exc


async def _call(predicate: Predicate) -> object:
    result = predicate()
    if inspect.isawaitable(result):
        return await result
    return result


def describe(predicate: Callable[..., object]) -> str:
    """The predicate as written (a lambda's line of source), else its qualified name."""
    if getattr(predicate, "__name__", None) != "<lambda>":
        return str(getattr(predicate, "__qualname__", repr(predicate)))
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)
