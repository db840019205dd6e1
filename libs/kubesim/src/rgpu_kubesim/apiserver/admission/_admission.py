"""Admission: calling Mutating- and ValidatingWebhookConfiguration webhooks like kube-apiserver.

For each write the server builds an AdmissionReview v1, POSTs it over TLS (verified against the
webhook's caBundle, or the system roots without one) to ``clientConfig.url`` or to the loopback
address ``ApiOptions.service_address_map`` gives the referenced Service, applies returned JSON
patches, and turns a denial into the Status kube returns. A webhook that cannot be called is
skipped under ``failurePolicy: Ignore`` and fails the request under ``Fail``. Connections are
kept alive per CA bundle (aiohttp: a TLS handshake per call would cost more than the call).
"""

from __future__ import annotations

import base64
import binascii
import ssl
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from rgpu_kubesim.apiserver.kinds import Attributes, Webhook, webhooks_of
from rgpu_kubesim.apiserver.storage import Storage
from rgpu_kubesim.errors import ApiError, WebhookCallError
from rgpu_kubesim.machinery import PatchError, Resource, evaluate, json_patch, require
from rgpu_kubesim.machinery import status as _status

_OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}
_MAX_CLIENTS = 32
CONNECTIONS_PER_WEBHOOK = 25
"""Connections kept to one webhook endpoint; more calls at once wait for one. kube-apiserver
keeps 25 idle per host; without a bound a burst of a hundred pod creations opened a hundred
TLS connections (a handshake each), a fifth of the simulation's CPU in that burst."""
WARNING_CHARACTERS = 256
_REVIEW_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
_MUTATING = require("mutatingwebhookconfigurations")
_VALIDATING = require("validatingwebhookconfigurations")


def denial(webhook: str, result: Mapping[str, Any] | None) -> ApiError:
    """kube's webhookerrors.ToStatusErr: the webhook's Status, message prefixed, code >= 400."""
    result = dict(result or {})
    code = int(result.get("code") or 0)
    prefix = f'admission webhook "{webhook}" denied the request'
    if result.get("message"):
        message = f"{prefix}: {result['message']}"
    elif result.get("reason"):
        message = f"{prefix}: {result['reason']}"
    else:
        message = f"{prefix} without explanation"
    details = result.get("details")
    reason = str(result.get("reason") or "")
    return _status.failure(max(code, 400), message, reason=reason, details=details)


class Admission:
    """Runs the mutating webhook chain; owns one HTTP client per CA bundle."""

    def __init__(self, storage: Storage, *, service_address_map: Mapping[str, str]) -> None:
        self._storage = storage
        self._addresses = dict(service_address_map)
        self._clients: dict[str, aiohttp.ClientSession] = {}
        self._cache: dict[str, tuple[int, tuple[Webhook, ...]]] = {}

    async def aclose(self) -> None:
        sessions, self._clients = list(self._clients.values()), {}
        for session in sessions:
            await session.close()

    def _webhooks(self, configs: Resource = _MUTATING) -> tuple[Webhook, ...]:
        """The webhooks of every configuration of ``configs``, rebuilt after any write to one."""
        revision = self._storage.revision(configs)
        cached = self._cache.get(configs.plural)
        if cached is None or cached[0] != revision:
            raw = [e.decode() for e in self._storage.entries(configs)]
            cached = self._cache[configs.plural] = (revision, webhooks_of(raw))
        return cached[1]

    def needed(self, operation: str, resource: Resource, subresource: str) -> bool:
        """Whether a webhook's rules name this request: without one, nothing is built or
        called (a lease renewal or an Event costs no review)."""
        hooks = (*self._webhooks(_MUTATING), *self._webhooks(_VALIDATING))
        return any(h.covers(operation, resource, subresource) for h in hooks)

    async def validate(self, attrs: Attributes) -> None:
        """Run every matching validating webhook on the (mutated) object; a denial raises.

        kube calls them in parallel and after its own validation; here they run in name order
        on the object as mutating admission left it (defaulted, before the server sets uid and
        creationTimestamp), and a patch in their answer is an error.
        """
        for hook in self._webhooks(_VALIDATING):
            if hook.applies_to(attrs) and _conditions_match(hook, attrs, attrs.obj):
                await self._invoke(hook, attrs, attrs.obj, mutating=False)

    async def admit(self, attrs: Attributes) -> dict[str, Any] | None:
        """Run every matching webhook; return the (possibly patched) object."""
        hooks = [h for h in self._webhooks(_MUTATING) if h.applies_to(attrs)]
        obj, called = attrs.obj, []
        for hook in hooks:
            if not _conditions_match(hook, attrs, obj):
                continue
            patched = await self._invoke(hook, attrs, obj)
            called.append((hook, patched != obj))
            obj = patched
        return await self._reinvoke(attrs, obj, called)

    async def _reinvoke(
        self, attrs: Attributes, obj: dict[str, Any] | None, called: list[tuple[Webhook, bool]]
    ) -> dict[str, Any] | None:
        # reinvocationPolicy IfNeeded: a webhook runs once more if any later webhook changed the
        # object after it ran; kube bounds this to a single extra round.
        changed_after = [any(c for _, c in called[i + 1 :]) for i in range(len(called))]
        for (hook, _), later_change in zip(called, changed_after, strict=True):
            if hook.reinvoke and later_change and _conditions_match(hook, attrs, obj):
                obj = await self._invoke(hook, attrs, obj)
        return obj

    async def _invoke(
        self, hook: Webhook, attrs: Attributes, obj: dict[str, Any] | None, *, mutating: bool = True
    ) -> dict[str, Any] | None:
        try:
            return await self._call(hook, attrs, obj, mutating=mutating)
        except WebhookCallError as exc:
            if hook.failure_policy == "Ignore":
                return obj
            raise _status.internal(str(exc)) from exc

    async def _call(
        self, hook: Webhook, attrs: Attributes, obj: dict[str, Any] | None, *, mutating: bool
    ) -> dict[str, Any] | None:
        uid = str(uuid.uuid4())
        review = _review(uid, attrs, obj)
        response = await self._post(hook, review)
        if response.get("uid") != uid:
            raise WebhookCallError(
                hook.name, f'expected response.uid="{uid}", got "{response.get("uid")}"'
            )
        if not mutating and (response.get("patch") or response.get("patchType")):
            raise WebhookCallError(
                hook.name, "validating webhooks may not return response.patch or patchType"
            )
        attrs.warnings.extend(_warnings(response))
        if not response.get("allowed"):
            raise denial(hook.name, response.get("status"))
        return _apply_patch(hook, response, obj) if mutating else obj

    async def _post(self, hook: Webhook, review: dict[str, Any]) -> Mapping[str, Any]:
        url, address, server_name = self._endpoint(hook)
        shown = f'Post "{url}?timeout={hook.timeout_seconds}s"'
        session = await self._session(hook)
        try:
            async with session.post(
                f"{address}?timeout={hook.timeout_seconds}s",
                data=orjson.dumps(review),
                headers=_REVIEW_HEADERS,
                timeout=aiohttp.ClientTimeout(total=hook.timeout_seconds),
                server_hostname=server_name or None,
            ) as reply:
                status, content = reply.status, await reply.read()
        except TimeoutError as exc:
            raise WebhookCallError(
                hook.name, f"failed to call webhook: {shown}: context deadline exceeded"
            ) from exc
        except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
            raise WebhookCallError(hook.name, f"failed to call webhook: {shown}: {exc!r}") from exc
        return _parse_reply(hook, status, content)

    def _endpoint(self, hook: Webhook) -> tuple[str, str, str]:
        """(URL as kube would show it, URL actually dialled, TLS server name to verify)."""
        config = hook.client_config
        if config.get("url"):
            return str(config["url"]), str(config["url"]), ""
        service = config.get("service") or {}
        namespace, name = service.get("namespace"), service.get("name")
        port, path = int(service.get("port", 443)), str(service.get("path") or "/")
        server_name = f"{name}.{namespace}.svc"
        shown = f"https://{server_name}:{port}{path}"
        address = self._addresses.get(f"{namespace}/{name}:{port}")
        if address is None:
            why = f"service {namespace}/{name}:{port} is not in ApiOptions.service_address_map"
            raise WebhookCallError(hook.name, f'failed to call webhook: Post "{shown}": {why}')
        return shown, f"https://{address}{path}", server_name

    async def _session(self, hook: Webhook) -> aiohttp.ClientSession:
        """The session (and its kept-alive connections) of the hook's CA bundle."""
        bundle = str(hook.client_config.get("caBundle") or "")
        session = self._clients.get(bundle)
        if session is None:
            connector = aiohttp.TCPConnector(
                ssl=_ssl_context(hook, bundle), limit_per_host=CONNECTIONS_PER_WEBHOOK
            )
            session = aiohttp.ClientSession(connector=connector, trust_env=False)
            if len(self._clients) >= _MAX_CLIENTS:
                oldest = next(iter(self._clients))
                await self._clients.pop(oldest).close()
            self._clients[bundle] = session
        return session


def _ssl_context(hook: Webhook, bundle: str) -> ssl.SSLContext:
    if not bundle:
        return ssl.create_default_context()
    try:
        pem = base64.b64decode(bundle, validate=True).decode()
        return ssl.create_default_context(cadata=pem)
    except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
        raise WebhookCallError(hook.name, f"invalid caBundle: {exc}") from exc


def _parse_reply(hook: Webhook, status: int, content: bytes) -> Mapping[str, Any]:
    if status != 200:
        text = content[:200].decode(errors="replace")
        why = f"an error on the server ({text!r}) prevented the request from succeeding"
        raise WebhookCallError(hook.name, f"failed to call webhook: {why} (HTTP {status})")
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise WebhookCallError(hook.name, f"received invalid webhook response: {exc}") from exc
    response = body.get("response") if isinstance(body, dict) else None
    if not isinstance(response, dict):
        raise WebhookCallError(hook.name, "received invalid webhook response: response is missing")
    return response


def _apply_patch(
    hook: Webhook, response: Mapping[str, Any], obj: dict[str, Any] | None
) -> dict[str, Any] | None:
    patch = response.get("patch")
    if not patch:
        return obj
    if response.get("patchType") != "JSONPatch":
        raise _status.internal(
            f'webhook "{hook.name}" returned patchType {response.get("patchType")!r}; '
            "only JSONPatch is allowed"
        )
    try:
        operations = orjson.loads(base64.b64decode(str(patch)))
        patched = json_patch(orjson.loads(orjson.dumps(obj)), operations)
    except (binascii.Error, orjson.JSONDecodeError, PatchError, ApiError) as exc:
        raise _status.internal(
            f'JSON patch from webhook "{hook.name}" could not be applied: {exc}'
        ) from exc
    if not isinstance(patched, dict):
        raise _status.internal(f'JSON patch from webhook "{hook.name}" did not produce an object')
    return patched


def _conditions_match(hook: Webhook, attrs: Attributes, obj: dict[str, Any] | None) -> bool:
    """kube's matchConditions gate: an error fails the request only under failurePolicy Fail."""
    if not hook.match_conditions:
        return True
    request = _review("", attrs, obj)["request"]
    variables = {"object": request.pop("object"), "oldObject": request.pop("oldObject")}
    verdict = evaluate(hook.match_conditions, variables | {"request": request})
    if verdict.error and hook.failure_policy != "Ignore":
        resource = attrs.resource
        label = f'{resource.qualified} "{attrs.name}"' if attrs.name else resource.qualified
        details = _status.resource_details(resource, attrs.name)
        raise _status.failure(403, f"{label} is forbidden: {verdict.error}", details=details)
    return verdict.matches


def _user_info(attrs: Attributes) -> dict[str, Any]:
    if attrs.user_info is not None:
        return dict(attrs.user_info)
    return {"username": attrs.user, "groups": ["system:authenticated"]}


def _options(attrs: Attributes) -> dict[str, Any]:
    options: dict[str, Any] = {
        "kind": _OPTIONS_KIND.get(attrs.operation, "CreateOptions"),
        "apiVersion": "meta.k8s.io/v1",
    }
    if attrs.dry_run:
        options["dryRun"] = ["All"]
    return options


def _warnings(response: Mapping[str, Any]) -> list[str]:
    """``response.warnings`` as kube keeps them: non-empty strings, each cut at 256 characters
    (the apiserver may truncate longer ones before they reach the client)."""
    found = response.get("warnings")
    if not isinstance(found, list):
        return []
    return [w[:WARNING_CHARACTERS] for w in found if isinstance(w, str) and w]


def _review(uid: str, attrs: Attributes, obj: dict[str, Any] | None) -> dict[str, Any]:
    resource = attrs.resource
    kind = {"group": resource.group, "version": resource.version, "kind": attrs.kind}
    gvr = {"group": resource.group, "version": resource.version, "resource": resource.plural}
    request: dict[str, Any] = {"uid": uid, "kind": kind, "resource": gvr}
    if attrs.subresource:
        request["subResource"] = attrs.subresource
    request.update(requestKind=kind, requestResource=gvr)
    if attrs.subresource:
        request["requestSubResource"] = attrs.subresource
    request.update(
        name=attrs.name,
        namespace=attrs.namespace,
        operation=attrs.operation,
        userInfo=_user_info(attrs),
        object=obj,
        oldObject=attrs.old,
        dryRun=attrs.dry_run,
        options=_options(attrs),
    )
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}
