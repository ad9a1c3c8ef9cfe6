"""Plan container: round trip, and every way a plan file can be wrong gets a PlanError."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from hostile_files import sealed_plan, split_plan
from onnx import helper

from trtopt.engine import Engine
from trtopt.errors import PlanError
from trtopt.execution import OrtSession
from trtopt.plan import FORMAT_VERSION, MAGIC, METADATA_VERSION, Plan, PlanMetadata, TensorSpec, read_plan, write_plan
from trtopt.plan.format import plan_bytes, plan_from_bytes


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


# --- typed, versioned metadata ------------------------------------------------------------------------

OLD_PLAN = Path(__file__).parent / "data" / "plans" / "v1_tiny_cpu_int8.engine"  # written by trtopt 0.1.0


def _header(path: Path) -> dict:
    return split_plan(path.read_bytes())[0]


def test_a_plan_written_by_trtopt_0_1_loads_typed_and_runs() -> None:
    """Metadata version 1 (no `metadata_version` key, a free-form object) reads into the same typed record."""
    raw = _header(OLD_PLAN)["metadata"]
    assert "metadata_version" not in raw  # really the old format
    plan = read_plan(OLD_PLAN)
    meta = plan.metadata
    assert meta.precision == "int8" and meta.source_model == "tiny.onnx" and meta.labels is None
    assert meta.quant is not None and meta.quant.method == "entropy" and meta.quant.samples == 12
    assert meta.quant.thresholds == raw["thresholds"] and list(meta.quant.int8_layers) == raw["int8_layers"]
    assert meta.quant.float_layers == raw["float_layers"]
    assert meta.optimizer is not None and list(meta.optimizer.passes) == raw["optimizer"]["passes"]
    assert meta.verification is not None and meta.verification.variant == raw["verification"]["variant"]
    assert plan.preprocess == raw["preprocess"] and not meta.extra
    # Written back, it is the same record with its version added: nothing lost, nothing renamed.
    assert meta.to_dict() == {**raw, "metadata_version": METADATA_VERSION}
    with Engine.load(OLD_PLAN, threads=1) as engine:
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        expected = OrtSession(onnx.load_from_string(plan.sections["onnx"])).run({"input": x})["logits"]
        np.testing.assert_allclose(engine(x), expected, rtol=1e-5, atol=1e-5)
        assert engine.verification == meta.verification


def test_metadata_round_trips_typed(tmp_path: Path) -> None:
    plan = read_plan(OLD_PLAN)
    path = write_plan(plan, tmp_path / "again.engine")
    assert _header(path)["metadata"]["metadata_version"] == METADATA_VERSION
    assert read_plan(path).metadata == plan.metadata
    assert PlanMetadata.from_dict(plan.metadata.to_dict()) == plan.metadata


def test_a_newer_metadata_version_is_refused_with_what_to_do(tmp_path: Path) -> None:
    header = _header(OLD_PLAN)
    header["metadata"]["metadata_version"] = METADATA_VERSION + 1
    header["metadata"]["thresholds"] = {"x": {"per_channel": [1.0, 2.0]}}  # a newer layout: not read as v2
    with pytest.raises(PlanError, match=f"metadata version {METADATA_VERSION + 1}, written by a newer trtopt") as info:
        plan_from_bytes(sealed_plan(header, split_plan(OLD_PLAN.read_bytes())[1]), "future.engine")
    assert "Upgrade trtopt" in info.value.fix
    with pytest.raises(PlanError, match="newer trtopt"):
        PlanMetadata.from_dict({"metadata_version": METADATA_VERSION + 1})
    with pytest.raises(PlanError, match="metadata_version 'two'"):
        PlanMetadata.from_dict({"metadata_version": "two"})


def test_malformed_metadata_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="malformed metadata") as info:
        PlanMetadata.from_dict({"calibration": {"samples": 3}})  # no method
    assert info.value.fix
    with pytest.raises(PlanError, match="malformed metadata"):
        PlanMetadata.from_dict({"verification": {"isa": "avx2"}})  # an incomplete verification record



SPARSITY = {"backend": "cpu", "qualifying_layers": ["conv_1"], "qualifying_mac_share": 0.25,
            "fp32_layers_with_2_4_weights": [], "eligible_not_2_4": ["conv_2", "gemm"], "eligible_mac_share": 0.75,
            "note": "what the backend can say"}  # fmt: skip


def test_the_sparsity_record_is_typed_and_checked() -> None:
    """`build --sparsity`'s record reads into a `SparsityRecord` and writes back the same JSON; a malformed
    one (a share outside [0, 1], a name list that is a string, a missing key) is refused like any metadata."""
    from trtopt.plan import SparsityRecord

    meta = PlanMetadata.from_dict({"sparsity": SPARSITY})
    assert isinstance(meta.sparsity, SparsityRecord) and meta.sparsity.eligible_not_2_4 == ("conv_2", "gemm")
    assert meta.to_dict()["sparsity"] == SPARSITY and meta["sparsity"]["qualifying_layers"] == ["conv_1"]
    no_backend = {k: v for k, v in SPARSITY.items() if k != "backend"}
    for record in ({**SPARSITY, "qualifying_mac_share": 1.5}, {**SPARSITY, "eligible_not_2_4": "conv_2"}, no_backend):
        with pytest.raises(PlanError, match="malformed metadata"):
            PlanMetadata.from_dict({"sparsity": record})
