from __future__ import annotations

import pytest

from rgpu_contracts import ErrorBody
from rgpu_runtime import errors
from rgpu_runtime.errors import (
    BadRequest,
    Conflict,
    KubeConflict,
    KubeError,
    KubeExpired,
    KubeUnavailable,
    NotFound,
    PayloadTooLarge,
    RgpuError,
    Unavailable,
    UpstreamError,
)


@pytest.mark.parametrize(
    ("cls", "status", "code", "retryable"),
    [
        (BadRequest, 400, "bad_request", False),
        (NotFound, 404, "not_found", False),
        (Conflict, 409, "conflict", False),
        (PayloadTooLarge, 413, "payload_too_large", False),
        (Unavailable, 503, "unavailable", True),
        (UpstreamError, 502, "upstream_error", False),
        (KubeUnavailable, 503, "kube_unavailable", True),
        (KubeConflict, 409, "kube_conflict", False),
    ],
)
def test_each_error_carries_its_status_code_and_retryability(
    cls: type[RgpuError], status: int, code: str, retryable: bool
) -> None:
    error = cls("what happened")
    assert (error.status_code, error.code, error.retryable) == (status, code, retryable)
    assert error.to_body() == ErrorBody(code=code, message="what happened", retryable=retryable)


def test_an_instance_may_override_code_and_retryable() -> None:
    error = Conflict("claim taken", code="claim_taken", retryable=True)
    assert error.to_body() == ErrorBody(code="claim_taken", message="claim taken", retryable=True)


def test_upstream_error_follows_the_peer_body_retryability() -> None:
    body = ErrorBody(code="busy", message="try later", retryable=True)
    assert UpstreamError("peer failed", peer_status=409, peer_body=body).retryable


def test_every_public_error_derives_from_rgpu_error() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), RgpuError)


def test_kube_errors_keep_the_apiserver_status_reason_and_message() -> None:
    error = KubeExpired("op: 410", kube_status=410, kube_reason="Expired", kube_message="too old")
    assert isinstance(error, KubeError)
    assert (error.kube_status, error.kube_reason, error.kube_message) == (410, "Expired", "too old")


def test_every_error_class_documents_when_it_is_raised() -> None:
    for name in errors.__all__:
        assert getattr(errors, name).__doc__, name


def test_module_docstring_draws_every_class_of_the_tree() -> None:
    assert errors.__doc__ is not None
    for name in errors.__all__:
        assert name in errors.__doc__, name
