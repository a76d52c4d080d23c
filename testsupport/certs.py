"""Certificate authorities for TLS and mTLS tests, checked in under tests/fixtures/pki/.

Each authority's folder holds its certificate and key, a server certificate for 127.0.0.1 and
localhost, and the client certificates the tests use, whose node name is in the CN, in a DNS
subject-alternative name, or both.  ``tools/gen_test_pki.py`` writes them (valid for a century); a
test asking for one that is not there fails naming it.  Reading files instead of making keys keeps
every run's certificates the same and the helpers free of a cryptography library.

A :class:`TestCA` copies what a test asks for into the test's own folder: a server refuses a key file
others may read, and git does not keep file modes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

#: The checked-in authorities, one folder each (named for the authority, spaces as dashes).
PKI_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pki"


def client_file(cn: str, dns: tuple[str, ...] | list[str]) -> str:
    """The file stem of a client certificate: its CN, then its DNS names."""
    return "client-" + "+".join([cn, *dns])


@dataclass
class Pair:
    cert: Path
    key: Path


class TestCA:
    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "gpufleet test CA") -> None:
        self.dir = directory
        self.source = PKI_DIR / name.replace(" ", "-")
        if not (self.source / "ca.crt").is_file():
            raise FileNotFoundError(
                f"no test authority {name!r} under {PKI_DIR}: add it to tools/gen_test_pki.py"
            )
        directory.mkdir(parents=True, exist_ok=True)
        self.pem = directory / f"{name.replace(' ', '-')}.crt"
        shutil.copyfile(self.source / "ca.crt", self.pem)

    def _pair(self, stem: str) -> Pair:
        src = self.source / f"{stem}.crt"
        if not src.is_file():
            raise FileNotFoundError(
                f"no test certificate {stem!r} of {self.source.name}: add it to tools/gen_test_pki.py and run it"
            )
        cert, key = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        shutil.copyfile(src, cert)
        shutil.copyfile(self.source / f"{stem}.key", key)
        key.chmod(0o600)
        return Pair(cert, key)

    def server(self) -> Pair:
        """For 127.0.0.1 and localhost."""
        return self._pair("server")

    def client(self, cn: str, dns: list[str] | None = None) -> Pair:
        """A client certificate: the node name in the CN, and optionally in DNS names."""
        return self._pair(client_file(cn, dns or []))
