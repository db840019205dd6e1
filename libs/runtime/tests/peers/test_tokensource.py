"""Callers send the current token: the projected file as the kubelet rotates it, or a minted one."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rgpu_runtime.errors import SettingsError, Unavailable
from rgpu_runtime.peers import ALLOCATOR_AUDIENCE, BearerAuth, TokenRequestSource, bearer_auth
from rgpu_runtime.peers._tokensource import FileTokenSource
from rgpu_runtime.settings import Settings

pytestmark = pytest.mark.anyio


@dataclass
class FakeClock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def rotate(path: Path, token: str) -> None:
    # The kubelet swaps projected files atomically (a rename), so the inode changes.
    staged = path.with_suffix(".new")
    staged.write_text(token)
    os.replace(staged, path)


async def test_the_file_source_rereads_the_token_after_rotation_once_the_recheck_is_due(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    clock = FakeClock()
    source = FileTokenSource(str(path), recheck_seconds=10, clock=clock)
    assert await source.token() == "first"
    rotate(path, "second")
    clock.now += 5
    assert await source.token() == "first"
    clock.now += 5
    assert await source.token() == "second"


async def test_a_missing_token_file_is_unavailable_naming_the_path_and_setting(
    tmp_path: Path,
) -> None:
    source = FileTokenSource(str(tmp_path / "absent"))
    with pytest.raises(Unavailable) as caught:
        await source.token()
    assert str(tmp_path / "absent") in caught.value.message
    assert "RGPU_TOKEN_DIR" in caught.value.message


async def test_an_empty_token_file_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  \n")
    with pytest.raises(Unavailable, match="empty or oversized"):
        await FileTokenSource(str(path)).token()


async def test_bearer_auth_attaches_the_current_token_to_each_request(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc")
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(200)

    auth = BearerAuth(FileTokenSource(str(path)))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), auth=auth) as client:
        await client.get("http://peer/v1/x")
    assert seen == ["Bearer abc"]


def test_bearer_auth_reads_the_token_of_the_audience_it_calls() -> None:
    off = Settings.from_env({"RGPU_AUTH": "none"}, service="extender")
    assert bearer_auth(off, audience=ALLOCATOR_AUDIENCE) is None
    settings = Settings.from_env({"RGPU_TOKEN_DIR": "/t"}, service="extender")
    by_file = bearer_auth(settings, audience=ALLOCATOR_AUDIENCE)
    assert isinstance(by_file, BearerAuth)
    assert isinstance(by_file.source, FileTokenSource)
    assert by_file.source.path == "/t/rgpu-allocator"
    minted = Settings.from_env({"RGPU_TOKEN_ACCOUNT": "rgpu-extender"}, service="extender")
    with pytest.raises(SettingsError, match="RGPU_TOKEN_ACCOUNT='rgpu-extender'"):
        bearer_auth(minted, audience=ALLOCATOR_AUDIENCE)


async def test_minted_tokens_are_reused_until_renewal_and_then_replaced() -> None:
    kubesim = pytest.importorskip("rgpu_kubesim")
    from rgpu_runtime.kube import kube_client

    async with kubesim.run_apiserver() as sim:
        sim.store.create("namespaces", {"metadata": {"name": "rgpu-system"}})
        account = {"metadata": {"name": "rgpu-extender", "namespace": "rgpu-system"}}
        sim.store.create("serviceaccounts", account)
        settings = Settings.from_env({"RGPU_KUBE_URL": sim.url}, service="extender")
        async with kube_client(settings, timeout=2.0) as kube:
            clock = FakeClock()
            source = TokenRequestSource(
                kube,
                namespace="rgpu-system",
                account="rgpu-extender",
                audience=ALLOCATOR_AUDIENCE,
                seconds=1000,
                clock=clock,
            )
            first = await source.token()
            clock.now += 799
            assert await source.token() == first
            clock.now += 1
            assert await source.token() != first
            missing = TokenRequestSource(
                kube, namespace="rgpu-system", account="nobody", audience=ALLOCATOR_AUDIENCE
            )
            with pytest.raises(Unavailable, match="RGPU_TOKEN_ACCOUNT"):
                await missing.token()
