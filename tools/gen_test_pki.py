"""Write the test certificate authorities under tests/fixtures/pki/ (checked in; test use only).

    python tools/gen_test_pki.py [--out tests/fixtures/pki]

The TLS and mTLS tests read these files (``testsupport.certs.TestCA``) instead of making keys at test
time, so every run uses the same certificates and the test helpers need no cryptography library.  Each
authority is a folder: ``ca.crt``/``ca.key``, a server certificate for 127.0.0.1 and localhost, and the
client certificates the tests ask for, by node name in the CN and optionally in DNS names.  They are
valid for a century from when they were written: a test never fails on a date.  A test that needs a
certificate not listed in :data:`AUTHORITIES` fails naming it; add it here and run this again.

These keys protect nothing: they are published with the tests, for loopback servers the tests start.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testsupport.certs import PKI_DIR, client_file

#: Folder (the name, spaces as dashes) -> (the authority's name, whether it issues a server certificate, its clients: (CN, DNS names)).
AUTHORITIES: dict[str, tuple[str, bool, tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "gpufleet-test-CA": (
        "gpufleet test CA",
        True,
        (("prometheus", ()), ("node-a", ()), ("client", ()), ("workstation-7", ("node-b",))),
    ),
    "other-CA": ("other CA", False, (("prometheus", ()),)),
    "untrusted-CA": ("untrusted CA", False, (("node-a", ()),)),
}

VALID = dt.timedelta(days=36_525)


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    (folder / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{stem}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _authority(name: str, now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    usage = x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _issue(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    cn: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    now: dt.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + VALID)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PKI_DIR)
    args = ap.parse_args()
    now = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    for folder_name, (name, server, clients) in AUTHORITIES.items():
        folder = args.out / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        ca, ca_key = _authority(name, now)
        _write(folder, "ca", ca, ca_key)
        if server:
            loopback = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            _write(
                folder,
                "server",
                *_issue(ca, ca_key, "127.0.0.1", loopback, ExtendedKeyUsageOID.SERVER_AUTH, now),
            )
        for cn, dns in clients:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            _write(
                folder,
                client_file(cn, dns),
                *_issue(ca, ca_key, cn, sans, ExtendedKeyUsageOID.CLIENT_AUTH, now),
            )
    print(f"wrote {len(AUTHORITIES)} authorities under {args.out}")


if __name__ == "__main__":
    main()
