"""Tensors whose whole range is tiny (issue #45: a MobileNetV3 with random weights has logits about 1e-9).

Backends whose scales are float32 (CPU, OpenVINO) keep such a tensor's own grid (`QuantConfig.min_amax`,
`trtopt.calib.thresholds.FP32_AMAX`); the TensorRT form keeps the floor FP16 can hold (`ZERO_AMAX`), under which a
tensor of 1e-7 rounds to zero. Checked numerically in ONNX Runtime against the float model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from quant_helpers import cosine, cpu_config

from trtopt.backend.cpu.builder import exact_encoding
from trtopt.backend.cpu.lowering import lower_for_cpu
from trtopt.calib.cache import check_cache_matches
from trtopt.calib.calibration import Calibration
from trtopt.calib.thresholds import FP32_AMAX, ZERO_AMAX
from trtopt.errors import CalibrationError
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import optimize
from trtopt.quant import QuantConfig, insert_qdq, plan_quantization
from trtopt.zoo.builder import GraphBuilder

SCALE = 1e-7  # the inputs' magnitude: every activation of the bias-free net below is about this small


def tiny_net(bias: bool = False) -> tuple[object, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Conv 3->16 ReLU, Conv 16->16 ReLU, pool (without biases, activations scale with the input); its optimised
    graph, calibration feeds and check feeds, all of magnitude `SCALE`. `bias`: the second conv has a bias of
    about 0.1, which int32 cannot hold at the scale of its tiny input times its weights' scale."""
    b = GraphBuilder("tiny", seed=0)
    y = b.relu(b.conv(b.input("input", [2, 3, 8, 8]), 3, 16, 3, bias=False))
    y = b.relu(b.conv(y, 16, 16, 3, bias=bias))
    model = b.build([b.node("Flatten", [b.node("GlobalAveragePool", [y])], out="pooled")])
    graph = optimize(graph_from_onnx(model)).graph
    rng = np.random.default_rng(0)
    calib, check = ({"input": (rng.standard_normal((2, 3, 8, 8)) * SCALE).astype(np.float32)} for _ in range(2))
    return graph, calib, check


def int8_outputs(config: QuantConfig, bias: bool = False) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """FP32's and the Q/DQ model's outputs on the check feeds, and the thresholds (max|x| on the calibration
    feeds)."""
    graph, calib, check = tiny_net(bias)
    plan = plan_quantization(graph, config)
    fp32 = onnx_from_graph(graph)
    acts = run_model(fp32, calib, expose=plan.activation_tensors)
    amax = {t: float(np.abs(acts[t]).max()) for t in plan.activation_tensors}
    insert_qdq(graph, plan, amax, min_amax=config.min_amax)
    return run_model(fp32, check)["pooled"], run_model(onnx_from_graph(graph), check)["pooled"], amax


def test_fp32_backends_keep_a_tiny_tensors_own_grid() -> None:
    config = cpu_config(QuantConfig(min_channels=1))
    assert config.min_amax == FP32_AMAX < ZERO_AMAX * 1e-20
    fp32, quantized, amax = int8_outputs(config)
    assert max(amax.values()) < 1e-5  # the net is tiny indeed, far below ZERO_AMAX
    assert cosine(fp32, quantized) > 0.99


def test_a_tiny_input_beside_a_large_bias_gets_the_grid_at_which_int32_holds_the_bias() -> None:
    """ONNX Runtime quantises a conv's bias to int32 at s_x * s_w, clipping: at the input's own scale (~1e-9) a bias
    of 0.1 would not fit, and the plan's outputs came out 10x too small. The input's threshold is raised instead."""
    graph, calib, check = tiny_net(bias=True)
    config = cpu_config(QuantConfig(min_channels=1))
    plan = plan_quantization(graph, config)
    fp32 = onnx_from_graph(graph)
    acts = run_model(fp32, calib, expose=plan.activation_tensors)
    amax = {t: float(np.abs(acts[t]).max()) for t in plan.activation_tensors}
    insert_qdq(graph, plan, amax, min_amax=config.min_amax)
    model = onnx_from_graph(graph)
    lowered = lower_for_cpu(model, encoding=exact_encoding())  # the encoding this CPU's kernels run exactly
    assert sum(t.name.endswith("/int32") for t in lowered.graph.initializer) == 1  # the biased conv's, int32
    reference = run_model(lowered, check, opt_level="disable")["pooled"]  # what the kernels are to compute
    kernels = run_model(lowered, check)["pooled"]
    assert cosine(reference, kernels) > 0.9999 and cosine(run_model(fp32, check)["pooled"], kernels) > 0.99


def test_the_fp16_floor_loses_such_a_tensor() -> None:
    """What the CPU form fixes: with TensorRT's floor every activation of 1e-7 rounds to 0."""
    fp32, quantized, _ = int8_outputs(QuantConfig(min_channels=1))
    assert np.abs(fp32).max() > 0 and not np.any(quantized)


def test_openvino_plans_keep_the_fp32_floor_too() -> None:
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    from trtopt.backend import get_backend

    assert get_backend("openvino").quant_config(QuantConfig()).min_amax == FP32_AMAX


def test_a_cache_takes_tiny_thresholds_and_refuses_absurd_ones() -> None:
    calibration = Calibration(amax={"a": 1e-12, "b": 0.5}, method="max")
    check_cache_matches(calibration, ["a", "b"])
    with pytest.raises(CalibrationError, match="outside"):
        check_cache_matches(replace(calibration, amax={"a": 1e-30, "b": 0.5}), ["a", "b"])
