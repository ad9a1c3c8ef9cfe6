"""Front end: every bad input gets a clean ModelError/ShapeError that says what and how to fix it;
external data loads safely; the >2 GiB code paths run (with the limit patched down); writes are atomic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from model_files import EXPECTED_MESSAGE, copy, save, with_dynamic_hw, write_bad_file

import trtopt.execution.ort_session as ort_session
import trtopt.frontend.loader as loader
import trtopt.frontend.writer as writer
from trtopt.errors import ModelError, ShapeError, TrtoptError
from trtopt.execution import run_model
from trtopt.frontend import (
    apply_shapes,
    graph_from_onnx,
    load_model,
    onnx_from_graph,
    parse_shapes,
    require_static_shapes,
    save_onnx,
    write_atomic,
)
from trtopt.zoo import build_model

SMALL_LIMIT = 4096  # bytes: every zoo model counts as "over the protobuf limit"


def feed(shape: tuple[int, ...] = (1, 16, 16, 16)) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def outputs_of(model: onnx.ModelProto, shape: tuple[int, ...] = (1, 16, 16, 16)) -> np.ndarray:
    return next(iter(run_model(model, feed(shape)).values()))


# -- bad files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(EXPECTED_MESSAGE))
def test_bad_file_is_a_clean_model_error(kind: str, tmp_path: Path) -> None:
    path = write_bad_file(kind, tmp_path)
    with pytest.raises(ModelError, match=EXPECTED_MESSAGE[kind]) as info:
        load_model(path)
    assert info.value.fix, "every error says how to fix it"
    assert str(path.name) in info.value.what or kind.startswith("escape")
    assert "\n" not in str(info.value)


def test_truncated_bytes_at_every_cut_are_model_errors() -> None:
    data = build_model("resnet_basic").SerializeToString()
    for cut in range(1, len(data), 97):
        with pytest.raises(ModelError):
            load_model(data[:cut])


def test_external_data_missing_file(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    model = build_model("resnet_basic")
    onnx.save_model(model, folder / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    (folder / "w.bin").unlink()
    with pytest.raises(ModelError, match="'w.bin', which is missing"):
        load_model(folder / "m.onnx")


def test_bytes_with_external_data_ask_for_the_path(tmp_path: Path) -> None:
    onnx.save_model(
        build_model("resnet_basic"), tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0
    )
    with pytest.raises(ModelError, match="given as bytes.*external data.*from its .onnx path"):
        load_model((tmp_path / "m.onnx").read_bytes())


# -- good inputs ----------------------------------------------------------------------------------


def test_load_from_path_and_bytes(tmp_path: Path) -> None:
    model = build_model("resnet_basic")
    path = save(model, tmp_path / "m.onnx")
    from_path = load_model(path)
    from_bytes = load_model(model.SerializeToString())
    assert from_path.path == path and from_bytes.path is None and from_bytes.opset == 17
    assert load_model(bytearray(model.SerializeToString())).model == from_bytes.model
    graph = graph_from_onnx(model.SerializeToString())
    assert graph.outputs[0].shape == [1, 16, 16, 16]
    np.testing.assert_allclose(outputs_of(onnx_from_graph(graph)), outputs_of(model), rtol=1e-5, atol=1e-5)


def test_external_data_loads(tmp_path: Path) -> None:
    model = build_model("tiny_cnn")
    folder = tmp_path / "ext"
    folder.mkdir()
    onnx.save_model(
        copy(model), folder / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    assert (folder / "m.onnx").stat().st_size < 10_000 < (folder / "w.bin").stat().st_size
    loaded = load_model(folder / "m.onnx").model
    shape = (1, 3, 32, 32)
    np.testing.assert_array_equal(outputs_of(loaded, shape), outputs_of(model, shape))


def test_onnx_from_graph_caps_the_ir_version() -> None:
    model = build_model("resnet_basic")
    model.ir_version = 14
    assert onnx_from_graph(graph_from_onnx(model)).ir_version == 10


# -- shapes ---------------------------------------------------------------------------------------


def test_parse_shapes() -> None:
    assert parse_shapes(["input:1x3x32x32", "a:2,b:4X5"]) == {"input": (1, 3, 32, 32), "a": (2,), "b": (4, 5)}
    assert parse_shapes(None) == {}


BAD_SPECS = ["input", "input:", ":1x3", "input:1x3xAx4", "input:0x3", "input:1x-3", "input:1,,"]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_parse_shapes_rejects_bad_syntax(spec: str) -> None:
    with pytest.raises(ShapeError, match="NAME:DxDxD"):
        parse_shapes([spec])


def test_shapes_may_keep_the_batch_dimension_as_the_model_has_it() -> None:
    """`--shapes x:Nx3x32x32` sets H and W and keeps the batch: dynamic stays dynamic (MTCNN's PNet, [N, H, W, 3],
    could never batch with every size given; round 13's hunt), a fixed batch stays fixed. Only the first may be N."""
    from trtopt.backend.tensorrt.builder import profiles_for

    assert parse_shapes(["input:Nx3x32x32", "b:-1x4"]) == {"input": (-1, 3, 32, 32), "b": (-1, 4)}
    for bad in ("input:1xNx32x32", "input:-2x3x32x32"):
        with pytest.raises(ShapeError, match="may be N"):
            parse_shapes([bad])
    model = with_dynamic_hw()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    graph = graph_from_onnx(model, shapes=parse_shapes(["input:Nx3x32x32"]))
    require_static_shapes(graph)  # the batch may stay dynamic
    assert graph.inputs[0].shape == ["batch", 3, 32, 32]
    fixed = graph_from_onnx(with_dynamic_hw(), shapes=parse_shapes(["input:Nx3x32x32"]))
    assert fixed.inputs[0].shape == [1, 3, 32, 32]  # tiny_cnn fixes its batch at 1: N keeps it
    profile = profiles_for(graph.inputs, parse_shapes(["input:Nx3x32x32"]), None)["input"]
    assert (profile.min, profile.max) == ((1, 3, 32, 32), (1, 3, 32, 32))  # TensorRT: batch 1 unless --batch
    assert profiles_for(graph.inputs, parse_shapes(["input:Nx3x32x32"]), 8)["input"].max == (8, 3, 32, 32)


def test_dynamic_dims_need_shapes() -> None:
    model = with_dynamic_hw()
    graph = graph_from_onnx(model)
    with pytest.raises(ShapeError, match=r"dynamic dimension\(s\) \[2, 3\].*--shapes input:1x3x224x224"):
        require_static_shapes(graph)
    fixed = graph_from_onnx(model, shapes={"input": (1, 3, 32, 32)})
    require_static_shapes(fixed)
    assert fixed.outputs[0].shape == [1, 10]


def test_dynamic_batch_is_allowed_unless_asked() -> None:
    model = build_model("resnet_basic")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    graph = graph_from_onnx(model)
    require_static_shapes(graph)
    with pytest.raises(ShapeError, match=r"\[0\]"):
        require_static_shapes(graph, allow_dynamic_batch=False)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"image": (1, 3, 32, 32)}, "no such input.*Model inputs: input"),
        ({"input": (1, 3, 32)}, "rank 3.*rank 4"),
        ({"input": (1, 4, 32, 32)}, "dimension 1.*fixes it at 3"),
    ],
)
def test_bad_shapes_for_the_model(shapes: dict[str, tuple[int, ...]], message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        graph_from_onnx(with_dynamic_hw(), shapes=shapes)
    graph = graph_from_onnx(with_dynamic_hw())
    with pytest.raises(ShapeError):
        apply_shapes(graph, shapes)


# -- over the protobuf limit (patched down, so no 2 GiB in the test suite) ------------------------


def test_large_model_shape_inference_runs_on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "PROTOBUF_LIMIT", SMALL_LIMIT)
    calls = []
    real = loader._infer_shapes_on_disk
    monkeypatch.setattr(loader, "_infer_shapes_on_disk", lambda m: calls.append(1) or real(m))
    model = build_model("tiny_cnn")
    graph = graph_from_onnx(model)
    assert calls, "the on-disk path did not run"
    assert graph.outputs[0].shape == [1, 10]
    conv = next(n for n in graph.nodes if n.op == "Conv")
    assert conv.outputs[0].shape == [1, 16, 32, 32]
    assert isinstance(conv.inputs[1], onnx_graphsurgeon_constant()), "weights came back from the side file"
    shape = (1, 3, 32, 32)
    np.testing.assert_allclose(outputs_of(onnx_from_graph(graph), shape), outputs_of(model, shape), atol=1e-5)


def onnx_graphsurgeon_constant() -> type:
    import onnx_graphsurgeon as gs

    return gs.Constant


def test_large_model_saves_with_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "PROTOBUF_LIMIT", SMALL_LIMIT)
    model = build_model("resnet_basic")
    before = model.SerializeToString()
    target = save_onnx(model, tmp_path / "out" / "big.onnx")
    assert sorted(p.name for p in target.parent.iterdir()) == ["big.onnx", "big.onnx.data"]
    assert model.SerializeToString() == before, "save_onnx must not move the caller's weights out"
    np.testing.assert_array_equal(outputs_of(load_model(target).model), outputs_of(model))


def test_large_model_runs_in_ort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort_session, "PROTOBUF_LIMIT", SMALL_LIMIT)
    model = build_model("resnet_basic")
    before = model.SerializeToString()
    result = run_model(model, feed())
    assert model.SerializeToString() == before, "running must not move the caller's weights out"
    monkeypatch.undo()
    np.testing.assert_array_equal(result["output"], outputs_of(model))


# -- atomic writes --------------------------------------------------------------------------------


def failing_write_bytes(self: Path, data: bytes) -> int:
    """Write half the bytes, then fail as a full disk would."""
    with open(self, "wb") as f:
        f.write(data[: len(data) // 2])
    raise OSError(28, "No space left on device")


def test_write_atomic_leaves_nothing_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = write_atomic(tmp_path / "kept.bin", b"old contents")
    monkeypatch.setattr(Path, "write_bytes", failing_write_bytes)
    with pytest.raises(TrtoptError, match="No space left on device. Nothing was written"):
        write_atomic(tmp_path / "new.bin", b"x" * 1000)
    with pytest.raises(TrtoptError):
        save_onnx(build_model("resnet_basic"), tmp_path / "kept.bin")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["kept.bin"], "no partial or temp files"
    assert old.read_bytes() == b"old contents"


def test_external_save_leaves_nothing_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "PROTOBUF_LIMIT", SMALL_LIMIT)
    real_save = onnx.save_model

    def save_then_fail(model: onnx.ModelProto, path: Path, **kwargs: object) -> None:
        real_save(model, path, **kwargs)  # both files now exist, fully written
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(onnx, "save_model", save_then_fail)
    with pytest.raises(TrtoptError, match="Input/output error"):
        save_onnx(build_model("resnet_basic"), tmp_path / "big.onnx")
    assert list(tmp_path.iterdir()) == []


def test_write_to_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrtoptError, match="is a directory"):
        write_atomic(tmp_path, b"data")


# -- execution helper -----------------------------------------------------------------------------


def test_run_model_exposes_tensors_and_checks_inputs() -> None:
    model = build_model("resnet_basic")
    relu = next(n for n in model.graph.node if n.op_type == "Relu").output[0]
    result = run_model(model, feed(), expose=[relu])
    assert set(result) == {"output", relu} and (result[relu] >= 0).all()
    with pytest.raises(TrtoptError, match="no node produces it"):
        run_model(model, feed(), expose=["not_a_tensor"])
    with pytest.raises(ShapeError, match="Missing input"):
        run_model(model, {})
    with pytest.raises(TrtoptError, match="rejected the inputs"):
        run_model(model, feed((1, 16, 8)))


def test_token_ids_beyond_an_embedding_get_a_fix_about_values_and_no_second_log(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A Gather index out of range (token ids beyond a vocabulary: round 8's hostile .npz) is a data error,
    not a shape or dtype one; ONNX Runtime's own red log line is not printed beside trtopt's message."""
    from onnx import TensorProto, helper

    from trtopt.execution.ort_session import OrtSession

    table = helper.make_tensor("table", TensorProto.FLOAT, [4, 2], [0.0] * 8)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 2])], [table])  # fmt: skip
    session = OrtSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert session.run({"ids": np.array([[0, 3, 1]])})["y"].shape == (1, 3, 2)
    capfd.readouterr()
    with pytest.raises(TrtoptError, match="out of data bounds") as caught:
        session.run({"ids": np.array([[0, 1000, 1]])})
    assert "token ids are below the vocabulary size" in str(caught.value.fix)
    assert "ExecuteKernel" not in capfd.readouterr().err
