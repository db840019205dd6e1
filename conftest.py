"""Fixtures every member's tests share: the shared wire fixtures, anyio on asyncio, clean env."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme
from hypothesis import HealthCheck, settings

SHARED_FIXTURES = Path(__file__).resolve().parent / "fixtures"
_TRUST_STASH = pytest.StashKey[Path]()
HYPOTHESIS_PROFILE_ENV = "RGPU_HYPOTHESIS_PROFILE"
# Neither profile judges speed (speed is measured in bench/): a loaded machine must not turn
# slow input generation or a slow example into a failure.
_UNTIMED = settings(deadline=None, suppress_health_check=(HealthCheck.too_slow,))
HYPOTHESIS_PROFILES = {
    # make test: Hypothesis' own example counts.
    "full": _UNTIMED,
    # make test-fast: the same properties on a tenth of the examples, for the edit-test loop.
    "quick": settings(_UNTIMED, max_examples=10),
}


def _load_hypothesis_profile() -> None:
    """Chosen at import, before any test module applies ``@settings`` to its properties."""
    chosen = os.environ.get(HYPOTHESIS_PROFILE_ENV, "full")
    if chosen not in HYPOTHESIS_PROFILES:
        raise pytest.UsageError(
            f"{HYPOTHESIS_PROFILE_ENV}={chosen!r}: expected one of {', '.join(HYPOTHESIS_PROFILES)}"
        )
    for name, profile in HYPOTHESIS_PROFILES.items():
        settings.register_profile(name, profile)
    settings.load_profile(chosen)


_load_hypothesis_profile()


def pytest_configure(config: pytest.Config) -> None:
    """Point OpenSSL's default trust store at one throwaway CA for the whole run.

    Every TLS peer in the suite is a loopback server with its own CA, which tests pass
    explicitly, yet each HTTP or Kubernetes client still builds a default context that parses
    the system's ~140 certificates: 50-100 ms a client, paid hundreds of times per run. A
    one-certificate bundle makes that microseconds and changes no verification a test makes
    (nothing here may trust a public CA: there is no network).
    """
    trust_dir = Path(tempfile.mkdtemp(prefix="rgpu-trust-"))
    bundle = trust_dir / "bundle.pem"
    trustme.CA(organization_name="rgpu tests: trusted by nothing").cert_pem.write_to_path(bundle)
    os.environ["SSL_CERT_FILE"] = str(bundle)
    os.environ["SSL_CERT_DIR"] = str(trust_dir)
    config.stash[_TRUST_STASH] = trust_dir


def pytest_unconfigure(config: pytest.Config) -> None:
    trust_dir = config.stash.get(_TRUST_STASH, None)
    if trust_dir is not None:
        shutil.rmtree(trust_dir, ignore_errors=True)


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
