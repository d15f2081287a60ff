"""Regenerate the Pub/Sub API stubs in ``ingest/pubsub`` from ``proto/pubsub_api.proto``.

Run ``python -m ingest.protogen`` after editing the proto. A test regenerates the stubs into a
temporary directory and fails when they differ from the committed ones, so the proto and the
stubs can never drift apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_NAME = "pubsub_api.proto"
STUB_FILES = (
    "pubsub_api_pb2.py",
    "pubsub_api_pb2.pyi",
    "pubsub_api_pb2_grpc.py",
    "pubsub_api_pb2_grpc.pyi",
)
_ROOT = Path(__file__).resolve().parent.parent
_TOP_LEVEL_IMPORT = re.compile(r"^import pubsub_api_pb2 as ", re.MULTILINE)


def generate(out_dir: Path, *, proto_dir: Path | None = None) -> list[Path]:
    """Write the four stub files into ``out_dir`` and return their paths.

    protoc names the message module by the proto's file name, so the generated gRPC module
    imports it as a top-level module; that import is rewritten to a package-relative one so
    the stubs live inside ``ingest.pubsub`` while the descriptor keeps Salesforce's file name.
    """
    from grpc_tools import protoc  # dev dependency, only needed to regenerate

    proto_dir = proto_dir or _ROOT / "proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"--proto_path={proto_dir}",
        f"--proto_path={include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        str(proto_dir / PROTO_NAME),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} on {proto_dir / PROTO_NAME}")
    paths = []
    for name in STUB_FILES:
        path = out_dir / name
        text = _TOP_LEVEL_IMPORT.sub("from . import pubsub_api_pb2 as ", path.read_text())
        path.write_text(text)
        paths.append(path)
    return paths


def main() -> int:
    for path in generate(_ROOT / "ingest" / "pubsub"):
        print(f"wrote {path.relative_to(_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
