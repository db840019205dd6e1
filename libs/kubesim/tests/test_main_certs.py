"""Certificates for the webhook: files, permissions, and a real TLS handshake against them."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from rgpu_kubesim._lupine_errors import SimOptionError
from rgpu_kubesim.certs import CertFiles, write_certs

pytestmark = pytest.mark.anyio

WEBHOOK = "rgpu-extender.rgpu-system.svc"


@pytest.fixture
def files(tmp_path: Path) -> CertFiles:
    return write_certs(tmp_path / "tls", hosts=["127.0.0.1"], dns_names=[WEBHOOK])


async def handshake(files: CertFiles, server_hostname: str) -> None:
    """Serve TLS with the written cert and connect trusting only the written CA."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files.cert, files.key)
    client_ctx = ssl.create_default_context(cafile=str(files.ca))

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=server_ctx)
    async with server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname=server_hostname
        )
        assert await reader.read() == b"ok"
        writer.close()
        await writer.wait_closed()


def test_writes_ca_cert_and_private_key_only_the_owner_can_read(files: CertFiles) -> None:
    assert [p.name for p in (files.ca, files.cert, files.key)] == ["ca.pem", "tls.crt", "tls.key"]
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert files.key.read_bytes().startswith(b"-----BEGIN ")
    assert base64.b64decode(files.ca_bundle()) == files.ca.read_bytes()


def test_certificate_names_the_given_ips_and_dns_names_and_expires_in_a_year(
    files: CertFiles,
) -> None:
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert names.get_values_for_type(x509.DNSName) == [WEBHOOK]
    remaining = cert.not_valid_after_utc - datetime.now(UTC)
    assert timedelta(days=364) < remaining <= timedelta(days=365)


@pytest.mark.parametrize("name", ["127.0.0.1", WEBHOOK])
async def test_tls_handshake_succeeds_for_each_certified_name(files: CertFiles, name: str) -> None:
    await handshake(files, name)


async def test_tls_handshake_fails_for_a_name_not_in_the_certificate(files: CertFiles) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(files, "other.example")


def test_rewriting_replaces_the_files_with_a_new_ca(files: CertFiles) -> None:
    before = files.ca.read_bytes()
    again = write_certs(files.ca.parent, hosts=["127.0.0.1"])
    assert again.ca.read_bytes() != before


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hosts": ["localhost"]}, "host"),
        ({"hosts": [], "dns_names": []}, "host"),
        ({"dns_names": ["Bad_Name"]}, "dns"),
        ({"valid_days": 0}, "valid_days"),
    ],
)
def test_bad_certificate_arguments_name_the_field(
    tmp_path: Path, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(SimOptionError) as caught:
        write_certs(tmp_path, **kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_unwritable_directory_is_reported_as_the_out_option(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SimOptionError) as caught:
        write_certs(blocker / "tls")
    assert caught.value.field == "out"
    assert str(blocker) in str(caught.value)
