"""Generate the Python modules of the kubelet pod-resources API from ``agent/k8s/podresources.proto``.

The generated modules are committed (the agent needs only ``grpcio`` and
``protobuf`` at run time, not the code generator); this script, run with the
dev dependency ``grpcio-tools``, rewrites them, and
``tests/agent/test_podresources_codegen.py`` runs it into a temporary folder
and fails when the committed files differ.

The proto is compiled under its installed import path
(``gpufleet/agent/k8s/podresources.proto``) so the generated gRPC module
imports its messages as ``gpufleet.agent.k8s.podresources_pb2``.

    python tools/gen_podresources.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO = ROOT / "agent" / "k8s" / "podresources.proto"
IMPORT_DIR = Path("gpufleet") / "agent" / "k8s"
OUTPUTS = ("podresources_pb2.py", "podresources_pb2.pyi", "podresources_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Compile the proto; write the generated modules into ``out_dir`` and return their paths."""
    from grpc_tools import protoc  # the dev dependency grpcio-tools

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        gen = Path(tmp) / "gen"
        (src / IMPORT_DIR).mkdir(parents=True)
        gen.mkdir()
        shutil.copy(PROTO, src / IMPORT_DIR / PROTO.name)
        rel = (IMPORT_DIR / PROTO.name).as_posix()
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{src}",
                f"--python_out={gen}",
                f"--pyi_out={gen}",
                f"--grpc_python_out={gen}",
                rel,
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed on {PROTO} (exit {rc})")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in OUTPUTS:
            target = out_dir / name
            shutil.copy(gen / IMPORT_DIR / name, target)
            written.append(target)
        return written


def main() -> int:
    for path in generate(PROTO.parent):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
