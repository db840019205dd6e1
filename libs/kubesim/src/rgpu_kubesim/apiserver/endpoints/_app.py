"""The Starlette application of the simulated apiserver: routes and error translation.

Discovery, health and the ``/_sim/faults`` control endpoint are plain Starlette routes; every
resource path goes straight to one handler that parses kube's path grammar itself. Every error
leaves as a Kubernetes ``Status`` body, including unknown paths and wrong methods.
"""

from __future__ import annotations

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_kubesim.apiserver.auth import BearerAuth, NonResourceAuthorization
from rgpu_kubesim.apiserver.endpoints import _discovery, _openapi
from rgpu_kubesim.apiserver.endpoints._deps import Deps
from rgpu_kubesim.apiserver.endpoints._handlers import ResourceHandlers
from rgpu_kubesim.apiserver.endpoints._metering import RequestMetering
from rgpu_kubesim.apiserver.endpoints._responses import error_response, json_response
from rgpu_kubesim.errors import ApiError, FaultSpecError
from rgpu_kubesim.machinery import status as _status

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


async def _api_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ApiError):  # handlers are keyed by class; never reached
        raise exc
    return error_response(exc)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # The client closed the connection before its body arrived (a process killed mid-request,
    # as the soak's faults do): nobody is left to read an answer, and it is no server error.
    return error_response(_status.bad_request("the client disconnected before its body arrived"))


async def _http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):  # handlers are keyed by class; never reached
        raise exc
    if exc.status_code == 405:
        return error_response(_status.method_not_allowed())
    if exc.status_code == 404:
        return error_response(_status.route_not_found())
    return error_response(_status.failure(exc.status_code, str(exc.detail)))


class _Discovery:
    async def version(self, request: Request) -> Response:
        return json_response(_discovery.version_info())

    async def core(self, request: Request) -> Response:
        return json_response(_discovery.api_versions(request.url.netloc))

    async def groups(self, request: Request) -> Response:
        return json_response(_discovery.api_group_list())

    async def group(self, request: Request) -> Response:
        return _found(_discovery.api_group(request.path_params["group"]))

    async def core_resources(self, request: Request) -> Response:
        return _found(_discovery.resource_list("", request.path_params["version"]))

    async def group_resources(self, request: Request) -> Response:
        params = request.path_params
        return _found(_discovery.resource_list(params["group"], params["version"]))

    async def openapi_root(self, request: Request) -> Response:
        return json_response(_openapi.root())

    async def openapi_core(self, request: Request) -> Response:
        return _found(_openapi.group_version("", request.path_params["version"]))

    async def openapi_group(self, request: Request) -> Response:
        params = request.path_params
        return _found(_openapi.group_version(params["group"], params["version"]))


def _found(document: dict[str, object] | None) -> Response:
    if document is None:
        raise _status.route_not_found()
    return json_response(document)


class _FaultControl:
    def __init__(self, deps: Deps) -> None:
        self._faults = deps.faults

    async def handle(self, request: Request) -> Response:
        if request.method != "GET":
            await self._apply(request)
        return json_response(self._faults.to_dict())

    async def _apply(self, request: Request) -> None:
        try:
            body = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError as exc:
            raise _status.bad_request(f"/_sim/faults expects a JSON object: {exc}") from exc
        if not isinstance(body, dict):
            raise _status.bad_request("/_sim/faults expects a JSON object")
        try:
            self._faults.apply(body, replace=request.method == "PUT")
        except FaultSpecError as exc:
            raise _status.bad_request(str(exc)) from exc


async def _healthy(request: Request) -> Response:
    return PlainTextResponse("ok")


class _Resources:
    """The resource paths' ASGI endpoint, outside Starlette's router and its exception layers:
    every pod write, watch and lease renewal comes here, and routing it by regex through a
    dozen discovery routes first cost a tenth of each request's CPU."""

    def __init__(self, handlers: ResourceHandlers) -> None:
        self._handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self._handlers.handle(request)
        except ApiError as exc:
            response = error_response(exc)
        except ClientDisconnect:
            response = await _client_gone(request, ClientDisconnect())
        await response(scope, receive, send)


class _Dispatch:
    """Resource paths to ``_Resources`` (with metering and authentication), the rest (discovery,
    health, ``/_sim/faults``) to the Starlette app."""

    def __init__(self, resources: ASGIApp, rest: ASGIApp) -> None:
        self._resources = resources
        self._rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_resource_path(scope["path"]):
            await self._resources(scope, receive, send)
        else:
            await self._rest(scope, receive, send)


def is_resource_path(path: str) -> bool:
    """``/api/<version>/...`` and ``/apis/<group>/<version>/...``: not a discovery document."""
    if path.startswith("/api/"):
        return path.count("/") >= 3
    return path.startswith("/apis/") and path.count("/") >= 4


def create_app(deps: Deps) -> ASGIApp:
    """The apiserver's ASGI app over ``deps`` (storage, faults, admission, settings)."""
    discovery = _Discovery()
    resources = ResourceHandlers(deps)
    routes = [
        Route("/version", discovery.version),
        Route("/api", discovery.core),
        Route("/api/{version}", discovery.core_resources),
        Route("/apis", discovery.groups),
        Route("/apis/{group}", discovery.group),
        Route("/apis/{group}/{version}", discovery.group_resources),
        Route("/openapi/v3", discovery.openapi_root),
        Route("/openapi/v3/api/{version}", discovery.openapi_core),
        Route("/openapi/v3/apis/{group}/{version}", discovery.openapi_group),
        Route("/healthz", _healthy),
        Route("/livez", _healthy),
        Route("/readyz", _healthy),
        Route("/_sim/faults", _FaultControl(deps).handle, methods=["GET", "POST", "PUT"]),
        Route("/api/{path:path}", resources.handle, methods=_ALL_METHODS),
        Route("/apis/{path:path}", resources.handle, methods=_ALL_METHODS),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, ClientDisconnect: _client_gone}
    middleware = [
        Middleware(RequestMetering, meter=deps.meter),
        Middleware(BearerAuth, authenticator=deps.authn),
        Middleware(NonResourceAuthorization, authorizer=deps.authorizer),
    ]
    rest = Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)
    fast = RequestMetering(BearerAuth(_Resources(resources), deps.authn), meter=deps.meter)
    return _Dispatch(fast, rest)
