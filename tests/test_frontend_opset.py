"""Models outside opsets 11-22 are converted with onnx's version converter (trtopt.frontend.opset), and the
converted, optimised or built model computes what the original computes, run by ONNX Runtime directly."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_files import save, unconvertible_scan, with_opset
from pass_helpers import RTOL, max_relative_error

from trtopt.cli.main import main
from trtopt.engine import Engine
from trtopt.errors import ModelError
from trtopt.execution.ort_session import run_model
from trtopt.frontend import MAX_OPSET, load_model
from trtopt.zoo.light import LIGHT_NAMES, light_model, light_path

FAST_LIGHT = [n for n in LIGHT_NAMES if n != "vgg19"]  # VGG-19 is 550 MB of weights
LIGHT_PARAMS = [*FAST_LIGHT, pytest.param("vgg19", marks=pytest.mark.slow)]


def ort_outputs(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The original model, run by ONNX Runtime itself (no trtopt loading in between)."""
    data = model.read_bytes() if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def image_feed(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    return {name: np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)}


@pytest.mark.parametrize("name", LIGHT_PARAMS)
def test_light_file_converts_to_opset_13(name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The files as shipped: opset 9, IR 3, every weight also listed as a graph input."""
    with caplog.at_level(logging.WARNING, logger="trtopt.frontend"):
        loaded = load_model(light_path(name))
    assert (loaded.source_opset, loaded.opset) == (9, 13)
    assert len(loaded.model.graph.input) == 1, "IR 3 initializer inputs are weights, not inputs"
    assert [r.getMessage() for r in caplog.records if "converted" in r.getMessage()] == [
        f"{light_path(name)} uses ONNX opset 9; converted it to opset 13 with onnx's version converter "
        "(trtopt works on opsets 11 to 22)"
    ]
    feeds = image_feed(loaded.model.graph.input[0].name)
    assert max_relative_error(ort_outputs(light_path(name), feeds), run_model(loaded.model, feeds)) <= RTOL


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST_LIGHT)  # VGG-19's optimize run is tests/test_optimize_pipeline.py's
def test_cli_optimize_and_build_of_an_opset_9_model_match_the_original(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Random weights (light_model) at opset 9, so every layer counts; FP32 optimise and build via the CLI."""
    original = save(light_model(name, opset=9, seed=1), tmp_path / f"{name}.onnx")
    assert onnx.load(original).opset_import[0].version == 9
    assert main(["optimize", str(original), "-o", str(tmp_path / "opt.onnx"), "--json"]) == 0
    assert main(["build", str(original), "--backend", "cpu", "-o", str(tmp_path / "plan.engine"), "--json"]) == 0
    assert "converted it to opset 13" in caplog.text
    feeds = image_feed(onnx.load(original).graph.input[0].name)
    reference = ort_outputs(original, feeds)
    assert max_relative_error(reference, ort_outputs(tmp_path / "opt.onnx", feeds)) <= RTOL
    with Engine.load(tmp_path / "plan.engine") as engine:
        assert max_relative_error(reference, engine.infer(feeds)) <= RTOL


def test_cli_int8_build_of_an_opset_9_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    original = save(light_model("shufflenet", opset=9, seed=2), tmp_path / "shufflenet.onnx")
    name = onnx.load(original).graph.input[0].name
    data = np.random.default_rng(3).uniform(0, 1, (2, 3, 224, 224)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", **{name: data})
    plan = tmp_path / "int8.engine"
    args = ["build", str(original), "--int8", "--calib", str(tmp_path / "calib.npz"), "--backend", "cpu"]
    assert main([*args, "-o", str(plan), "--json"]) == 0
    assert "converted it to opset 13" in caplog.text
    feeds = {name: data[:1]}
    reference = next(iter(ort_outputs(original, feeds).values())).ravel()
    with Engine.load(plan) as engine:
        assert engine.plan.metadata.quant is not None and engine.plan.metadata.quant.int8_layers
        actual = next(iter(engine.infer(feeds).values())).ravel()
    cosine = float(reference @ actual / (np.linalg.norm(reference) * np.linalg.norm(actual)))
    assert cosine > 0.99, cosine


@pytest.mark.parametrize("opset", [11, 12])
def test_int8_builds_convert_opset_11_and_12_in_the_same_place(opset: int, caplog: pytest.LogCaptureFixture) -> None:
    """The warning says why a supported opset is converted (round 12's hunt: "uses ONNX opset 11; converted it
    to opset 13 ... (trtopt works on opsets 11 to 22)" read as a contradiction)."""
    model = with_opset(17)
    model.opset_import[0].version = opset
    save_bytes = model.SerializeToString()
    with caplog.at_level(logging.WARNING, logger="trtopt.frontend"):
        assert load_model(save_bytes).opset == opset, "FP32 work keeps the opset"
        assert "converted" not in caplog.text
        assert load_model(save_bytes, min_opset=13).opset == 13
    (said,) = [r.getMessage() for r in caplog.records if "converted" in r.getMessage()]
    assert said.endswith(f"uses ONNX opset {opset}; converted it to opset 13 with onnx's version converter (an "
                         "INT8 build needs opset 13 or newer: per-channel QuantizeLinear / DequantizeLinear)")


@pytest.mark.parametrize("opset", range(MAX_OPSET + 1, onnx.defs.onnx_opset_version() + 1))
def test_newer_opsets_known_to_onnx_convert_down_to_22(opset: int) -> None:
    """resnet_basic's ops are unchanged from 22 on, so the down-conversion is exact."""
    model = with_opset(opset)
    model.ir_version = onnx.helper.find_min_ir_version_for([model.opset_import[0]])
    loaded = load_model(model.SerializeToString())
    assert (loaded.source_opset, loaded.opset) == (opset, MAX_OPSET)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"input": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    assert max_relative_error(ort_outputs(model, feeds), run_model(loaded.model, feeds)) <= RTOL


def test_unconvertible_model_is_a_model_error() -> None:
    """The model is valid and ONNX Runtime runs it; only the conversion is impossible."""
    model = unconvertible_scan()
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(ModelError, match="could not convert it to opset 13: .*Unsupported conversion") as info:
        load_model(model.SerializeToString())
    assert "Re-export the model with an opset from 13 to 22" in (info.value.fix or "")


@pytest.mark.parametrize("command", ["optimize", "build", "calibrate", "inspect"])
def test_cli_unconvertible_model_is_a_clean_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(unconvertible_scan(), tmp_path / "scan8.onnx")
    extra = {"optimize": ["-o", "x.onnx"], "build": ["-o", "x.engine"], "calibrate": ["--calib", "x", "-o", "c.json"]}
    code = main([command, str(path), *extra.get(command, [])])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert re.match(r"error: .*opset 8; .*could not convert it to opset 13.*\nfix: Re-export", err, re.S), err


def _legacy_net(opset: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A small 2017-style network at `opset` (1 to 6) and the same one spelt at opset 13 (the reference):
    Conv, BatchNormalization, a per-channel bias added with the old `broadcast=1, axis=1`, Relu, MaxPool,
    Dropout, Reshape, Gemm, Softmax. At opset 3 BatchNormalization has `consumed_inputs` and Reshape its shape
    as an attribute, as the first ONNX model zoo's files did."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    arrays = {"W1": rng.standard_normal((16, 3, 3, 3)) * 0.1, "b1": rng.standard_normal(16) * 0.1,
              "s": np.abs(rng.standard_normal(16)) + 0.5, "bb": rng.standard_normal(16) * 0.1,
              "m": rng.standard_normal(16) * 0.1, "v": np.abs(rng.standard_normal(16)) + 0.5,
              "W2": rng.standard_normal((10, 1024)) * 0.05, "b2": rng.standard_normal(10) * 0.1,
              "bias": rng.standard_normal(16)}  # fmt: skip
    weights = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    bn = {"consumed_inputs": [0, 0, 0, 1, 1], "is_test": 1} if opset < 6 else {"is_test": 1}
    shape = [numpy_helper.from_array(np.array([1, -1], np.int64), "shape")] if opset >= 5 else []
    reshape = (helper.make_node("Reshape", ["d", "shape"], ["f"]) if opset >= 5
               else helper.make_node("Reshape", ["d"], ["f"], shape=[1, -1]))  # fmt: skip
    nodes = [helper.make_node("Conv", ["data", "W1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["bn"], epsilon=1e-5, **bn),
             helper.make_node("Add", ["bn", "bias"], ["a"], broadcast=1, axis=1),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Dropout", ["p"], ["d"], is_test=1, ratio=0.5), reshape,
             helper.make_node("Gemm", ["f", "W2", "b2"], ["g"], transB=1, broadcast=1),
             helper.make_node("Softmax", ["g"], ["prob"])]  # fmt: skip
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 32, 32])
    prob = helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])
    listed = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in weights + shape]  # IR 3
    old = helper.make_model(helper.make_graph(nodes, "legacy", [data, *listed], [prob], weights + shape),
                            opset_imports=[helper.make_opsetid("", opset)], ir_version=3)  # fmt: skip
    per_channel = numpy_helper.from_array(arrays["bias"].astype(np.float32).reshape(16, 1, 1), "bias")
    new_nodes = [onnx.NodeProto() for _ in nodes]
    for new, node in zip(new_nodes, nodes, strict=True):
        new.CopyFrom(node)
        del new.attribute[:]
        new.attribute.extend(a for a in node.attribute if a.name not in ("consumed_inputs", "is_test", "broadcast",
                                                                          "axis", "shape", "ratio"))  # fmt: skip
    new_nodes[6] = helper.make_node("Reshape", ["d", "shape"], ["f"])
    new_weights = [w for w in weights if w.name != "bias"] + [per_channel, numpy_helper.from_array(
        np.array([1, -1], np.int64), "shape")]  # fmt: skip
    new = helper.make_model(helper.make_graph(new_nodes, "opset13", [data], [prob], new_weights),
                            opset_imports=[helper.make_opsetid("", 13)])  # fmt: skip
    return old, new


@pytest.mark.parametrize("opset", [1, 3, 6])
def test_legacy_broadcasting_keeps_its_meaning(opset: int, tmp_path: Path) -> None:
    """onnx's converter alone turns the axis-1 bias into [16, 1, 1, 1] (the sum comes out [16, 16, 8, 8] and the
    Gemm refuses it); at opset 3 it cannot convert at all ("Shape of input 0 is not available"). The plan must
    compute what the opset-13 spelling of the same network computes."""
    old, new = _legacy_net(opset)
    onnx.checker.check_model(old)
    onnx.save(old, tmp_path / "legacy.onnx")
    assert main(["build", str(tmp_path / "legacy.onnx"), "-o", str(tmp_path / "plan.engine")]) == 0
    feeds = image_feed("data")
    feeds["data"] = feeds["data"][:, :, :32, :32].copy()
    want = ort_outputs(new, feeds)["prob"]
    got = Engine.load(tmp_path / "plan.engine")(feeds["data"])
    assert got.shape == want.shape
    assert max_relative_error({"prob": want}, {"prob": got}) < RTOL


@pytest.mark.parametrize("opset", [6, 8])
def test_experimental_ops_are_spelt_with_standard_ones(opset: int, tmp_path: Path) -> None:
    """ImageScaler, Scale, Affine, ScaledTanh and ParametricSoftplus (ONNX's experimental ops, dropped in opset 10;
    ImageScaler is Tiny YOLOv2's first node in the old model zoo) were refused as custom ops. Built now, the plan
    computes their definitions, checked against numpy."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((4, 3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("ImageScaler", ["x"], ["a"], scale=1 / 255, bias=[-0.5, -0.25, 0.5]),
             helper.make_node("Conv", ["a", "w"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Scale", ["b"], ["c"], scale=2.0),
             helper.make_node("Affine", ["c"], ["d"], alpha=0.5, beta=0.1),
             helper.make_node("ScaledTanh", ["d"], ["e"], alpha=1.5, beta=0.7),
             helper.make_node("ParametricSoftplus", ["e"], ["y"], alpha=0.8, beta=1.2)]  # fmt: skip
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    w_info = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 1, 1])
    graph = helper.make_graph(nodes, "experimental", [x_info, w_info],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(weight, "w")])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=3),
              tmp_path / "old.onnx")  # fmt: skip
    assert main(["build", str(tmp_path / "old.onnx"), "-o", str(tmp_path / "plan.engine")]) == 0
    x = np.random.default_rng(1).uniform(0, 255, (1, 3, 8, 8)).astype(np.float32)
    a = x / 255 + np.array([-0.5, -0.25, 0.5], np.float32).reshape(3, 1, 1)
    d = 0.5 * (2.0 * np.einsum("oc,nchw->nohw", weight[:, :, 0, 0], a)) + 0.1
    want = 0.8 * np.log1p(np.exp(1.2 * (1.5 * np.tanh(0.7 * d))))
    got = Engine.load(tmp_path / "plan.engine")(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _one_op(op: str, opset: int, out: list[int] | None, *inputs: np.ndarray, **attrs: object) -> onnx.ModelProto:
    """x [2, 3, 4, 5] -> `op` -> y at `opset`; `inputs` are its further inputs, as initializers."""
    from onnx import TensorProto, helper, numpy_helper

    extra = [numpy_helper.from_array(a, f"c{i}") for i, a in enumerate(inputs)]
    node = helper.make_node(op, ["x", *(t.name for t in extra)], ["y"], **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], extra)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


UP2 = np.array([1, 1, 2, 2], np.float32)
CHANGED_MEANING = {  # op whose semantics changed at some opset, as written at its old opset
    "Softmax axis 1 (flattened until 13)": _one_op("Softmax", 11, [2, 3, 4, 5], axis=1),
    "Hardmax axis 1 (flattened until 13)": _one_op("Hardmax", 11, [2, 3, 4, 5], axis=1),
    "Hardmax default axis": _one_op("Hardmax", 12, [2, 3, 4, 5]),
    "Resize-10 linear (asymmetric until 11)": _one_op("Resize", 10, [2, 3, 8, 10], UP2, mode="linear"),
    "Resize-10 nearest x1.5": _one_op("Resize", 10, None, np.array([1, 1, 1.5, 1.5], np.float32), mode="nearest"),
    "Resize-10 nearest down": _one_op("Resize", 10, None, np.array([1, 1, 0.5, 0.6], np.float32), mode="nearest"),
    "Upsample-9 linear": _one_op("Upsample", 9, [2, 3, 8, 10], UP2, mode="linear"),
    "Upsample-7 nearest": _one_op("Upsample", 7, [2, 3, 8, 10], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]),
    "PRelu-6 per-channel slope": _one_op("PRelu", 6, [2, 3, 4, 5], np.array([0.1, 0.2, 0.3], np.float32)),
}


@pytest.mark.parametrize("name", list(CHANGED_MEANING))
def test_conversion_keeps_what_changed_meaning(name: str) -> None:
    """onnx's converter alone changes every case here but Softmax (Hardmax keeps a flattened axis; Resize-10's
    pixels move by half; a PRelu slope meets the last axis). ONNX Runtime runs the original at its own opset
    (PRelu-6 has no kernel: numpy gives its meaning); the converted model must compute the same."""
    from trtopt.frontend.opset import model_at_opset

    model = CHANGED_MEANING[name]
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    if name.startswith("PRelu"):
        want = np.where(x < 0, x * np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1), x)
    else:
        want = ort_outputs(model, {"x": x})["y"]
    converted = model_at_opset(model, model.opset_import[0].version, name, min_opset=13)
    got = ort_outputs(converted, {"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
