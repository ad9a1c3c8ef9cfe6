"""Issue #15: the plan reader and the image reader, fuzzed with hypothesis (random mutations of valid files).

Nothing but trtopt's own error types may escape, and memory stays bounded (tracemalloc peak per call).
The budgets are small and derandomized, so the suite stays fast and reproducible.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import struct
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import onnx
import pytest
from hostile_files import sealed_plan, split_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper
from PIL import Image

from trtopt.data import PreprocessSpec, preprocess_image
from trtopt.data.images import read_image_bytes
from trtopt.errors import TrtoptError
from trtopt.plan import Plan, TensorSpec
from trtopt.plan.format import plan_bytes, plan_from_bytes

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
PEAK_LIMIT = 256 * 2**20  # bytes allocated by one read, whatever the input


def _onnx() -> bytes:
    x = helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 192])
    graph = helper.make_graph([helper.make_node("Flatten", ["input"], ["logits"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


VALID_PLAN = plan_bytes(
    Plan(
        backend="cpu",
        inputs=(TensorSpec("input", (-1, 3, 8, 8), "float32"),),
        outputs=(TensorSpec("logits", (-1, 192), "float32"),),
        sections={"onnx": _onnx()},
        metadata={
            "preprocess": {"crop": 8, "resize": 10, "scale": 255.0},
            "labels": [f"class {i}" for i in range(192)],
            "thresholds": {"input": 2.5},
            "verification": {"samples": 8, "source": "random", "isa": "avx2", "variant": "u8u8", "tolerance": 0.01,
                             "rejected": [], "reference_vs_fp32": {"cosine": 1.0, "rel_error": 0.0, "top1": 1.0},
                             "kernels_vs_reference": {"cosine": 1.0, "rel_error": 0.0, "top1": 1.0}},
        },  # fmt: skip
        versions={"trtopt": "0.1.0"},
    )
)


def _bounded(call: Callable[[], Any]) -> Any:
    """Run `call`; only TrtoptError may escape, and its allocations must stay under PEAK_LIMIT."""
    tracemalloc.start()
    try:
        return call()
    except TrtoptError:
        return None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < PEAK_LIMIT, f"peak {peak:,} bytes"


def test_the_valid_plan_reads() -> None:
    metadata = plan_from_bytes(VALID_PLAN).metadata
    assert metadata.labels is not None and metadata.labels[0] == "class 0" and metadata.verification is not None


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8))
def test_byte_mutations_resealed(edits: list[tuple[int, int]]) -> None:
    """Byte edits anywhere before the digest, with the digest recomputed (what an attacker can do)."""
    body = bytearray(VALID_PLAN[:-32])
    for position, value in edits:
        body[position % len(body)] = value
    data = bytes(body) + hashlib.sha256(bytes(body)).digest()
    _bounded(lambda: plan_from_bytes(data))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


HEADER, SECTIONS = split_plan(VALID_PLAN)
HEADER_PATHS = _paths(HEADER)[1:]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(HEADER_PATHS), JSON), min_size=1, max_size=4))
def test_header_value_mutations(replacements: list[tuple[tuple[Any, ...], Any]]) -> None:
    """Any header value replaced by any JSON value: a Plan or a PlanError, never another exception."""
    header = copy.deepcopy(HEADER)
    for path, value in replacements:
        target = header
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed this path
    try:
        text = json.dumps(header).encode()
    except ValueError:
        return
    _bounded(lambda: plan_from_bytes(sealed_plan(header, SECTIONS, raw_header=text)))


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 2**64 - 1))
def test_arbitrary_headers_and_lengths(raw: bytes, declared: int) -> None:
    """Any header bytes; any declared header length (up to 2**64 - 1)."""
    _bounded(lambda: plan_from_bytes(sealed_plan({}, SECTIONS, raw_header=raw)))
    body = b"TRTOPLAN" + struct.pack("<IQ", 1, declared) + raw
    _bounded(lambda: plan_from_bytes(body + hashlib.sha256(body).digest()))


def _image(fmt: str) -> bytes:
    image = Image.new("RGB", (24, 16), (200, 40, 90))
    image.putpixel((3, 3), (0, 255, 0))
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


IMAGES = {fmt: _image(fmt) for fmt in ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF")}
SPEC = PreprocessSpec(crop=8, resize=10)


def _read_and_preprocess(data: bytes) -> None:
    preprocess_image(read_image_bytes(data, "fuzzed"), SPEC)


@FUZZ
@given(
    st.sampled_from(sorted(IMAGES)),
    st.lists(st.tuples(st.integers(0, 10**5), st.integers(0, 255)), max_size=6),
    st.integers(0, 10**5),
)
def test_image_byte_mutations(fmt: str, edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(IMAGES[fmt])
    for position, value in edits:
        data[position % len(data)] = value
    mutated = bytes(data[: max(1, len(data) - cut % len(data))])
    _bounded(lambda: _read_and_preprocess(mutated))


@FUZZ
@given(
    st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.sampled_from([0, 2, 3, 4, 6]), st.sampled_from([1, 8, 16])
)
def test_png_header_dimensions(width: int, height: int, color: int, depth: int) -> None:
    """Any IHDR (width, height, colour type, bit depth) with a valid CRC: refused before decoding if huge."""
    data = bytearray(IMAGES["PNG"])
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    _bounded(lambda: _read_and_preprocess(bytes(data)))


@pytest.mark.parametrize("fmt", sorted(IMAGES))
def test_valid_images_read(fmt: str) -> None:
    assert read_image_bytes(IMAGES[fmt]).size == (24, 16)
