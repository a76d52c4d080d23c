"""A throwaway certificate authority for TLS and mTLS tests, made at test time.

Nothing is checked in: each test run makes its own CA, a server certificate
for 127.0.0.1, and client certificates whose node name is in the CN, in a DNS
subject-alternative name, or both.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Pair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    path.parent.mkdir(parents=True, exist_ok=True)
    c, k = path.with_suffix(".crt"), path.with_suffix(".key")
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    k.chmod(0o600)
    return Pair(c, k)


class TestCA:
    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "gpufleet test CA") -> None:
        self.dir = directory
        self.key = _key()
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = directory / f"{name.replace(' ', '-')}.crt"
        directory.mkdir(parents=True, exist_ok=True)
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _issue(self, file: str, cn: str, sans: list[x509.GeneralName], usage: x509.ObjectIdentifier) -> Pair:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return _write(self.dir / file, builder.sign(self.key, hashes.SHA256()), key)

    def server(self) -> Pair:
        """For 127.0.0.1 and localhost."""
        return self._issue(
            "server",
            "127.0.0.1",
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
            ExtendedKeyUsageOID.SERVER_AUTH,
        )

    def client(self, cn: str, dns: list[str] | None = None) -> Pair:
        """A client certificate: the node name in the CN, and optionally in DNS names."""
        return self._issue(
            f"client-{cn}", cn, [x509.DNSName(d) for d in dns or []], ExtendedKeyUsageOID.CLIENT_AUTH
        )
