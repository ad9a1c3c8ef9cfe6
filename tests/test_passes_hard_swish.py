"""rewrite_hard_swish: HardSwish and HardSigmoid spelt in Clip arithmetic (Add, Clip, Mul, Div) become the ops, as
the CPU backend's passes run it; checked numerically in ONNX Runtime against the graph before, then through a CPU
plan whose ONNX Runtime graph runs them as QLinearAdd / QLinearMul."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, run_pass
from quant_helpers import cosine, cpu_config, feeds_for, quantize

from trtopt.backend import get_backend
from trtopt.backend.cpu.builder import kernel_report
from trtopt.backend.cpu.lowering import lower_for_cpu
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx
from trtopt.passes import optimize
from trtopt.quant import QuantConfig
from trtopt.zoo import GraphBuilder


def _clip_spelt_block(opset: int, *, div: bool = True, folded_offset: bool = False) -> onnx.ModelProto:
    """HardSwish as PyTorch wrote it before opset 14, and a squeeze-excite gate with its + 3 in the conv's bias
    (``folded_offset``) or as an Add; ``div``: / 6 as a Div, else a Mul by 1/6::

        input ─ Conv1x1 ─ x ─┬─ Add(3) ─ Clip(0, 6) ─ Mul ─ Div(6) ─ dw Conv3x3 ─ y ─┬───────── Mul ─ Conv1x1 ─ output
                             └──────────────────────────┘                               └─ GAP ─ Conv ─ gate ─┘
        gate: [Add(3)] ─ Clip(0, 6) ─ Div(6)
    """
    b = GraphBuilder("clip_spelt", seed=0, opset=opset)

    def scaled(t: str) -> str:
        return (b.node("Div", [t, b.const("six", np.array(6.0, np.float32))]) if div
                else b.node("Mul", [t, b.const("sixth", np.array(1 / 6, np.float32))]))  # fmt: skip

    def clip(t: str) -> str:
        return b.clip(t, 0.0, 6.0)

    x = b.conv(b.input("input", [2, 16, 10, 10]), 16, 32, 1)
    y = b.conv(scaled(b.mul(x, clip(b.add(x, b.const("three", np.array(3.0, np.float32)))))), 32, 32, 3, group=32)
    g = b.conv(b.node("GlobalAveragePool", [y]), 32, 32, 1)
    g = g if folded_offset else b.add(g, b.const("three", np.array(3.0, np.float32)))
    return b.build([b.conv(b.mul(y, scaled(clip(g))), 32, 24, 1, out="output")])


@pytest.mark.parametrize(("opset", "div", "folded_offset"), [(13, True, False), (13, False, True), (17, True, True)])
def test_clip_spellings_become_hard_sigmoid_and_compute_the_same(opset: int, div: bool, folded_offset: bool) -> None:
    model = _clip_spelt_block(opset, div=div, folded_offset=folded_offset)
    graph, report = run_pass(model, "rewrite_hard_swish")
    assert report.counts() == {"rewrite_hard_swish": 2}
    ops = [n.op for n in graph.nodes]
    assert ops.count("HardSigmoid") == 2 and "Clip" not in ops and "Div" not in ops, ops
    (gate,) = [n for n in graph.nodes if n.op == "HardSigmoid" and len(n.inputs[0].outputs) == 1]  # not x * g(x)
    assert np.isclose(gate.attrs["alpha"], 1 / 6) and np.isclose(gate.attrs["beta"], 0.0 if folded_offset else 0.5)
    assert_same_outputs(model, graph)


def test_only_a_clip_at_zero_divided_by_its_top_is_rewritten() -> None:
    """Clip(0, 6) / 3 and Clip(-1, 6) / 6 are not a HardSigmoid."""
    b = GraphBuilder("not_hard_sigmoid", seed=0)
    x = b.input("input", [1, 8, 4, 4])
    y = b.node("Div", [b.clip(x, 0.0, 6.0), b.const("three", np.array(3.0, np.float32))])
    z = b.node("Div", [b.clip(x, -1.0, 6.0), b.const("six", np.array(6.0, np.float32))])
    graph, report = run_pass(b.build([b.add(y, z, out="output")]), "rewrite_hard_swish")
    assert not report.changed and "HardSigmoid" not in {n.op for n in graph.nodes}


def test_the_cpu_build_runs_the_clip_spelling_on_integer_kernels() -> None:
    """The CPU backend's passes (this one, then fuse_cbr's HardSwish merge at opset 14+) leave HardSwish and
    HardSigmoid ops, which its plan runs as QLinearAdd and QLinearMul: nothing of the block stays float."""
    model = _clip_spelt_block(17)
    graph = optimize(graph_from_onnx(model), get_backend("cpu").passes(None)).graph
    assert {n.op for n in graph.nodes} >= {"HardSwish", "HardSigmoid"}
    quantized, _, _ = quantize(graph, cpu_config(QuantConfig()))
    lowered = lower_for_cpu(quantized, encoding="u8u8", hard_gates=True)
    ops = kernel_report(lowered.SerializeToString()).ops
    assert ops.get("QLinearAdd") == 2 and ops.get("QLinearMul") == 2, ops
    assert not {"HardSigmoid", "HardSwish", "Clip", "Div", "Mul", "Add"} & set(ops), ops
    feeds = feeds_for(graph, seed=1)
    assert cosine(run_model(model, feeds)["output"], run_model(lowered, feeds)["output"]) > 0.995
