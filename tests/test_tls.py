"""fusee.RouteTLS: what it accepts, what it refuses at open, and the contexts it builds."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

import fusee
from fusee.errors import InvalidRouteTLS
from fusee.tls import checked
from tests.tlscerts import authority, issue


def test_contexts_are_mutual_tls_1_2_or_newer(tmp_path: Path) -> None:
    ca = authority(tmp_path, "ns")
    cert, key = issue(tmp_path, ca, "owner", key_apart=True)
    tls = fusee.RouteTLS(cert=cert, key=key, ca=ca.pem)
    server, client = tls.server_context(), tls.client_context()
    assert server.verify_mode == ssl.CERT_REQUIRED  # a caller without a certificate is refused
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert not fusee.RouteTLS(cert=cert, key=key, ca=ca.pem, check_hostname=False).client_context().check_hostname


def test_a_key_inside_the_chain_file_needs_no_key_argument(tmp_path: Path) -> None:
    ca = authority(tmp_path, "ns")
    cert, _ = issue(tmp_path, ca, "owner")
    assert checked(fusee.RouteTLS(cert=str(cert), ca=str(ca.pem))) is not None


def test_a_file_that_cannot_be_loaded_is_named(tmp_path: Path) -> None:
    ca = authority(tmp_path, "ns")
    cert, key = issue(tmp_path, ca, "owner", key_apart=True)
    with pytest.raises(InvalidRouteTLS, match=r"missing\.pem"):
        checked(fusee.RouteTLS(cert=tmp_path / "missing.pem", key=key, ca=ca.pem))
    with pytest.raises(InvalidRouteTLS, match="certificate chain"):
        checked(fusee.RouteTLS(cert=cert, ca=ca.pem))  # the key is in neither file
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(InvalidRouteTLS, match=r"junk\.pem"):
        checked(fusee.RouteTLS(cert=cert, key=key, ca=tmp_path / "junk.pem"))


def test_wrong_types_are_refused() -> None:
    with pytest.raises(InvalidRouteTLS, match="cert="):
        fusee.RouteTLS(cert=3, ca="ca.pem")  # type: ignore[arg-type]
    with pytest.raises(InvalidRouteTLS, match="check_hostname"):
        fusee.RouteTLS(cert="c.pem", ca="ca.pem", check_hostname="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidRouteTLS, match=r"fusee\.RouteTLS"):
        checked({"cert": "c.pem"})
    assert issubclass(InvalidRouteTLS, ValueError)


async def test_a_directory_refuses_route_tls(tmp_path: Path) -> None:
    ca = authority(tmp_path, "ns")
    cert, _ = issue(tmp_path, ca, "owner")
    with pytest.raises(ValueError, match="route_tls= applies to a PostgreSQL DSN"):
        await fusee.Engine.open(tmp_path / "data", route_tls=fusee.RouteTLS(cert=cert, ca=ca.pem))
    assert not (tmp_path / "data").exists()  # nothing was opened
