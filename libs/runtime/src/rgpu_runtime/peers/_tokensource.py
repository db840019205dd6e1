"""A caller proves who it is with a short-lived ServiceAccount token it never stores.

Each token is for one audience, the receiving service's (``rgpu-allocator``,
``rgpu-discovery``), so a token is worthless at any other service. In a cluster the kubelet
projects one token per audience into ``RGPU_TOKEN_DIR/<audience>`` and replaces it before it
expires, so ``FileTokenSource`` re-reads the file when it changes (checked at most every few
seconds). The simulated cluster has no kubelet: ``TokenRequestSource`` mints tokens
through TokenRequest and renews them at 80% of their life, as the kubelet does. ``BearerAuth``
attaches whichever source's token to every request of an httpx client.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass
from typing import Protocol

import anyio
import httpx

from rgpu_runtime.errors import KubeError, SettingsError, Unavailable
from rgpu_runtime.kube import KubeClient
from rgpu_runtime.settings import Settings

__all__ = [
    "BearerAuth",
    "FileTokenSource",
    "TokenRequestSource",
    "TokenSource",
    "bearer_auth",
]

RECHECK_SECONDS = 10.0
"""How often the token file is stat()ed for a rotation; the kubelet rotates at 80% of a
token's life (an hour or more), so ten seconds is prompt and costs one syscall."""
RENEW_FRACTION = 0.8
"""Renew a minted token after this share of its life, as the kubelet does."""
MINTED_SECONDS = 3600
"""Lifetime asked of TokenRequest: the kubelet's default for projected tokens."""
MAX_TOKEN_BYTES = 16384


class TokenSource(Protocol):
    """Something that hands out the caller's current token."""

    async def token(self) -> str:
        """The token to send now; raises ``Unavailable`` when none can be had."""
        ...


@dataclass(frozen=True, slots=True)
class _FileState:
    identity: tuple[int, int, int]
    token: str


class FileTokenSource:
    """The projected token file, re-read when the kubelet replaces it."""

    def __init__(
        self,
        path: str,
        *,
        recheck_seconds: float = RECHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.recheck_seconds = recheck_seconds
        self._clock = clock
        self._state: _FileState | None = None
        self._checked = float("-inf")

    async def token(self) -> str:
        now = self._clock()
        if self._state is None or now - self._checked >= self.recheck_seconds:
            self._state = self._refresh(self._state)
            self._checked = now
        return self._state.token

    def _refresh(self, state: _FileState | None) -> _FileState:
        # A stat and a read of a 1 KiB file, at most every few seconds: cheaper on the
        # event loop than a worker-thread hop.
        try:
            info = os.stat(self.path)
            identity = (info.st_ino, info.st_mtime_ns, info.st_size)
            if state is not None and state.identity == identity:
                return state
            with open(self.path, "rb") as file:
                raw = file.read(MAX_TOKEN_BYTES + 1)
        except OSError as exc:
            raise self._unreadable(exc.strerror or str(exc)) from exc
        token = raw.decode("ascii", "replace").strip()
        if not token or len(raw) > MAX_TOKEN_BYTES:
            raise self._unreadable("empty or oversized")
        return _FileState(identity=identity, token=token)

    def _unreadable(self, why: str) -> Unavailable:
        return Unavailable(
            f"cannot read this service's token file {self.path} ({why}); project the "
            "ServiceAccount token for the service it calls there (file name = audience), or "
            "point RGPU_TOKEN_DIR at the directory holding it"
        )


class TokenRequestSource:
    """Tokens minted by TokenRequest for one account (the simulated cluster)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        account: str,
        audience: str,
        seconds: int = MINTED_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.namespace = namespace
        self.account = account
        self.audience = audience
        self.seconds = seconds
        self._kube = kube
        self._clock = clock
        self._lock = anyio.Lock()
        self._token = ""
        self._renew_at = float("-inf")

    async def token(self) -> str:
        async with self._lock:
            if self._clock() >= self._renew_at:
                self._token = await self._mint()
                self._renew_at = self._clock() + self.seconds * RENEW_FRACTION
            return self._token

    async def _mint(self) -> str:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [self.audience], "expirationSeconds": self.seconds},
        }
        create = self._kube.core.create_namespaced_service_account_token
        try:
            answer = await self._kube.call_raw(create, self.account, self.namespace, body)
        except KubeError as exc:
            raise Unavailable(
                f"cannot mint a token for {self.namespace}/{self.account} ({exc.message}); "
                "check that the account exists (RGPU_TOKEN_ACCOUNT)",
                retryable=exc.retryable,
            ) from exc
        token = (answer.get("status") or {}).get("token")
        if not isinstance(token, str) or not token:
            raise Unavailable(f"TokenRequest for {self.account} answered without a token")
        return token


class BearerAuth(httpx.Auth):
    """httpx auth that sends ``Authorization: Bearer <the source's current token>``."""

    def __init__(self, source: TokenSource) -> None:
        self.source = source

    def sync_auth_flow(
        self, request: httpx.Request
    ) -> Generator[httpx.Request, httpx.Response, None]:
        raise RuntimeError("BearerAuth needs an httpx.AsyncClient (token sources are async)")

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        request.headers["Authorization"] = f"Bearer {await self.source.token()}"
        yield request


def bearer_auth(
    settings: Settings, kube: KubeClient | None = None, *, audience: str
) -> BearerAuth | None:
    """The auth a client calling the service of ``audience`` should use; None when
    ``RGPU_AUTH=none``.

    With ``RGPU_TOKEN_ACCOUNT`` set (the simulated cluster) tokens are minted through
    ``kube``; otherwise the projected file ``RGPU_TOKEN_DIR/<audience>`` is read.
    """
    auth = settings.auth
    if auth.mode == "none":
        return None
    if auth.token_account is None:
        return BearerAuth(FileTokenSource(os.path.join(auth.token_dir, audience)))
    if kube is None:
        raise SettingsError(
            f"RGPU_TOKEN_ACCOUNT={auth.token_account!r} mints tokens through the Kubernetes API, "
            "but this service opened no Kubernetes client; unset RGPU_TOKEN_ACCOUNT to read "
            "RGPU_TOKEN_DIR instead"
        )
    namespace = settings.scheduling.namespace
    source = TokenRequestSource(
        kube, namespace=namespace, account=auth.token_account, audience=audience
    )
    return BearerAuth(source)
