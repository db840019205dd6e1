"""The allocator, the extender and metrics each mirror a peer's long-polled value (the fleet,
the topology, the claims) for as long as they run, and must do it the same way.

A ``Follower`` keeps a ``Mirror`` current: it asks the feed's path at once, then
``?since=R&wait=S`` with the revision ``R`` of the last value it took. When the feed has
updates (``FLEET_FEED``, ``CLAIMS_FEED``), it also sends ``delta=1`` and applies what changed
to the value it holds, so one server changing costs each follower the decoding of that
server, not of the fleet. It obeys these rules, in one place:

* **Changed**: an answer with a new revision goes to the mirror at once, and the next
  call follows at once, so a burst of changes is not delayed — unless the policy sets
  ``coalesce_seconds``: a follower that does not decide on the value (metrics) then asks
  again only that long after a change, so a burst costs it one delta per pause instead of
  one round trip per change.
* **Unchanged** (the same revision, a ``304``, or a body byte-for-byte equal to the last):
  nothing is re-applied, and the next call starts no sooner than ``min_interval_seconds``
  after this one started. A held poll is long past that, so only a peer that answers at
  once without waiting (an old build, a replica behind) is slowed, to ten calls a second.
* **Failed** (``Unavailable``: unreachable, timeout, 429, 5xx; ``UpstreamError``: another
  status, or a body that is not the contract): the last value stays, ``status`` says why,
  the first failure of a run is logged, and the next call waits a capped, jittered backoff
  and then asks without holding (``wait=0`` with updates, else without ``since``), so a
  recovered (or restarted) peer is taken within one round trip instead of one full hold.
* **Never backwards**: an answer whose revision is lower than the one held (a replica
  behind, reached through the Service after a restart or a rollout), or a ``behind``
  update, is not taken: the value stays and the next call asks with the same ``since``,
  which a current peer holds until it has caught up. Revisions are comparable across
  replicas (they derive from the apiserver's), so this holds whichever replica answers. Only
  a peer that stays below for ``behind_limit_seconds`` is believed: its revisions restarted
  (a restored apiserver, a new cluster), and keeping a value it will never confirm would
  freeze the follower for good; that is logged as a warning.
* **Resync**: a delta from another revision than the one held cannot be applied; the next
  call asks for the whole value.
* **Started** is reported through ``task_status.started()`` after the first successful
  answer, and only then; ``status.answered`` is set at the same moment, for a lifespan that
  must serve before its peer answers (it starts the follower with ``start_soon``), and
  ``status.asked`` when the first call ended either way.

No httpx, aiohttp or socket exception leaves this module: they become ``Unavailable`` or
``UpstreamError`` (``raise ... from``), and ``run`` keeps them in ``status``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Final, Generic, NoReturn, TypeVar

import aiohttp
import anyio
import anyio.lowlevel
import httpx
import orjson
from anyio.abc import TaskStatus

from rgpu_contracts import ContractError, UpdateKind
from rgpu_runtime.errors import Unavailable, UpstreamError
from rgpu_runtime.pacing import Backoff
from rgpu_runtime.peers import response_error, upstream_error

from ._feed import Revisioned, Update
from ._mirror import FollowStatus, Mirror
from ._versioned import Versioned

__all__ = ["FollowPolicy", "Follower"]

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=Revisioned)
V = TypeVar("V")
W = TypeVar("W")

THREAD_MIN_BYTES: Final = 64 * 1024
"""Bodies at least this large are decoded in a worker thread (a 10,000-card fleet takes
~100 ms; the event loop still gets the GIL every few milliseconds, so other requests are
slowed, not stalled); a delta of a few servers decodes faster than a thread hop."""

# httpx_aiohttp maps most aiohttp failures to httpx ones, but not all; sockets raise OSError.
_CALL_ERRORS = (httpx.HTTPError, aiohttp.ClientError, OSError)


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowPolicy:
    """How a follower paces its calls; one policy per service, the rules above are fixed."""

    wait_seconds: float = 30.0
    """How long the peer may hold a long-poll; changes arrive at once, this bounds idle polls.
    Kept below the peers' 60 s limit and proxies' idle timeouts."""
    margin_seconds: float = 5.0
    """Extra seconds a call may take beyond ``wait_seconds`` before it counts as failed: a
    10,000-card fleet is a few MB of JSON, and a GC pause must not mark a peer down."""
    min_interval_seconds: float = 0.1
    """Least time between the starts of two calls after an unchanged answer, so a peer that
    ignores ``wait`` costs at most ten calls a second."""
    coalesce_seconds: float = 0.0
    """Pause after a changed answer before the next call, so the changes of a burst arrive
    together in one delta; 0 (deciders: the allocator, the extender) follows at once."""
    backoff_initial_seconds: float = 0.2
    """First retry delay after a failure; most failures are blips, a restarting peer is
    usually back within a second."""
    backoff_cap_seconds: float = 5.0
    """Longest retry delay: a recovered peer is followed again within 5 s, fresh enough for
    the allocator's decisions and well within a Prometheus scrape interval."""

    behind_limit_seconds: float = 90.0
    """How long a peer may answer only revisions below the one held before they are
    believed: three long-poll holds, far beyond how long a replica lags the apiserver (ms),
    so only a peer whose revisions restarted lower gets here."""

    def backoff(self) -> Backoff:
        """The retry delays after failures."""
        return Backoff(initial=self.backoff_initial_seconds, maximum=self.backoff_cap_seconds)


class Follower(Generic[T]):
    """Long-poll one peer's feed forever, keeping ``mirror`` at the latest value it answered.

    ``http`` is the peer's client (its base URL and transport; tests inject the transport);
    the feed the mirror declares says where to ask and how to decode. ``clock`` and ``sleep``
    pace the calls (tests pass fakes).
    """

    __slots__ = (
        "_backoff",
        "_behind_since",
        "_clock",
        "_feed",
        "_http",
        "_last_body",
        "_policy",
        "_resync",
        "_rng",
        "_sleep",
        "mirror",
    )

    def __init__(
        self,
        http: httpx.AsyncClient,
        mirror: Mirror[T],
        *,
        policy: FollowPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self._http = http
        self._feed = mirror.feed
        self._policy = policy or FollowPolicy()
        self._backoff = self._policy.backoff()
        self._clock = clock
        self._sleep = sleep
        self._rng = random.Random()
        self._last_body = b""
        self._behind_since: float | None = None
        self._resync = False
        self.mirror = mirror

    @property
    def status(self) -> FollowStatus:
        """The mirror's record of the peer's health."""
        return self.mirror.status

    @property
    def latest(self) -> Versioned[T | None]:
        """The mirror's values, each in turn."""
        return self.mirror.latest

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> NoReturn:
        """Follow the peer until cancelled; reports started after its first answer."""
        while True:
            began = self._clock()
            try:
                changed = await self.poll_once()
            except (Unavailable, UpstreamError) as exc:
                self._failed(exc)
                await self._sleep(self._backoff.delay(self.status.failures - 1, self._rng))
                continue
            if not self.status.answered.is_set():
                self.status.answered.set()
                task_status.started()
            if changed and self._policy.coalesce_seconds > 0:
                await self._sleep(self._policy.coalesce_seconds)
            elif changed:
                # Let the tasks this answer woke (readiness, waiters on ``latest``) run before
                # the next call, as they would after a pause.
                await anyio.lowlevel.checkpoint()
            else:
                await self._sleep(
                    max(0.0, began + self._policy.min_interval_seconds - self._clock())
                )

    async def poll_once(self) -> bool:
        """One call: take the answer if it is new; returns whether it was.

        Raises ``Unavailable`` or ``UpstreamError``; ``run`` records those in ``status``.
        """
        since, wait = self._asking()
        body = await self._get(since, wait)
        # A quiet long-poll answers the same value again after each hold; decoding a large
        # fleet again costs ~100 ms for nothing.
        if body is None:
            changed = self._unchanged()
        elif body == self._last_body:
            self._resync = False  # exactly the whole value held: nothing to resync
            changed = self._unchanged()
        elif self._feed.updates is None:
            value = await self._off_loop(partial(self._read, self._feed.decode), body)
            changed = self._offered(value.revision, lambda: value, body)
        else:
            update = await self._off_loop(partial(self._read, self._feed.updates), body)
            changed = self._judged(update, body)
        self._succeeded()
        return changed

    def _asking(self) -> tuple[int | None, float]:
        """The ``since`` and ``wait`` of the next call."""
        held, policy = self.status.revision, self._policy
        if held is None or self._resync or self._reset_due():
            return None, 0.0
        if self.status.up:
            return held, policy.wait_seconds
        # After a failure, ask without holding: a recovered peer is taken in one round trip.
        return (held, 0.0) if self._feed.updates is not None else (None, 0.0)

    async def _get(self, since: int | None, wait: float) -> bytes | None:
        params = {} if since is None else {"since": str(since), "wait": f"{wait:g}"}
        if self._feed.updates is not None:
            params["delta"] = "1"
        deadline = self._policy.margin_seconds + wait
        peer = str(self._http.base_url.join(self._feed.path))
        try:
            with anyio.fail_after(deadline):
                response = await self._http.get(self._feed.path, params=params, timeout=deadline)
        except TimeoutError as exc:
            raise Unavailable(f"{peer} did not answer within {deadline:g} s; retry later") from exc
        except _CALL_ERRORS as exc:
            raise upstream_error(exc, peer=peer) from exc
        if response.status_code == httpx.codes.NOT_MODIFIED:
            return None
        if response.is_error:
            raise response_error(response, peer=peer)
        return response.content

    async def _off_loop(self, read: Callable[[bytes], V], body: bytes) -> V:
        """``read(body)``, in a worker thread when the body is large. Only decoding goes
        there: taking a value (callbacks, ``latest``) stays on the event loop."""
        if len(body) < THREAD_MIN_BYTES:
            return read(body)
        return await anyio.to_thread.run_sync(read, body)

    def _read(self, decode: Callable[[object], V], body: bytes) -> V:
        return self._contract(decode, self._json(body))

    def _judged(self, update: Update[T], body: bytes) -> bool:
        """Take an update answer, or say why not (behind, or a delta from elsewhere)."""
        if update.kind is UpdateKind.BEHIND:
            return self._behind(update.revision)
        if update.kind is UpdateKind.DELTA and update.since != self.status.revision:
            self._resync = True
            return self._unchanged()
        full = body if update.kind is UpdateKind.FULL else b""
        return self._offered(update.revision, lambda: self._applied(update), full)

    def _json(self, body: bytes) -> object:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(
                f"{self._peer()} answered a body that is not JSON: {exc}", peer_status=200
            ) from exc

    def _contract(self, decode: Callable[[W], V], raw: W) -> V:
        try:
            return decode(raw)
        except ContractError as exc:
            raise UpstreamError(
                f"{self._peer()} answered off-contract: {exc}", peer_status=200
            ) from exc

    def _applied(self, update: Update[T]) -> T:
        return self._contract(update.apply, self.latest.value)

    def _peer(self) -> str:
        return f"{self.status.name} {self._feed.path}"

    def _offered(self, revision: int, value: Callable[[], T], body: bytes) -> bool:
        """Take the value at ``revision`` unless it is not newer than the one held."""
        held = self.status.revision
        if held is not None and revision < held and not self._reset_due():
            return self._behind(revision)
        if held is not None and revision == held:
            return self._unchanged()
        if held is not None and revision < held:
            logger.warning(
                "%s stayed below revision %d for %g s; taking its revision %d",
                self.status.name,
                held,
                self._policy.behind_limit_seconds,
                revision,
            )
        self._take(value(), body)
        return True

    def _behind(self, revision: int) -> bool:
        if self._behind_since is None:
            self._behind_since = self._clock()
            logger.info(
                "%s answered revision %d, older than %d; keeping the latest",
                self.status.name,
                revision,
                self.status.revision,
            )
        return False

    def _reset_due(self) -> bool:
        began = self._behind_since
        return began is not None and self._clock() - began >= self._policy.behind_limit_seconds

    def _unchanged(self) -> bool:
        self._behind_since = None
        return False

    def _take(self, value: T, body: bytes) -> None:
        self._behind_since = None
        self._resync = False
        self._last_body = body
        self.mirror.took(value)

    def _succeeded(self) -> None:
        status = self.status
        if status.failures and status.last_error:
            logger.info("%s is back", status.name, extra={"source": status.name})
        status.up, status.last_error, status.failures = True, "", 0
        status.last_success = self._clock()
        self._report()

    def _failed(self, exc: Unavailable | UpstreamError) -> None:
        status = self.status
        if status.failures == 0:
            logger.warning(
                "%s failed, keeping its last value: %s",
                status.name,
                exc.message,
                extra={"source": status.name, "code": exc.code},
            )
        status.up, status.last_error = False, exc.message
        status.failures += 1
        self._report()

    def _report(self) -> None:
        self.mirror.called()
