"""One way to reach the Kubernetes API, with timeouts and our errors.

``kube_client(settings)`` picks the apiserver the way operators expect (explicit
``RGPU_KUBE_URL``, else in-cluster service account, else kubeconfig) and yields a
``KubeClient``: the kubernetes_asyncio APIs (``core``, ``coordination``, ``api_client``)
plus wrappers that put a timeout on every call and turn ``ApiException``, aiohttp and
timeout errors into the ``KubeError`` family; every request gets a client span
(``_spans``). Hot paths use the raw variants, which skip
kubernetes_asyncio's model deserialisation (an order of magnitude slower than orjson for pods)
and return plain dicts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio.client import ApiClient, Configuration, CoordinationV1Api, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import load_incluster_config, load_kube_config

from rgpu_runtime.errors import KubeError, SettingsError
from rgpu_runtime.pacing import Backoff
from rgpu_runtime.settings import Settings

from ._failures import kube_error, transport_error
from ._spans import trace_requests
from ._watch import WatchEvent, watch_events

__all__ = ["KubeClient", "Listing", "kube_client"]

ApiCall = Callable[..., Awaitable[Any]]

DEFAULT_TIMEOUT = 10.0
"""Seconds per apiserver call; the apiserver's own request timeout is 60 s, but a call slower
than 10 s means trouble and a caller is better off retrying."""

_DEFAULT_KUBECONFIG = "~/.kube/config"

_NO_ANSWER = (aiohttp.ClientError, TimeoutError, OSError)


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """A complete list: the objects as dicts and the resourceVersion to watch from."""

    resource_version: str
    items: tuple[dict[str, Any], ...]


class KubeClient:
    """The kubernetes_asyncio APIs plus timeout-bounded wrappers that raise ``KubeError``s."""

    __slots__ = ("api_client", "coordination", "core", "timeout")

    def __init__(self, api_client: ApiClient, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.api_client = api_client
        self.core = CoreV1Api(api_client)
        self.coordination = CoordinationV1Api(api_client)
        self.timeout = timeout

    async def call(
        self, fn: ApiCall, *args: Any, request_timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Call a kubernetes_asyncio API method and return its model result.

        Raises a ``KubeError`` subclass for an error answer and ``KubeUnavailable`` when no
        answer came within ``request_timeout`` (default ``self.timeout``) seconds.
        """
        op = _name(fn)
        timeout = self.timeout if request_timeout is None else request_timeout
        try:
            return await fn(*args, _request_timeout=timeout, **kwargs)
        except ApiException as exc:
            raise kube_error(op, exc.status or 0, exc.body, exc.headers) from exc
        except _NO_ANSWER as exc:
            raise transport_error(op, exc) from exc

    async def call_raw(
        self, fn: ApiCall, *args: Any, request_timeout: float | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Like ``call`` but returns the JSON answer as a dict, decoded with orjson.

        Also the way around kubernetes_asyncio model bugs, since no model is built.
        """
        op = _name(fn)
        timeout = self.timeout if request_timeout is None else request_timeout
        try:
            response = await fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            async with response:
                body = await response.read()
        except ApiException as exc:
            raise kube_error(op, exc.status or 0, exc.body, exc.headers) from exc
        except _NO_ANSWER as exc:
            raise transport_error(op, exc) from exc
        if not 200 <= response.status < 300:
            raise kube_error(op, response.status, body, response.headers)
        try:
            return _object(body)
        except orjson.JSONDecodeError as exc:
            raise KubeError(
                f"{op}: the apiserver answered {response.status} with non-JSON"
            ) from exc

    async def list_objects(
        self, fn: ApiCall, *args: Any, page_size: int = 500, **kwargs: Any
    ) -> Listing:
        """List every object in pages of ``page_size`` and return them with the list's RV.

        Raises ``KubeExpired`` when a continue token expired mid-list; list again.
        """
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self.call_raw(fn, *args, limit=page_size, _continue=token, **kwargs)
            items.extend(page.get("items") or ())
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                return Listing(
                    resource_version=str(metadata.get("resourceVersion", "")), items=tuple(items)
                )

    def watch(
        self,
        fn: ApiCall,
        *args: Any,
        resource_version: str,
        timeout_seconds: int = 290,
        backoff: Backoff | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[WatchEvent]:
        """Watch from ``resource_version`` with bookmarks; yields ``WatchEvent``s forever.

        ``fn`` is a list method (``core.list_pod_for_all_namespaces``); selectors go in
        ``kwargs``. When the server ends the stream (every ``timeout_seconds``) or the
        connection drops, the watch resumes from the last resourceVersion seen, bookmarks
        included, backing off when streams keep ending empty. Raises ``KubeExpired`` when
        the resourceVersion is too old (relist, then watch again) and other ``KubeError``s
        when the watch cannot be opened. Close it promptly with ``contextlib.aclosing``.
        """
        backoff = backoff or Backoff(initial=0.2, maximum=5.0)
        watch_kwargs = {**kwargs, "watch": True, "allow_watch_bookmarks": True}
        watch_kwargs["timeout_seconds"] = timeout_seconds
        # The server ends the stream after timeout_seconds; reading longer than that with no
        # byte (not even a bookmark) means the connection is dead.
        read_timeout = timeout_seconds + 30.0

        def open_stream(version: str) -> Awaitable[aiohttp.ClientResponse]:
            options = {**watch_kwargs, "resource_version": version}
            return self._open_stream(fn, args, options, read_timeout)

        return watch_events(
            open_stream, op=_name(fn), resource_version=resource_version, backoff=backoff
        )

    async def _open_stream(
        self, fn: ApiCall, args: tuple[Any, ...], kwargs: Mapping[str, Any], read_timeout: float
    ) -> aiohttp.ClientResponse:
        op = _name(fn)
        timeout = aiohttp.ClientTimeout(sock_connect=self.timeout, sock_read=read_timeout)
        try:
            response: aiohttp.ClientResponse = await fn(
                *args, _preload_content=False, _request_timeout=timeout, **kwargs
            )
            if response.status == 200:
                return response
            async with response:
                body = await response.read()
        except ApiException as exc:
            raise kube_error(op, exc.status or 0, exc.body, exc.headers) from exc
        except _NO_ANSWER as exc:
            raise transport_error(op, exc) from exc
        raise kube_error(op, response.status, body, response.headers)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str,
        node: str,
        annotations: Mapping[str, str],
    ) -> None:
        """Bind pod ``namespace/name`` (only if its uid is ``uid``) to ``node``, merging
        ``annotations`` into the pod in the same update.

        Raises ``KubeConflict`` when the pod is already bound (its ``kube_message`` says to
        which node: "already assigned to node ..."), ``KubeNotFound`` when the pod is gone.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": dict(annotations),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        # kubernetes-asyncio 36 builds a V1Binding model from the 201 Status reply and
        # raises "Invalid value for `target`" on success; the raw call never builds it.
        await self.call_raw(self.core.create_namespaced_pod_binding, name, namespace, body)


@asynccontextmanager
async def kube_client(
    settings: Settings, *, timeout: float = DEFAULT_TIMEOUT, user_agent: str | None = None
) -> AsyncIterator[KubeClient]:
    """Open a ``KubeClient`` for the apiserver ``settings`` point at; closes it on exit.

    Order: ``RGPU_KUBE_URL``; else in-cluster (``KUBERNETES_SERVICE_HOST`` set); else the
    kubeconfig at ``KUBECONFIG`` or ``~/.kube/config``. Raises ``SettingsError`` naming
    what was tried when none works. The User-Agent is ``rgpu-<service>`` unless ``user_agent``
    says otherwise: the simulated cluster takes a service's for its account, so a tool that
    borrows a service's settings (the CLI) names itself to act as its kubeconfig's user.
    """
    configuration = await _configuration(settings)
    api_client = ApiClient(configuration)
    _ignore_proxy_environment(api_client)
    api_client.user_agent = user_agent or f"rgpu-{settings.service}"
    trace_requests(api_client)
    try:
        yield KubeClient(api_client, timeout=timeout)
    finally:
        await api_client.close()


_READ_BUFFER_BYTES = 2**21
"""kubernetes-asyncio's own read buffer: a watch event can carry an object up to etcd's
1.5 MiB request limit."""


def _ignore_proxy_environment(api_client: ApiClient) -> None:
    """Give the client a session that does not read proxy variables and ``~/.netrc``.

    kubernetes-asyncio opens its aiohttp session with ``trust_env=True``, and aiohttp then
    looks up proxies and netrc credentials in a worker thread on *every* request: a thread hop
    per apiserver call that cost the allocator 13-22 % of its CPU under load. The apiserver is
    reached directly (in-cluster) or through the kubeconfig's ``proxy-url``, which
    kubernetes-asyncio passes per request and which still applies.
    """
    rest = api_client.rest_client
    trusting = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=trusting.connector, trust_env=False, read_bufsize=_READ_BUFFER_BYTES
    )
    # The new session owns the connector now; the old one is closed without closing it.
    trusting.detach()


async def _configuration(settings: Settings) -> Configuration:
    kube = settings.kube
    configuration = Configuration()
    if kube.url is not None:
        configuration.host = kube.url
        return configuration
    if kube.service_host and kube.service_port:
        return _in_cluster(configuration, kube.service_host, kube.service_port)
    path = kube.kubeconfig or _DEFAULT_KUBECONFIG
    try:
        await load_kube_config(
            config_file=path, client_configuration=configuration, persist_config=False
        )
    except Exception as exc:
        # kubeconfig loading raises ConfigException, OSError, YAML and key errors alike;
        # any of them means the same thing here: there is no usable apiserver address.
        raise SettingsError(
            f"no Kubernetes API configured: RGPU_KUBE_URL is unset, KUBERNETES_SERVICE_HOST "
            f"is unset (not in a cluster), and kubeconfig {path!r} is unusable ({exc}); "
            "set RGPU_KUBE_URL or KUBECONFIG"
        ) from exc
    return configuration


def _in_cluster(configuration: Configuration, host: str, port: str) -> Configuration:
    environ = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    try:
        load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration, environ=environ
        )
    except Exception as exc:
        raise SettingsError(
            f"KUBERNETES_SERVICE_HOST={host!r} says in-cluster, but the service account "
            f"is unusable ({exc}); mount the token or set RGPU_KUBE_URL"
        ) from exc
    return configuration


def _name(fn: ApiCall) -> str:
    return getattr(fn, "__name__", "kubernetes call")


def _object(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    parsed = orjson.loads(body)
    return parsed if isinstance(parsed, dict) else {"items": parsed}
