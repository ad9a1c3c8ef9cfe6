"""Shared helpers for the quantisation tests: quantise a zoo model with max thresholds from random data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import optimize
from trtopt.quant import QdqReport, QuantConfig, QuantPlan, insert_qdq, plan_quantization
from trtopt.zoo import build_model


def feeds_for(graph: gs.Graph, seed: int = 0, batch: int | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in graph.inputs:
        shape = list(t.shape)
        if batch is not None:
            shape[0] = batch
        feeds[t.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def optimized_zoo_graph(name: str) -> gs.Graph:
    return optimize(graph_from_onnx(build_model(name))).graph


def quantize(
    graph: gs.Graph, config: QuantConfig | None = None, seed: int = 0
) -> tuple[onnx.ModelProto, QuantPlan, QdqReport]:
    """Plan, calibrate with max|x| over a few random inputs, insert Q/DQ; returns the quantised model."""
    config = config or QuantConfig(min_channels=1)
    plan = plan_quantization(graph, config)
    fp32 = onnx_from_graph(graph)
    amax: dict[str, float] = {}
    for s in range(3):
        acts = run_model(fp32, feeds_for(graph, seed + s), expose=plan.activation_tensors)
        for t in plan.activation_tensors:
            amax[t] = max(amax.get(t, 0.0), float(np.abs(acts[t]).max()))
    work = graph.copy()
    report = insert_qdq(work, plan, amax)
    return onnx_from_graph(work), plan, report


def cpu_config(config: QuantConfig | None = None) -> QuantConfig:
    """The CPU backend's form of `config` (quantised layer outputs, past the activations ONNX Runtime folds),
    with `float_leading_depthwise` left as given."""
    from trtopt.backend import get_backend

    config = config or QuantConfig(min_channels=1)
    return replace(get_backend("cpu").quant_config(config), float_leading_depthwise=config.float_leading_depthwise)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def assert_plan_computes(graph: gs.Graph, model: onnx.ModelProto, lowered: onnx.ModelProto, output: str,
                         seed: int = 3) -> None:  # fmt: skip
    """The lowered CPU plan computes its Q/DQ model (run as float math) and stays close to the float graph."""
    feeds = feeds_for(graph, seed=seed)
    reference = run_model(onnx_from_graph(graph), feeds)[output]
    qdq_form = run_model(model, feeds, opt_level="disable")[output]  # what the plan means, as float math
    cpu_form = run_model(lowered, feeds)[output]
    assert cosine(qdq_form, cpu_form) > 0.999
    assert cosine(reference, cpu_form) > 0.99


def float_math(model: onnx.ModelProto, x: np.ndarray, name: str = "x") -> list[np.ndarray]:
    """`model`'s outputs for its input `name` = `x`, ONNX Runtime's optimisations off: a Q/DQ graph as float math."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {name: x})  # type: ignore[no-any-return]


def copied(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def assert_left_alone(model: onnx.ModelProto, rewrite: Callable[[onnx.ModelProto], int], x: np.ndarray) -> None:
    """`rewrite` (a pass that edits a model in place and says how many places it changed) changes nothing in
    `model`, a model ONNX Runtime runs."""
    rewritten = copied(model)
    assert rewrite(rewritten) == 0
    assert rewritten == model
    assert all(np.isfinite(out).all() for out in float_math(model, x))
