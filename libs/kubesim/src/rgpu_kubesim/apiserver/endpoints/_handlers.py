"""The REST verbs: what each request does to storage, with faults and admission around it.

Each handler follows kube-apiserver's request pipeline: decode and default the body, check the
namespace exists, run mutating admission, then let storage validate and commit. Faults are
applied first so that an injected error costs nothing and changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response

from rgpu_kubesim.apiserver.endpoints import (
    _access_reviews,
    _eviction,
    _fields,
    _options,
    _requests,
    _tables,
    _token_api,
)
from rgpu_kubesim.apiserver.endpoints._admitting import AdmissionStep
from rgpu_kubesim.apiserver.endpoints._deps import Deps
from rgpu_kubesim.apiserver.endpoints._responses import (
    WatchResponse,
    json_response,
    list_response,
    object_response,
)
from rgpu_kubesim.apiserver.kinds import graceful as _graceful
from rgpu_kubesim.apiserver.storage import ListPage, event_line
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import (
    JSON_PATCH,
    Entry,
    Filter,
    Target,
    parse_filter,
    parse_target,
    verb_for,
)
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]
_DEFAULT_WATCH_SECONDS = 1800
_PATCH_ATTEMPTS = 5


class ResourceHandlers:
    """Endpoints for every resource path (``/api/...`` and ``/apis/...``)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self._admission = AdmissionStep(deps)
        self._verbs: dict[str, Callable[[Target, Request], Awaitable[Response]]] = {
            "get": self.get,
            "list": self.list,
            "watch": self.watch,
            "create": self.create,
            "update": self.update,
            "patch": self.patch,
            "delete": self.delete,
            "deletecollection": self.delete_collection,
        }

    async def handle(self, request: Request) -> Response:
        target = parse_target(request.scope["path"])
        verb = verb_for(request.method, target, _requests.flag(request.query_params, "watch"))
        user = self.deps.authorizer.authorize(request, verb, target)
        decision = self.deps.faults.decide(verb, target.fault_key)
        if decision.latency:
            await anyio.sleep(decision.latency)
        if decision.error is not None:
            raise decision.error
        if verb == "create" and target.subresource == "binding":
            return await self.bind(target, request)
        if verb == "create" and target.subresource == "eviction":
            return await self.evict(target, request)
        if target.resource.verbs and verb not in target.resource.verbs:
            raise _status.method_not_allowed()
        if verb == "create" and target.subresource == "token":
            return await _token_api.token_request(
                self.deps.storage, self.deps.authn, target, request
            )
        if verb == "create" and target.resource.plural == "tokenreviews":
            return await _token_api.token_review(self.deps.authn, request)
        if verb == "create" and target.resource.group == "authorization.k8s.io":
            return await _access_reviews.review(self.deps.authorizer, user, target, request)
        return await self._verbs[verb](target, request)

    # -- reads -------------------------------------------------------------------------------

    async def get(self, target: Target, request: Request) -> Response:
        entry = self.deps.storage.get(target.resource, target.namespace or "", target.name)
        if _requests.wants_table(request):
            body = _tables.table(target.resource, [entry], rv=entry.rv, now=self.deps.clock())
            return json_response(body)
        return object_response(target.resource, entry)

    async def list(self, target: Target, request: Request) -> Response:
        query = request.query_params
        _options.check_list(query)
        page = self.deps.storage.list_entries(
            target.resource,
            _filter(target, request),
            limit=_requests.integer(query, "limit", 0),
            continue_token=query.get("continue", ""),
            resource_version=query.get("resourceVersion", ""),
            match=query.get("resourceVersionMatch", ""),
        )
        return list_response(request, target.resource, page, self.deps.clock())

    async def watch(self, target: Target, request: Request) -> Response:
        query = request.query_params
        send_initial = _options.check_watch(query)
        bookmarks = _requests.flag(query, "allowWatchBookmarks")
        try:
            start = self.deps.storage.open_watch(
                target.resource,
                _filter(target, request),
                resource_version=query.get("resourceVersion", ""),
                send_initial=send_initial,
            )
        except ApiError as exc:
            if exc.code not in (410, 504):
                raise
            # kube reports an unusable version inside a 200 stream, as a single ERROR event.
            return Response(
                event_line("ERROR", orjson.dumps(exc.status)), media_type="application/json"
            )
        return WatchResponse(
            self.deps.storage,
            start,
            timeout=_requests.integer(query, "timeoutSeconds", _DEFAULT_WATCH_SECONDS),
            bookmark_interval=self.deps.bookmark_interval if bookmarks else None,
            initial_end_bookmark=send_initial and bookmarks,
        )

    # -- writes ------------------------------------------------------------------------------

    async def create(self, target: Target, request: Request) -> Response:
        storage, namespace = self.deps.storage, target.namespace or ""
        options = _options.write_options("create", request.query_params)
        body = await _requests.read_object(request)
        warnings = _fields.enforce(target.resource, body, options.field_validation)
        obj = storage.normalize(target.resource, namespace, body)
        name = str(obj["metadata"].get("name") or "")
        storage.require_namespace(target.resource, namespace, name)
        obj = await self._admission.admitted(
            request, target, "CREATE", obj, None, dry_run=options.dry_run
        )
        entry = storage.create(target.resource, namespace, obj, dry_run=options.dry_run)
        return object_response(target.resource, entry, 201, _warned(request, warnings))

    async def update(self, target: Target, request: Request) -> Response:
        storage, namespace = self.deps.storage, target.namespace or ""
        options = _options.write_options("update", request.query_params)
        body = await _requests.read_object(request)
        warnings = _fields.enforce(target.resource, body, options.field_validation)
        obj = storage.normalize(target.resource, namespace, body, name=target.name)
        current = storage.get(target.resource, namespace, target.name)
        admitted = await self._admission.admitted(
            request, target, "UPDATE", obj, current, dry_run=options.dry_run
        )
        entry = storage.update(
            target.resource,
            namespace,
            target.name,
            admitted,
            subresource=target.subresource,
            dry_run=options.dry_run,
            normalized=admitted is obj,
        )
        return object_response(target.resource, entry, warnings=_warned(request, warnings))

    async def patch(self, target: Target, request: Request) -> Response:
        options = _options.write_options("patch", request.query_params)
        content_type, patch = await _requests.read_patch(request)
        for _ in range(_PATCH_ATTEMPTS - 1):
            with contextlib.suppress(_RetryablePatchConflict):
                return await self._patch_once(target, request, content_type, patch, options)
        try:
            return await self._patch_once(target, request, content_type, patch, options)
        except _RetryablePatchConflict as conflict:
            raise conflict.error from conflict

    async def _patch_once(
        self,
        target: Target,
        request: Request,
        content_type: str,
        patch: Any,
        options: _options.WriteOptions,
    ) -> Response:
        storage, namespace = self.deps.storage, target.namespace or ""
        current = storage.get(target.resource, namespace, target.name)
        obj = storage.patched(target.resource, current, patch, content_type)
        warnings: tuple[str, ...] = ()
        if content_type == JSON_PATCH or _fields.may_add_unknown(target.resource.plural, patch):
            warnings = _fields.enforce(target.resource, obj, options.field_validation, body=False)
        explicit = str((obj.get("metadata") or {}).get("resourceVersion")) != str(current.rv)
        obj = storage.normalize(target.resource, namespace, obj, name=target.name)
        admitted = await self._admission.admitted(
            request, target, "UPDATE", obj, current, dry_run=options.dry_run
        )
        try:
            entry = storage.update(
                target.resource,
                namespace,
                target.name,
                admitted,
                subresource=target.subresource,
                dry_run=options.dry_run,
                normalized=admitted is obj,
            )
        except ApiError as exc:
            # A write that slipped in while webhooks ran is not the client's conflict: re-patch.
            if exc.code == 409 and not explicit:
                raise _RetryablePatchConflict(exc) from exc
            raise
        return object_response(target.resource, entry, warnings=_warned(request, warnings))

    async def delete(self, target: Target, request: Request) -> Response:
        storage, namespace = self.deps.storage, target.namespace or ""
        body = await _requests.read_delete_options(request)
        options = _options.write_options("delete", request.query_params, body.get("dryRun"))
        preconditions = body.get("preconditions") or {}
        grace = _graceful.requested_grace(request.query_params, body)
        current = storage.get(target.resource, namespace, target.name)
        entry = await self._delete_one(
            request, target, current, preconditions, options.dry_run, grace
        )
        if target.resource.delete_returns_object:
            return object_response(target.resource, entry)
        details = _status.resource_details(target.resource, entry.name, uid=entry.uid)
        return json_response(_status.success(details))

    async def _delete_one(
        self,
        request: Request,
        target: Target,
        current: Entry,
        preconditions: Any,
        dry_run: bool,
        grace: int | None,
    ) -> Entry:
        await self._admission.admit(request, target, "DELETE", None, current, dry_run=dry_run)
        return self.deps.storage.delete(
            target.resource,
            current.namespace,
            current.name,
            preconditions,
            dry_run=dry_run,
            grace_period_seconds=grace,
        )

    async def delete_collection(self, target: Target, request: Request) -> Response:
        body = await _requests.read_delete_options(request)
        dry_run = _options.write_options("delete", request.query_params, body.get("dryRun")).dry_run
        grace = _graceful.requested_grace(request.query_params, body)
        page = self.deps.storage.list_entries(target.resource, _filter(target, request))
        deleted = [
            await self._delete_one(request, target, entry, {}, dry_run, grace)
            for entry in page.entries
        ]
        result = ListPage(entries=tuple(deleted), rv=self.deps.storage.resource_version)
        return list_response(request, target.resource, result, self.deps.clock())

    async def bind(self, target: Target, request: Request) -> Response:
        binding = await _requests.read_object(request)
        if not isinstance(binding, dict):
            raise _status.bad_request("the Binding body must be a JSON object")
        name = _binding_name(target, binding)
        namespace = target.namespace or ""
        self.deps.storage.get(target.resource, namespace, name)
        if not (binding.get("target") or {}).get("name"):
            raise _status.failure(422, f'Binding "{name}" is invalid: target.name: Required value')
        binding = await self._admission.admitted(
            request, target, "CREATE", binding, None, name=name
        )
        self.deps.storage.bind(namespace, name, binding)
        return json_response(_status.success(code=201), 201)

    async def evict(self, target: Target, request: Request) -> Response:
        eviction = await _requests.read_object(request)
        namespace = target.namespace or ""
        self.deps.storage.get(target.resource, namespace, target.name)
        if isinstance(eviction, dict):
            eviction = await self._admission.admitted(request, target, "CREATE", eviction, None)
        _eviction.evict(self.deps.storage, namespace, target.name, eviction, self.deps.clock())
        return json_response(_status.success(code=201), 201)


def _warned(request: Request, warnings: Iterable[str]) -> tuple[str, ...]:
    """The write's own warnings, then the admission webhooks' (``response.warnings``)."""
    return (*warnings, *getattr(request.state, "admission_warnings", ()))


class _RetryablePatchConflict(Exception):
    def __init__(self, error: ApiError) -> None:
        super().__init__(str(error))
        self.error = error


def _filter(target: Target, request: Request) -> Filter:
    query = request.query_params
    labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
    return parse_filter(target.resource, target.namespace, labels, fields)


def _binding_name(target: Target, binding: JsonObj) -> str:
    from_body = str((binding.get("metadata") or {}).get("name") or "")
    if target.name and from_body and from_body != target.name:
        raise _status.name_mismatch(from_body, target.name)
    name = target.name or from_body
    if not name:
        raise _status.bad_request("the Binding needs metadata.name (the pod to bind)")
    return name
