"""The extender's admission webhook must serve TLS that the simulated
apiserver (and a real one, in the demo's manifests) trusts through ``caBundle``. This writes a
throwaway CA and a serving certificate for the given IPs and DNS names, in the file names a
``kubernetes.io/tls`` Secret uses, so tests and the demo need no openssl; and, from the same CA,
kube-scheduler's client certificate, which the extender's scheduler listener requires.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import trustme

from rgpu_kubesim._lupine_errors import SimOptionError

__all__ = [
    "CA_FILE",
    "CERT_FILE",
    "CLIENT_CERT_FILE",
    "CLIENT_KEY_FILE",
    "KEY_FILE",
    "SCHEDULER_IDENTITY",
    "CertFiles",
    "write_certs",
]

CA_FILE: Final = "ca.pem"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
CLIENT_CERT_FILE: Final = "client.crt"
CLIENT_KEY_FILE: Final = "client.key"
SCHEDULER_IDENTITY: Final = "system:serviceaccount:rgpu-system:rgpu-scheduler"
"""The client certificate's subject, as the cert-manager component names it."""

# Wildcards allowed in the first label only, as in a certificate's subjectAltName.
_DNS_NAME: Final = re.compile(
    r"^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CertFiles:
    """Where the CA, the serving certificate and its private key, and kube-scheduler's client
    certificate and key were written."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def ca_bundle(self) -> str:
        """The CA in base64, as a webhook configuration's ``clientConfig.caBundle`` wants it."""
        return base64.b64encode(self.ca.read_bytes()).decode("ascii")


def write_certs(
    out_dir: str | os.PathLike[str],
    *,
    hosts: Sequence[str] = ("127.0.0.1",),
    dns_names: Sequence[str] = (),
    valid_days: int = 365,
) -> CertFiles:
    """Create ``ca.pem``, ``tls.crt`` and ``tls.key`` (mode 0600) in ``out_dir``, and
    ``client.crt``/``client.key`` (0600): kube-scheduler's client certificate from the same CA.

    ``hosts`` are IP addresses and ``dns_names`` DNS names (``*.`` allowed first) the
    certificate is valid for. Existing files are replaced. Raises ``SimOptionError`` naming
    ``host``, ``dns``, ``valid_days`` or ``out`` when an argument or the directory is unusable.
    """
    identities = _identities(hosts, dns_names)
    if valid_days < 1:
        raise SimOptionError("valid_days", f"must be >= 1, got {valid_days}")
    now = datetime.now(UTC).replace(tzinfo=None)
    ca = trustme.CA(organization_name="rgpu kubesim")
    leaf = ca.issue_cert(
        *identities,
        organization_name="rgpu kubesim",
        not_before=now - timedelta(hours=1),
        not_after=now + timedelta(days=valid_days),
    )
    client = ca.issue_cert(
        "rgpu-scheduler.rgpu-system.svc",
        common_name=SCHEDULER_IDENTITY,
        organization_name="rgpu kubesim",
        not_before=now - timedelta(hours=1),
        not_after=now + timedelta(days=valid_days),
    )
    files = _paths(Path(out_dir))
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    _write(files.ca, ca.cert_pem.bytes(), mode=0o644)
    _write(files.cert, chain, mode=0o644)
    _write(files.key, leaf.private_key_pem.bytes(), mode=0o600)
    _write(files.client_cert, client.cert_chain_pems[0].bytes(), mode=0o644)
    _write(files.client_key, client.private_key_pem.bytes(), mode=0o600)
    return files


def _identities(hosts: Sequence[str], dns_names: Sequence[str]) -> list[str]:
    for host in hosts:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise SimOptionError(
                "host", f"{host!r} is not an IP address; put names in dns"
            ) from None
    for name in dns_names:
        if len(name) > 253 or not _DNS_NAME.match(name):
            raise SimOptionError("dns", f"{name!r} is not a lower-case DNS name")
    if not hosts and not dns_names:
        raise SimOptionError("host", "give at least one IP address or DNS name")
    return [*hosts, *dns_names]


def _paths(out: Path) -> CertFiles:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimOptionError("out", f"cannot create {out}: {exc.strerror or exc}") from exc
    return CertFiles(
        ca=out / CA_FILE,
        cert=out / CERT_FILE,
        key=out / KEY_FILE,
        client_cert=out / CLIENT_CERT_FILE,
        client_key=out / CLIENT_KEY_FILE,
    )


def _write(path: Path, data: bytes, *, mode: int) -> None:
    # Created with the final mode, so a private key is never readable by others, not even briefly.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(path, mode)
    except OSError as exc:
        raise SimOptionError("out", f"cannot write {path}: {exc.strerror or exc}") from exc
