"""Throwaway certificate authorities and certificates for the TLS tests (real X.509, real keys)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Authority:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    pem: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def authority(directory: Path, name: str) -> Authority:
    """A self-signed CA whose PEM is ``directory/<name>-ca.pem``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = directory / f"{name}-ca.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(name, key, cert, pem)


def issue(directory: Path, ca: Authority, name: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
          *, key_apart: bool = False) -> tuple[Path, Path | None]:
    """A certificate ``ca`` signed for ``hosts`` (IP addresses or DNS names), usable by a server and
    a client. Returns (chain PEM, key PEM): the key is inside the chain file unless ``key_apart``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                              x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    chain = directory / f"{name}.pem"
    if key_apart:
        key_path = directory / f"{name}.key"
        key_path.write_bytes(key_pem)
        chain.write_bytes(cert_pem)
        return chain, key_path
    chain.write_bytes(cert_pem + key_pem)
    return chain, None
