"""Plan container: round trip, and every way a plan file can be wrong gets a PlanError."""

from __future__ import annotations

import struct

import onnx
import pytest
from onnx import helper

from trtopt.errors import PlanError
from trtopt.plan import FORMAT_VERSION, MAGIC, Plan, TensorSpec, read_plan, write_plan
from trtopt.plan.format import plan_bytes


def _onnx() -> bytes:
    """The smallest model the plan reader accepts for these I/O names: input -> Flatten -> logits."""
    x = helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 192])
    graph = helper.make_graph([helper.make_node("Flatten", ["input"], ["logits"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _plan() -> Plan:
    return Plan(
        backend="cpu",
        inputs=(TensorSpec("input", (-1, 3, 8, 8), "float32"),),
        outputs=(TensorSpec("logits", (-1, 10), "float32"),),
        sections={"onnx": _onnx(), "extra": bytes(range(256))},
        metadata={"preprocess": {"crop": 8}, "labels": ["a", "b"], "thresholds": {"x": 1.5}},
        versions={"trtopt": "0.1.0"},
    )


def test_round_trip(tmp_path):
    path = write_plan(_plan(), tmp_path / "p.engine")
    plan = read_plan(path)
    assert plan == _plan()
    assert plan.preprocess == {"crop": 8}
    assert plan.labels == ["a", "b"]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_file_starts_with_magic_and_version(tmp_path):
    data = plan_bytes(_plan())
    magic, version = struct.unpack_from("<8sI", data)
    assert (magic, version) == (MAGIC, FORMAT_VERSION)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[: len(d) // 2], "integrity check"),
        (lambda d: d[:-1], "integrity check"),
        (lambda d: d[:20] + bytes([d[20] ^ 0xFF]) + d[21:], "integrity check"),
        (lambda d: d[:-100] + bytes([d[-100] ^ 1]) + d[-99:], "integrity check"),
        (lambda d: b"\x00" * 64, "not a trtopt plan"),
        (lambda d: b"", "not a trtopt plan"),
        (lambda d: MAGIC + struct.pack("<I", FORMAT_VERSION + 1) + d[12:], "format version 2"),
    ],
    ids=["half", "last-byte-cut", "header-bitflip", "payload-bitflip", "zeros", "empty", "future-version"],
)
def test_bad_plans_are_plan_errors(tmp_path, mutate, message):
    path = tmp_path / "bad.engine"
    path.write_bytes(mutate(plan_bytes(_plan())))
    with pytest.raises(PlanError, match=message) as info:
        read_plan(path)
    assert info.value.fix  # every error says how to fix it


def test_missing_and_folder(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        read_plan(tmp_path / "nope.engine")
    with pytest.raises(PlanError, match="is a folder"):
        read_plan(tmp_path)
