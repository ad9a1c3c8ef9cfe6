"""An INT8 build of a model that computes in float16 or float64 is refused before any work, with what to do
(trtopt.quant.float_types); the same model still builds FP32. It used to calibrate, then fail with "The built plan
is not valid: Type Error ... QuantizeLinear" and blame trtopt's passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.cli.main import main

TYPES = {"float16": (np.float16, TensorProto.FLOAT16), "float64": (np.float64, TensorProto.DOUBLE)}


def _conv_net(kind: str, path: Path) -> None:
    dtype, elem = TYPES[kind]
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((32, 3, 3, 3)) * 0.2).astype(dtype), "w1"),
               numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(dtype), "w2")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]  # fmt: skip
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", elem, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", elem, ["N", 32, 16, 16])], weights)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("kind", list(TYPES))
def test_int8_refuses_and_fp32_builds(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, data = tmp_path / "model.onnx", tmp_path / "calib.npy"
    _conv_net(kind, model)
    np.save(data, np.random.default_rng(1).standard_normal((16, 3, 16, 16)).astype(TYPES[kind][0]))
    assert main(["build", str(model), "--int8", "--calib", str(data), "-o", str(tmp_path / "int8.engine")]) == 2
    err = capsys.readouterr().err
    assert f"input 'x' is {kind}; 2 {kind} weights" in err and "float32 model" in err and "Traceback" not in err
    assert not (tmp_path / "int8.engine").exists()
    if kind == "float16":  # ONNX Runtime has no float64 Conv kernel: that FP32 build is refused by its own error
        assert main(["build", str(model), "-o", str(tmp_path / "fp32.engine")]) == 0
