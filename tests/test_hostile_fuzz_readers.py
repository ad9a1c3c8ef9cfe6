"""Issue #46: the calibration-cache readers and the model loader, fuzzed with hypothesis (random mutations of
valid files, in every cache format trtopt reads). Nothing but trtopt's own error types may escape.

The plan reader has the same test in tests/test_hostile_fuzz.py. Budgets are small and derandomized."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtopt.calib import load_cache
from trtopt.errors import TrtoptError
from trtopt.frontend import graph_from_onnx, load_model
from trtopt.zoo import build_model

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))  # fmt: skip

TRTOPT_CACHE = json.dumps({
    "format": "trtopt-calibration", "version": 1, "model_fingerprint": "ab" * 32, "method": "entropy",
    "thresholds": {"input": 2.5, "conv_1_out": 0.75}, "data": {"count": 8, "description": "8 images"},
}).encode()  # fmt: skip
TENSORRT_CACHE = b"TRT-8601-EntropyCalibration2\ninput: 3c010a14\nconv_1_out: 3b808081\n"
ORT_CACHE = json.dumps({"input": [0.0, 2.5], "conv_1_out": [-0.75, 0.75]}).encode()
MODEL = build_model("tiny_cnn", seed=1).SerializeToString()
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _mutated(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    raw = bytearray(data[: max(1, len(data) - cut)])
    for position, value in edits:
        raw[position % len(raw)] = value
    return bytes(raw)


def _read_cache(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cache"
        path.write_bytes(data)
        with contextlib.suppress(TrtoptError):
            load_cache(path)


@FUZZ
@given(st.sampled_from([TRTOPT_CACHE, TENSORRT_CACHE, ORT_CACHE]),
       st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6), st.integers(0, 40))
def test_cache_byte_mutations(valid: bytes, edits: list[tuple[int, int]], cut: int) -> None:
    _read_cache(_mutated(valid, edits, cut))


@FUZZ
@given(st.sampled_from(["format", "version", "model_fingerprint", "method", "thresholds", "data", "channel_means",
                        "methods", "equalization"]), JSON_VALUES)  # fmt: skip
def test_cache_field_values(field: str, value: object) -> None:
    doc = json.loads(TRTOPT_CACHE)
    doc[field] = value
    _read_cache(json.dumps(doc).encode())


@settings(FUZZ, max_examples=40)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6), st.integers(0, 64))
def test_model_byte_mutations(edits: list[tuple[int, int]], cut: int) -> None:
    data = _mutated(MODEL, edits, cut)
    try:
        load_model(data)
        graph_from_onnx(data)
    except TrtoptError:
        pass


def test_the_valid_files_read() -> None:
    for valid in (TRTOPT_CACHE, TENSORRT_CACHE, ORT_CACHE):
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "cache").write_bytes(valid)
            assert load_cache(Path(folder) / "cache").amax
    assert isinstance(load_model(MODEL).model, onnx.ModelProto)
