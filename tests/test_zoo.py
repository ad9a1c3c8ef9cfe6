"""The code-built model zoo: every model builds, passes onnx.checker, runs in ONNX Runtime with
finite, input-dependent outputs, honours batch/opset, and is deterministic for a seed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtopt.errors import ModelError, UnknownNameError
from trtopt.execution import run_model
from trtopt.zoo import NAMES, build_model

EXPECTED = {
    "resnet_basic",
    "resnet_bottleneck",
    "inception",
    "inception_pool_net",
    "mobilenetv2_block",
    "classifier_head",
    "bn_standalone",
    "pad_conv",
    "nhwc_port",
    "nhwc_port_prelu",
    "grouped_conv",
    "silu_block",
    "tiny_cnn",
}


def input_shape(model: onnx.ModelProto) -> list[int]:
    return [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def random_feed(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal(input_shape(model)).astype(np.float32)
    return {"input": x}


def test_names_cover_every_family() -> None:
    assert set(NAMES) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builds_checks_and_runs(name: str) -> None:
    model = build_model(name)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["input"]
    assert all(d > 0 for d in input_shape(model)), "input shape must be static"
    assert model.ir_version == 10 and model.opset_import[0].version == 17

    first = run_model(model, random_feed(model, seed=1))
    second = run_model(model, random_feed(model, seed=2))
    assert set(first) == {o.name for o in model.graph.output}
    for out_name, value in first.items():
        assert np.isfinite(value).all(), out_name
        assert np.abs(value).mean() > 1e-2, f"{out_name} is ~0"
        assert value.std() > 1e-2, f"{out_name} is constant"
        assert not np.allclose(value, second[out_name], atol=1e-3), f"{out_name} does not depend on the input"


@pytest.mark.parametrize("opset", [11, 13, 21])
@pytest.mark.parametrize("name", ["tiny_cnn", "silu_block", "mobilenetv2_block", "pad_conv"])
def test_opsets(name: str, opset: int) -> None:
    model = build_model(name, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == opset
    reference = run_model(build_model(name), random_feed(model))
    outputs = run_model(model, random_feed(model))
    for key, value in outputs.items():  # same seed, same weights: the opset changes no numbers
        np.testing.assert_allclose(value, reference[key], rtol=1e-4, atol=1e-4)


def test_hard_swish_is_decomposed_before_opset_14() -> None:
    ops_13 = {n.op_type for n in build_model("silu_block", opset=13).graph.node}
    ops_14 = {n.op_type for n in build_model("silu_block", opset=14).graph.node}
    assert "HardSwish" not in ops_13 and "HardSwish" in ops_14


def test_batch() -> None:
    model = build_model("tiny_cnn", batch=3)
    assert input_shape(model)[0] == 3
    assert run_model(model, random_feed(model))["logits"].shape == (3, 10)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_deterministic_for_a_seed(name: str) -> None:
    assert build_model(name, seed=5).SerializeToString() == build_model(name, seed=5).SerializeToString()
    weights_a = [numpy_helper.to_array(t) for t in build_model(name, seed=5).graph.initializer]
    weights_b = [numpy_helper.to_array(t) for t in build_model(name, seed=6).graph.initializer]
    assert any(a.size > 4 and not np.array_equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))


def test_weights_are_realistic() -> None:
    model = build_model("tiny_cnn")
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            scale, bias, mean, var = (values[n] for n in node.input[1:5])
            assert scale.std() > 0.1 and np.abs(bias).max() > 0.05
            assert np.abs(mean).max() > 0.1 and np.abs(var - 1).max() > 0.1 and (var > 0).all()
        if node.op_type == "Conv":
            weight = values[node.input[1]]
            fan_in = int(np.prod(weight.shape[1:]))
            assert weight.std() == pytest.approx(np.sqrt(2 / fan_in), rel=0.35)  # He init
            if len(node.input) > 2:
                assert np.abs(values[node.input[2]]).max() > 0.05


def test_inception_has_matching_1x1_siblings() -> None:
    model = build_model("inception")
    readers = [n for n in model.graph.node if n.op_type == "Conv" and n.input[0] == "input"]
    kernels = sorted(next(a.ints for a in n.attribute if a.name == "kernel_shape")[0] for n in readers)
    assert kernels == [1, 1, 1, 3]


def test_bad_names_and_opsets() -> None:
    with pytest.raises(UnknownNameError, match="tiny_cnn"):
        build_model("resnet50")
    with pytest.raises(ModelError, match="11 to 21"):
        build_model("tiny_cnn", opset=9)
