"""Reading what a client sent: bodies in JSON or YAML, query parameters, DeleteOptions.

Malformed input must come back as the 400/415 Status kube would send, naming the parameter
and what was expected, never as a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import yaml
from starlette.requests import Request

from rgpu_kubesim.apiserver.auth import AUTHENTICATED_USER
from rgpu_kubesim.apiserver.endpoints import _protobuf
from rgpu_kubesim.machinery import PATCH_TYPES
from rgpu_kubesim.machinery import status as _status

_JSON_TYPES = frozenset({"application/json", "*/*", ""})
_YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml"})
_BODY_TYPES = ("application/json", "application/yaml", _protobuf.MEDIA_TYPE)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


def _decode(raw: bytes, kind: str) -> Any:
    if kind == _protobuf.MEDIA_TYPE:
        return _protobuf.decode(raw)
    try:
        return yaml.safe_load(raw) if kind in _YAML_TYPES else orjson.loads(raw)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise _status.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc


async def read_object(request: Request) -> Any:
    """The decoded body of a create/update/bind; 415 for media types kube would not accept."""
    kind = media_type(request)
    if kind not in _JSON_TYPES and kind not in _YAML_TYPES and kind != _protobuf.MEDIA_TYPE:
        raise _status.unsupported_media_type(_BODY_TYPES)
    raw = await request.body()
    if not raw.strip():
        raise _status.bad_request("the request body is empty; send the object as JSON")
    return _decode(raw, kind)


async def read_patch(request: Request) -> tuple[str, Any]:
    """(patch content type, decoded patch); 415 before reading an unsupported type."""
    kind = media_type(request)
    if kind not in PATCH_TYPES.values():
        raise _status.unsupported_media_type(PATCH_TYPES.values())
    raw = await request.body()
    if not raw.strip():
        raise _status.bad_request("the patch body is empty")
    return kind, _decode(raw, "application/json")


async def read_delete_options(request: Request) -> Mapping[str, Any]:
    """The optional DeleteOptions body (preconditions, dryRun, ...); empty without one."""
    raw = await request.body()
    if not raw.strip():
        return {}
    options = _decode(raw, media_type(request))
    if not isinstance(options, dict):
        raise _status.bad_request("the DeleteOptions body must be a JSON object")
    return options


def flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in {"true", "1"}


def integer(query: Mapping[str, str], name: str, default: int) -> int:
    value = query.get(name, "")
    if not value:
        return default
    if not value.isdigit():
        raise _status.bad_request(
            f"{name}: invalid value {value!r}: must be a non-negative integer"
        )
    return int(value)


def wants_table(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "as=Table" in accept and "g=meta.k8s.io" in accept


def user_info_of(request: Request) -> dict[str, Any] | None:
    """The UserInfo of a bearer-authenticated request; None for the simulator's named users."""
    authenticated = request.scope.get(AUTHENTICATED_USER)
    return None if authenticated is None else dict(authenticated.to_dict())


def user_of(request: Request, default: str, agents: Mapping[str, str]) -> str:
    """The requester: its bearer token's account, else ``X-Sim-User``, else the user its
    User-Agent prefix maps to, else default."""
    authenticated = request.scope.get(AUTHENTICATED_USER)
    if authenticated is not None:
        return str(authenticated.username)
    named = request.headers.get("x-sim-user")
    if named:
        return named
    agent = request.headers.get("user-agent", "")
    return next((user for prefix, user in agents.items() if agent.startswith(prefix)), default)
