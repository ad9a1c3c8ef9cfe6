"""Shared helpers for the pass tests: run a pass, check the graph is canonical, compare ORT outputs.

Tolerance. Every comparison runs both models in ONNX Runtime with its own graph optimisations off and
requires max|after - before| <= RTOL * max|before| per output. Passes change rounding, not maths:
BN folding rounds each scaled weight once (relative 2^-24) and moves the scale from after the
accumulation to before it; a wider conv may accumulate in another order. Both errors scale with the
output's magnitude, not with each element (cancellation makes small elements' relative error
meaningless), hence a bound relative to max|before|. Measured worst case over the zoo and the light
models (ResNet-50 included, 50 layers deep): 5e-7; RTOL = 1e-5 leaves a 20x margin, while a real bug
(a dropped bias, a wrong channel, a mis-broadcast scale) moves outputs by 1e-2 or more.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.execution.ort_session import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.passes import PASSES, PassReport

RTOL = 1e-5


def random_feeds(graph: gs.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in graph.inputs}


def max_relative_error(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> float:
    assert set(reference) == set(actual), f"outputs differ: {sorted(reference)} vs {sorted(actual)}"
    errors = []
    for name, ref in reference.items():
        assert actual[name].shape == ref.shape, name
        scale = max(float(np.abs(ref).max()), 1e-30)
        errors.append(float(np.abs(actual[name].astype(np.float64) - ref).max()) / scale)
    return max(errors)


def assert_same_outputs(before: onnx.ModelProto | gs.Graph, after: gs.Graph, seed: int = 0) -> float:
    feeds = random_feeds(after, seed)
    error = max_relative_error(
        run_model(before, feeds, opt_level="disable"), run_model(after, feeds, opt_level="disable")
    )
    assert error <= RTOL, f"outputs differ by {error:.2e} of their magnitude (tolerance {RTOL:.0e})"
    return error


def assert_canonical(graph: gs.Graph) -> onnx.ModelProto:
    """Unique non-empty names, topological order, a model onnx.checker accepts; returns that model (the graph
    exported), for a caller that compares it too (one export of a 550 MB model costs seconds)."""
    names = [n.name for n in graph.nodes]
    assert all(names) and len(set(names)) == len(names), names
    seen = {t.name for t in graph.inputs} | {
        name for name, t in graph.tensors().items() if isinstance(t, gs.Constant)
    }
    for node in graph.nodes:
        for tensor in node.inputs:
            assert not tensor.name or tensor.name in seen or isinstance(tensor, gs.Constant), (
                node.name,
                tensor.name,
            )
        seen.update(t.name for t in node.outputs)
    model = onnx_from_graph(graph)
    onnx.checker.check_model(model)
    return model


def run_pass(model: onnx.ModelProto, name: str) -> tuple[gs.Graph, PassReport]:
    """Load `model`, run pass `name` once, check canonical form and idempotence."""
    graph = graph_from_onnx(model)
    report = PASSES.get(name)(graph)
    assert_canonical(graph)
    snapshot = onnx_from_graph(graph).SerializeToString()
    again = PASSES.get(name)(graph)
    assert not again.changed, f"{name} is not idempotent: {again.summary()}"
    assert onnx_from_graph(graph).SerializeToString() == snapshot
    return graph, report


def ops(graph: gs.Graph) -> list[str]:
    return [n.op for n in graph.nodes]
