"""Signing and verifying the service-account tokens the simulated apiserver issues.

Tokens are JWT-shaped (header.claims.signature, base64url) with the claims kube-apiserver puts
in a projected token, so services parse them as they would in a cluster. They are signed with
HMAC-SHA256 under a key drawn per server: a test client cannot forge one, and a token from one
simulated cluster is worthless against another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Any

import orjson

ISSUER = "https://kubernetes.default.svc.cluster.local"
_HEADER = {"alg": "HS256", "typ": "JWT"}


class TokenError(Exception):
    """A token that is not one of ours: malformed, or its signature does not verify."""


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _decode(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError) as exc:
        raise TokenError("square/go-jose: illegal base64 data in a token segment") from exc


class TokenSigner:
    """Signs claims into a token and verifies a token back into its claims."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        self._kid = _encode(hashlib.sha256(self._key).digest()[:12])

    def sign(self, claims: Mapping[str, Any]) -> str:
        header = _encode(orjson.dumps({**_HEADER, "kid": self._kid}))
        body = _encode(orjson.dumps(dict(claims)))
        return f"{header}.{body}.{self._signature(f'{header}.{body}')}"

    def verify(self, token: str) -> dict[str, Any]:
        """The claims of ``token``; TokenError if it is malformed or not signed by this key."""
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenError("square/go-jose: compact JWS format must have three parts")
        header, body, signature = parts
        if not hmac.compare_digest(self._signature(f"{header}.{body}"), signature):
            raise TokenError("square/go-jose: error in cryptographic primitive")
        try:
            claims = orjson.loads(_decode(body))
        except orjson.JSONDecodeError as exc:
            raise TokenError("square/go-jose: the token claims are not JSON") from exc
        if not isinstance(claims, dict):
            raise TokenError("square/go-jose: the token claims are not a JSON object")
        return claims

    def _signature(self, signed: str) -> str:
        return _encode(hmac.new(self._key, signed.encode(), hashlib.sha256).digest())
