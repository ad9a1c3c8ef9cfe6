"""End to end on a real GPU: build tiny Q/DQ and FP16 models with TensorRT, run them with the runner,
compare with ONNX Runtime. Marked `gpu`: skipped with the reason where TensorRT or a GPU is missing,
failed instead under TRTOPT_REQUIRE_GPU=1 (see conftest.py)."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.backend import Profile, RunOptions
from trtopt.backend.tensorrt.builder import EngineOptions
from trtopt.plan import Plan, TensorSpec
from trtopt.quant.qdq import quantize_weight

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(0)


def qdq_conv_model(opset: int = 17) -> onnx.ModelProto:
    """x[N,3,16,16] -> Q -> DQ -+
    w(int8, per-channel) -> DQ -+-> Conv -> Relu -> GlobalAveragePool -> Flatten -> y[N,8]"""
    w = RNG.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    wq, ws = quantize_weight(w, axis=0)  # per output channel, as trtopt's quantizer writes it
    inits = [
        numpy_helper.from_array(wq, "wq"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
        numpy_helper.from_array(np.array(4.0 / 127, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.int8), "xz"),
        numpy_helper.from_array(RNG.normal(0, 0.1, 8).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def build_plan(model: onnx.ModelProto, max_batch: int = 8, **build: object) -> Plan:
    from trtopt.backend.tensorrt.builder import build as trt_build

    profile = Profile((1, 3, 16, 16), (max_batch, 3, 16, 16), (max_batch, 3, 16, 16))
    sections, versions = trt_build(model, EngineOptions(profiles={"x": profile}, **build))  # type: ignore[arg-type]
    return Plan(
        backend="tensorrt",
        inputs=(TensorSpec("x", (-1, 3, 16, 16), "float32"),),
        outputs=(TensorSpec("y", (-1, 8), "float32"),),
        sections=sections,
        versions=versions,
    )


def ort_run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def runner_for(plan: Plan, **options: object):  # type: ignore[no-untyped-def]
    from trtopt.backend.tensorrt.runner import create_runner

    return create_runner(plan, RunOptions(**options))  # type: ignore[arg-type]


def close_to(reference: np.ndarray, value: np.ndarray, tol: float) -> bool:
    return float(np.abs(reference - value).max()) <= tol * float(np.abs(reference).max())


def test_qdq_engine_matches_onnxruntime_across_dynamic_batches(tmp_path) -> None:
    model = qdq_conv_model()
    plan = build_plan(model, timing_cache=tmp_path / "timing.cache")
    assert (tmp_path / "timing.cache").stat().st_size > 0
    runner = runner_for(plan)
    try:
        for batch in (1, 3, 8):
            x = RNG.normal(size=(batch, 3, 16, 16)).astype(np.float32)
            y = runner.infer({"x": x})["y"]
            assert y.shape == (batch, 8) and y.dtype == np.float32
            # INT8 kernels round like ORT's up to one quantisation step on some inputs.
            assert close_to(ort_run(model, x), y, 2e-2)
        _, ms = runner.timed_infer({"x": x})
        assert ms > 0
    finally:
        runner.close()


def test_fp16_build_and_cuda_graphs(tmp_path) -> None:
    model = qdq_conv_model(opset=19)
    plan = build_plan(model, fp16=True)
    runner = runner_for(plan, cuda_graph=True)
    try:
        x = RNG.normal(size=(2, 3, 16, 16)).astype(np.float32)
        first, second = runner.infer({"x": x})["y"], runner.infer({"x": x})["y"]  # capture, then replay
        np.testing.assert_array_equal(first, second)
        assert close_to(ort_run(model, x), first, 3e-2)
    finally:
        runner.close()


def test_threads_get_their_own_contexts() -> None:
    model = qdq_conv_model()
    runner = runner_for(build_plan(model))
    xs = [RNG.normal(size=(4, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(5):
            results[i] = runner.infer({"x": xs[i]})["y"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        for i, x in enumerate(xs):
            assert close_to(ort_run(model, x), results[i], 2e-2)
    finally:
        runner.close()


def test_device_array_input_is_zero_copy() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (not a trtopt dependency)")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA: no device array to pass")
    model = qdq_conv_model()
    runner = runner_for(build_plan(model))
    try:
        x = RNG.normal(size=(2, 3, 16, 16)).astype(np.float32)
        y = runner.infer({"x": torch.from_numpy(x).cuda()})["y"]
        assert close_to(ort_run(model, x), y, 2e-2)
    finally:
        runner.close()
