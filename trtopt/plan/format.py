"""Plan file format (version 1). No pickle: a JSON header and raw byte sections.

Layout, all integers little-endian::

    b"TRTOPLAN"              8 bytes magic
    format version           uint32
    header length H          uint64
    header                   H bytes of UTF-8 JSON (see `Plan.header`)
    sections                 concatenated raw bytes, in header order
    sha256                   32 bytes over everything above (integrity check)
    [signature]              b"TRTOSIGN" + HMAC-SHA256, where TRTOPT_PLAN_KEY is set (`trtopt.plan.signing`)

The header says what the plan is (backend, versions of trtopt / TensorRT / ONNX Runtime, inputs and
outputs, and its metadata: preprocessing, labels, thresholds, optimiser report, verification; versioned on
its own, see `trtopt.plan.metadata`) and lists each section's name, size and sha256. The reader checks all
of it, and bounds it, before use (`trtopt.plan.schema`). A CPU plan carries an "onnx" section (the lowered
INT8 model); a TensorRT plan carries an "engine" section (the serialised ICudaEngine, extractable with
`trtopt export`) and its "onnx" source.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtopt.errors import PlanError
from trtopt.frontend.writer import write_atomic
from trtopt.plan.metadata import PlanMetadata
from trtopt.plan.schema import MAX_HEADER_BYTES, check_header, check_onnx_section, check_sections
from trtopt.plan.signing import plan_key, signed, unsigned

MAGIC = b"TRTOPLAN"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIQ")
_DIGEST_SIZE = 32


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of the plan. A dimension of -1 is dynamic (batch, within the profile)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(
            name=str(data["name"]), shape=tuple(int(d) for d in data["shape"]), dtype=str(data["dtype"])
        )


@dataclass(frozen=True)
class Plan:
    """A plan in memory: its backend, I/O, metadata and raw sections. `metadata` may be given as a mapping
    in its header form; it is read (and checked) into a `PlanMetadata`."""

    backend: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sections: dict[str, bytes]
    metadata: PlanMetadata = field(default_factory=PlanMetadata)
    versions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.metadata, Mapping):
            object.__setattr__(self, "metadata", PlanMetadata.from_dict(self.metadata))

    @property
    def preprocess(self) -> dict[str, Any] | None:
        return self.metadata.preprocess

    @property
    def labels(self) -> list[str] | None:
        return list(self.metadata.labels) if self.metadata.labels is not None else None

    def header(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "versions": self.versions,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "metadata": self.metadata.to_dict(),
            "sections": [
                {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                for name, data in self.sections.items()
            ],
        }


def plan_bytes(plan: Plan) -> bytes:
    """The plan file's bytes, signed where `TRTOPT_PLAN_KEY` is set (`trtopt.plan.signing`)."""
    header = json.dumps(plan.header(), sort_keys=True).encode()
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + b"".join(plan.sections.values())
    return signed(body + hashlib.sha256(body).digest(), plan_key())


def write_plan(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Serialise and write atomically (temporary file, then rename)."""
    return write_atomic(path, plan_bytes(plan))


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and verify a plan; every way it can be wrong is a `PlanError` that says how to fix it."""
    source = Path(path)
    if not source.is_file():
        what = "is a folder" if source.is_dir() else "does not exist"
        raise PlanError(
            f"Plan file {str(source)!r} {what}.",
            fix="Build one with `trtopt build model.onnx -o plan.engine`.",
        )
    return plan_from_bytes(source.read_bytes(), str(source))


def plan_from_bytes(data: bytes, where: str = "<bytes>") -> Plan:
    rebuild = "Rebuild it with `trtopt build`."
    data = unsigned(data, plan_key(), where)
    if len(data) < _PREFIX.size + _DIGEST_SIZE or data[:8] != MAGIC:
        looks = "a raw TensorRT engine or another file" if data[:8] != MAGIC else "cut short"
        raise PlanError(
            f"{where} is not a trtopt plan (no {MAGIC.decode()} header; it looks like {looks}).", fix=rebuild
        )
    _, version, header_len = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise PlanError(
            f"{where} is plan format version {version}; this trtopt ({_trtopt_version()}) reads version "
            f"{FORMAT_VERSION}.",
            fix=f"{rebuild} Or use the trtopt release that wrote it.",
        )
    body, digest = data[:-_DIGEST_SIZE], data[-_DIGEST_SIZE:]
    if hashlib.sha256(body).digest() != digest:
        raise PlanError(
            f"{where} failed its integrity check: the file is truncated or corrupted ({len(data)} bytes).",
            fix=f"Copy it again from its source, or {rebuild[0].lower()}{rebuild[1:]}",
        )
    start = _PREFIX.size
    if header_len > min(MAX_HEADER_BYTES, len(body) - start):
        raise PlanError(
            f"{where} declares a header of {header_len:,} bytes; the limit is {MAX_HEADER_BYTES:,} and the file "
            f"holds {len(body) - start:,} after its prefix.",
            fix=rebuild,
        )
    try:
        header = json.loads(body[start : start + header_len])
    except (ValueError, RecursionError) as exc:
        reason = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise PlanError(f"{where} has a malformed header ({reason}).", fix=rebuild) from None
    check_header(header, where)
    sections = check_sections(header["sections"], body[start + header_len :], where)
    if "onnx" in sections:
        check_onnx_section(sections["onnx"], [t["name"] for t in header["inputs"]],
                           [t["name"] for t in header["outputs"]], where)  # fmt: skip
    return Plan(
        backend=header["backend"],
        inputs=tuple(TensorSpec.from_dict(t) for t in header["inputs"]),
        outputs=tuple(TensorSpec.from_dict(t) for t in header["outputs"]),
        sections=sections,
        metadata=PlanMetadata.from_dict(header.get("metadata", {}), where),
        versions=header.get("versions", {}),
    )


def _trtopt_version() -> str:
    from trtopt._version import __version__

    return __version__
