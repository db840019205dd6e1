"""A task group wraps what it raises in an exception group, but a
caller of ``running`` or ``app_lifespan`` should catch the ``SettingsError`` it knows, not dig
through a group that holds nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def lone_errors() -> Iterator[None]:
    """Re-raise the only exception of an exception group as itself; leave real groups alone."""
    try:
        yield
    except BaseExceptionGroup as group:
        inner = lone(group)
        if inner is group:
            raise
        # Keep the inner exception's own cause (e.g. the ConfigException behind a
        # SettingsError) and drop the implicit link back to the group that wrapped it.
        raise inner from inner.__cause__


def lone(exc: BaseException) -> BaseException:
    """The single exception nested in ``exc``'s groups, or ``exc`` when there are several."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
