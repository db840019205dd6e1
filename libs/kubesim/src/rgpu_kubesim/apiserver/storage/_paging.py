"""Paged lists: continue tokens and the list's resourceVersion semantics.

A client paging through 100,000 pods gets ``limit`` items and an opaque continue token per
page; every page reports the first page's resourceVersion, so a watch started from it replays
whatever changed while the client paged. Each page is cut from the state at that version.
Tokens older than the retained window are 410, like kube's after compaction, and the Status
carries a token that continues at the latest version (the client may accept an inconsistent
list rather than start over).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import orjson

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Entry, Key
from rgpu_kubesim.machinery import status as _status


@dataclass(frozen=True, slots=True, kw_only=True)
class ListPage:
    """One page of a list: matching entries, the list's resourceVersion and paging state."""

    entries: tuple[Entry, ...]
    rv: int
    continue_token: str = ""
    remaining: int | None = None


LATEST = -1
"""The version in a continue token that continues at the newest state (kube's -1)."""

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


def continue_expired(latest_token: str) -> ApiError:
    """410 for a stale continue token, offering ``latest_token`` in the Status's metadata."""
    error = _status.expired(CONTINUE_EXPIRED)
    error.status["metadata"] = {"continue": latest_token}
    return error


def list_too_old() -> ApiError:
    """410 for a list at an exact version older than the retained history."""
    return _status.expired("The resourceVersion for the provided list is too old.")


def parse_resource_version(text: str) -> int:
    if not text.isdigit():
        raise _status.bad_request(f'invalid resource version "{text}"')
    return int(text)


def encode_continue(rv: int, key: Key) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(key)})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, Key]:
    try:
        raw = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        namespace, name = raw["start"]
        return int(raw["rv"]), (str(namespace), str(name))
    except (ValueError, KeyError, TypeError) as exc:
        raise _status.bad_request(f"continue key is not valid: {exc}") from exc
