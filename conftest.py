"""Fixtures every member's tests share: the shared wire fixtures, anyio on asyncio, clean env."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SHARED_FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def anyio_backend() -> str:
    # kubernetes-asyncio and aiohttp are asyncio-only.
    return "asyncio"


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    """Tests read settings from dicts; a leaked RGPU_* or OTEL_* variable must not change them."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(("RGPU_", "OTEL_")):
            del os.environ[key]
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.fail(
            f"wire fixtures not found at {SHARED_FIXTURES}; they live in the repo's fixtures/"
        )
    return SHARED_FIXTURES


@pytest.fixture(scope="session")
def load_fixture(shared_fixtures: Path) -> Callable[[str], object]:
    def load(relative: str) -> object:
        return json.loads((shared_fixtures / relative).read_text())

    return load
