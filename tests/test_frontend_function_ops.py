"""Ops introduced after opset 22 that ONNX defines as functions are replaced by their bodies, so that the model
converts down to trtopt's opsets (trtopt.frontend.function_ops). They used to be refused ("could not convert it
to opset 22: ... no previous version").

    x [2, 8, 16] -> MatMul(wq) -> q --\\
                 -> MatMul(wk) -> k ---> Attention(q_num_heads=kv_num_heads=2) -> RMSNormalization(scale) -> y
                 -> MatMul(wv) -> v --/
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.cli.main import main
from trtopt.engine import Engine
from trtopt.execution import run_model
from trtopt.frontend import load_model


def _attention_block(opset: int = 23) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((16, 16)) / 4).astype(np.float32), name)
               for name in ("wq", "wk", "wv")]  # fmt: skip
    weights.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), "scale"))
    nodes = [
        *(helper.make_node("MatMul", ["x", f"w{t}"], [t]) for t in "qkv"),
        helper.make_node("Attention", ["q", "k", "v"], ["a"], q_num_heads=2, kv_num_heads=2),
        helper.make_node("RMSNormalization", ["a", "scale"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16])], weights)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_new_ops_load_as_their_function_bodies(tmp_path: Path) -> None:
    model = _attention_block()
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, tmp_path / "model.onnx")
    loaded = load_model(tmp_path / "model.onnx")
    assert (loaded.source_opset, loaded.opset) == (23, 22)
    ops = {n.op_type for n in loaded.model.graph.node}
    assert not ops & {"Attention", "RMSNormalization"} and {"Softmax", "MatMul"} <= ops
    x = np.random.default_rng(1).standard_normal((2, 8, 16)).astype(np.float32)
    want, got = run_model(model, {"x": x})["y"], run_model(loaded.model, {"x": x})["y"]  # ONNX Runtime runs both
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int8_build_of_an_opset_23_attention_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(model := _attention_block(), path := tmp_path / "model.onnx")
    rng = np.random.default_rng(2)
    np.save(data := tmp_path / "calib.npy", rng.standard_normal((16, 8, 16)).astype(np.float32))
    assert main(["build", str(path), "--int8", "--calib", str(data), "-o", str(plan := tmp_path / "p.engine")]) == 0
    assert "equals the model file" in capsys.readouterr().out  # the graph check ran against the opset-23 file
    x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    with Engine.load(plan) as engine:
        got = engine(x)
    want = run_model(model, {"x": x})["y"]
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


def test_an_op_without_a_function_body_is_still_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CumProd (opset 26) has no function body and no older form: the converter's refusal, with what to do."""
    node = helper.make_node("CumProd", ["x", "axis"], ["y"])
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    graph = helper.make_graph([node], "cumprod", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [axis])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)]), path := tmp_path / "m.onnx")
    assert main(["build", str(path), "-o", str(tmp_path / "p.engine")]) == 2
    err = capsys.readouterr().err
    assert "could not convert it to opset 22" in err and "Re-export" in err and "Traceback" not in err
