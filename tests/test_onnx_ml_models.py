"""Models with ONNX's classical-ML ops (domain ai.onnx.ml), as skl2onnx writes a scikit-learn pipeline: the CPU
backend builds them (ONNX Runtime runs those ops; trtopt quantises the MatMuls around them), the TensorRT backend
refuses them before any work, and a ZipMap output (a sequence of maps, not a tensor) is refused at load with the
converter option that avoids it.

    X [N, 16] ─ Scaler ─ MatMul ─ Add ─ Relu ─ MatMul ─ Add ─ Softmax ─ probabilities [N, 3]
                                                                   └─ ArgMax ─ label [N] (int64)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.cli.main import main

ML = helper.make_opsetid("ai.onnx.ml", 3)


def _pipeline(zipmap: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32), n)
             for n, s in [("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 3)), ("b2", (3,))]]  # fmt: skip
    nodes = [
        helper.make_node("Scaler", ["X"], ["scaled"], domain="ai.onnx.ml", offset=[0.5] * 16, scale=[2.0] * 16),
        helper.make_node("MatMul", ["scaled", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"]),
        helper.make_node("Add", ["z", "b2"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probabilities"]),
        helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
    ]  # fmt: skip
    outputs = [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
               helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 3])]  # fmt: skip
    if zipmap:
        nodes.append(helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                                      classlabels_int64s=[0, 1, 2]))  # fmt: skip
        seq = helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64,
                                              helper.make_tensor_type_proto(TensorProto.FLOAT, [])))  # fmt: skip
        outputs[1] = helper.make_value_info("output_probability", seq)
    graph = helper.make_graph(nodes, "pipeline", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 16])],
                              outputs, inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), ML])


def test_the_cpu_backend_builds_runs_and_verifies_a_classical_ml_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    onnx.save(_pipeline(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).uniform(0, 1, (64, 16)).astype(np.float32))
    argv = ["build", str(tmp_path / "m.onnx"), "--int8", "--backend", "cpu", "--calib", str(tmp_path / "x.npy")]
    assert main([*argv, "-o", str(tmp_path / "m.engine"), "--json"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["int8_layers"] == 1 and summary["verification"]["reference_vs_fp32"]["cosine"] > 0.999
    assert main(["run", str(tmp_path / "m.engine"), str(tmp_path / "x.npy"), "--count", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("output 'label': " in line for line in lines), lines  # an int64 class id


def test_the_tensorrt_backend_refuses_classical_ml_ops_before_any_work() -> None:
    from trtopt.backend.tensorrt.backend import _refuse_ml_ops
    from trtopt.errors import ModelError
    from trtopt.frontend import graph_from_onnx

    with pytest.raises(ModelError, match=r"1 op\(s\) of ONNX's classical-ML domain 'ai.onnx.ml' \(.*Scaler\)"):
        _refuse_ml_ops(graph_from_onnx(_pipeline()))


def test_a_zipmap_output_is_refused_with_the_converter_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    onnx.save(_pipeline(zipmap=True), tmp_path / "z.onnx")
    assert main(["build", str(tmp_path / "z.onnx"), "-o", str(tmp_path / "z.engine")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "graph output 'output_probability' is a sequence of maps, written by ZipMap node" in err
    assert "'zipmap': False" in err and not (tmp_path / "z.engine").exists()


def test_int8_on_a_model_with_nothing_to_quantise_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tree ensemble (skl2onnx's RandomForestClassifier writes one TreeEnsembleClassifier node): nothing for
    INT8, said as such rather than as a calibration API's "No tensors to calibrate"."""
    tree = helper.make_node(
        "TreeEnsembleClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[3, 0, 0], nodes_values=[0.5, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1], class_weights=[1.0, 1.0],
        classlabels_int64s=[0, 1],
    )  # fmt: skip
    outputs = [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
               helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 2])]  # fmt: skip
    graph = helper.make_graph([tree], "forest", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 16])],
                              outputs)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), ML]), tmp_path / "f.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).uniform(0, 1, (16, 16)).astype(np.float32))
    argv = ["build", str(tmp_path / "f.onnx"), "--backend", "cpu", "-o", str(tmp_path / "f.engine")]
    assert main([*argv, "--int8", "--calib", str(tmp_path / "x.npy")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Nothing in this model can run in INT8" in err and "TreeEnsembleClassifier" in err
    assert "without --int8" in err
    assert not (tmp_path / "f.engine").exists()
    assert main(argv) == 0  # the float plan builds and verifies
