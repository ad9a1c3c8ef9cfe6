"""A plan's header is input, not trusted code: it is checked against this schema before anything uses it.

Anyone can edit a plan and recompute its sha256, so the integrity check proves nothing about intent.
`check_header` bounds what a header may hold (types, sizes, counts, nesting, preprocessing ranges);
`check_sections` ties the section table to the bytes that follow it (sizes add up exactly, every
per-section sha256 matches); `check_onnx_section` parses the ONNX a plan carries and refuses external
data (a plan's model must not reach for files beside it). Unknown metadata keys are allowed, within the
header's size and nesting limits, so newer trtopt releases can add records.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

from trtopt.errors import PlanError

MAX_HEADER_BYTES = 16 * 2**20  # a real header is a few hundred KiB even for large models
MAX_DEPTH = 32  # JSON nesting
MAX_NODES = 2_000_000  # JSON values in the whole header
MAX_TENSORS = 256  # inputs, outputs
MAX_RANK = 8
MAX_DIM = 2**31 - 1
MAX_NAME = 4096  # characters in a tensor, section or label name
MAX_SECTIONS = 16
MAX_LABELS = 1_000_000
MAX_CROP = 4096  # preprocess.crop (each side)
MAX_RESIZE = 8192  # preprocess.resize (shorter side)
DTYPES = ("float32", "float16", "float64", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
          "int64", "uint64", "bool")  # fmt: skip
_SECTION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BACKEND_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _fail(where: str, what: str) -> PlanError:
    return PlanError(
        f"{where} has an invalid header: {what}.",
        fix="Rebuild the plan with `trtopt build`; plans edited by hand or by other tools are refused.",
    )


def check_header_bounds(header: Any, where: str) -> None:
    """Nesting depth and value count, walked without recursion (a crafted header may nest 10^5 deep)."""
    stack: list[tuple[Any, int]] = [(header, 1)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise _fail(where, f"JSON nested deeper than {MAX_DEPTH} levels")
        if count > MAX_NODES:
            raise _fail(where, f"more than {MAX_NODES:,} JSON values")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _fail(where, "a NaN or infinite number")


def check_header(header: Any, where: str) -> None:
    """Raise `PlanError` unless `header` is a well-formed, bounded plan header (sections: see below)."""
    check_header_bounds(header, where)
    if not isinstance(header, dict):
        raise _fail(where, f"expected a JSON object, found {type(header).__name__}")
    backend = header.get("backend")  # an unknown but well-formed name is refused by the backend registry
    if not isinstance(backend, str) or not _BACKEND_NAME.fullmatch(backend):
        raise _fail(where, f"backend {_short(backend)}; expected a backend's name, such as cpu or tensorrt")
    _check_str_map(header.get("versions", {}), where, "versions")
    for key in ("inputs", "outputs"):
        _check_tensors(header.get(key), where, key)
    metadata = header.get("metadata", {})
    if not isinstance(metadata, dict):
        raise _fail(where, f"metadata is {type(metadata).__name__}; expected an object")
    _check_metadata(metadata, where)
    sections = header.get("sections")
    if not isinstance(sections, list) or len(sections) > MAX_SECTIONS:
        raise _fail(where, f"sections must be a list of at most {MAX_SECTIONS} entries")
    names = set()
    for entry in sections:
        ok = isinstance(entry, dict) and isinstance(entry.get("name"), str) and _SECTION_NAME.fullmatch(entry["name"])
        if not ok or not _is_int(entry.get("size")) or entry["size"] < 0:
            raise _fail(where, f"section entry {_short(entry)} is not {{name, size >= 0, sha256}}")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
            raise _fail(where, f"section {entry['name']!r} has no valid sha256")
        if entry["name"] in names:
            raise _fail(where, f"section {entry['name']!r} appears twice")
        names.add(entry["name"])


def check_sections(sections: list[dict[str, Any]], payload: bytes, where: str) -> dict[str, bytes]:
    """Split `payload` by the (checked) section table: the sizes must add up to it exactly and every
    section's sha256 must match. Returns name -> bytes."""
    total = sum(entry["size"] for entry in sections)
    if total != len(payload):
        raise _fail(where, f"its sections add up to {total:,} bytes, but {len(payload):,} follow the header")
    out, offset = {}, 0
    for entry in sections:
        data = payload[offset : offset + entry["size"]]
        offset += entry["size"]
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise _fail(where, f"section {entry['name']!r} does not match its sha256")
        out[entry["name"]] = data
    return out


def check_onnx_section(data: bytes, input_names: list[str], output_names: list[str], where: str) -> None:
    """The ONNX a plan carries parses, keeps every weight inside itself, takes the header's inputs and makes the
    header's outputs (a header edited to name others would fail on the first call, or be read wrongly)."""
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise _fail(where, "its 'onnx' section is not an ONNX model") from None
    if not model.graph.output:
        raise _fail(where, "its 'onnx' section holds no graph")
    helper = onnx.external_data_helper
    external = [t.name for t in helper._get_all_tensors(model) if helper.uses_external_data(t)]
    if external:
        raise _fail(where, f"its ONNX model reads tensor {external[0]!r} from an external file (refused in plans)")
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = sorted(i.name for i in model.graph.input if i.name not in initializers)
    if graph_inputs != sorted(input_names):
        listed = sorted(input_names)[:8]
        raise _fail(where, f"its ONNX model takes inputs {graph_inputs[:8]}, the header lists {listed}")
    graph_outputs = sorted(o.name for o in model.graph.output)
    if graph_outputs != sorted(output_names):
        listed = sorted(output_names)[:8]
        raise _fail(where, f"its ONNX model makes outputs {graph_outputs[:8]}, the header lists {listed}")


def _check_tensors(value: Any, where: str, key: str) -> None:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_TENSORS:
        raise _fail(where, f"{key} must be a list of 1 to {MAX_TENSORS} tensors")
    for t in value:
        if not isinstance(t, dict) or not _is_name(t.get("name")):
            raise _fail(where, f"{key} entry {_short(t)} has no valid name")
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_RANK:
            raise _fail(where, f"{key} {t['name']!r} has shape {_short(shape)}; expected at most {MAX_RANK} sizes")
        if not all(_is_int(d) and (d == -1 or 1 <= d <= MAX_DIM) for d in shape):
            raise _fail(where, f"{key} {t['name']!r} has shape {_short(shape)}; sizes must be -1 or 1..{MAX_DIM}")
        if t.get("dtype") not in DTYPES:
            raise _fail(where, f"{key} {t['name']!r} has dtype {_short(t.get('dtype'))}")


def _check_metadata(meta: dict[str, Any], where: str) -> None:
    from trtopt.plan.metadata import check_metadata_version

    check_metadata_version(meta.get("metadata_version", 1), where)  # first: a newer version may mean other things
    preprocess = meta.get("preprocess")
    if preprocess is not None:
        _check_preprocess(preprocess, where)
    labels = meta.get("labels")
    if labels is not None and (
        not isinstance(labels, list) or len(labels) > MAX_LABELS or not all(_is_name(x, empty=True) for x in labels)
    ):
        raise _fail(where, f"labels must be a list of at most {MAX_LABELS:,} strings")
    thresholds = meta.get("thresholds")
    if thresholds is not None and (
        not isinstance(thresholds, dict) or not all(_is_number(v) and v >= 0 for v in thresholds.values())
    ):
        raise _fail(where, "thresholds must map tensor names to non-negative numbers")
    verification = meta.get("verification")
    if verification is not None:
        if not isinstance(verification, dict):
            raise _fail(where, "verification must be an object")
        for key in ("isa", "variant", "source"):
            if key in verification and not isinstance(verification[key], str):
                raise _fail(where, f"verification.{key} must be a string")
    optimizer = meta.get("optimizer")
    if optimizer is not None:
        passes = optimizer.get("passes", []) if isinstance(optimizer, dict) else None
        if not isinstance(passes, list) or not all(isinstance(p, str) for p in passes):
            raise _fail(where, "optimizer.passes must be a list of pass names")


def _check_preprocess(value: Any, where: str) -> None:
    from trtopt.data import PreprocessSpec
    from trtopt.errors import DataError

    try:
        spec = PreprocessSpec.from_dict(value, where=f"{where}: metadata.preprocess")
    except DataError as exc:
        raise _fail(where, exc.what.rstrip(".")) from None
    if max(spec.crop_hw) > MAX_CROP or spec.resize_short > MAX_RESIZE:
        raise _fail(
            where,
            f"preprocess crop {list(spec.crop_hw)} / resize {spec.resize_short} is out of range (crop at most "
            f"{MAX_CROP}, resize at most {MAX_RESIZE} pixels)",
        )


def _check_str_map(value: Any, where: str, key: str) -> None:
    if not isinstance(value, Mapping) or not all(isinstance(v, str) and len(v) <= MAX_NAME for v in value.values()):
        raise _fail(where, f"{key} must map names to strings")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_name(value: Any, *, empty: bool = False) -> bool:
    return isinstance(value, str) and (empty or value != "") and len(value) <= MAX_NAME


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
