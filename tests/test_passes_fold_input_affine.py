"""fold_input_affine: constant per-channel Sub / Div / Mul / Add chains that alone feed a Conv go into its weights
and bias; a shift stays where the Conv pads (a padded border would see the shift, not 0)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.zoo import GraphBuilder


def normalised_conv(*, pads: int, group: int, shift: bool = True, extra_reader: bool = False) -> onnx.ModelProto:
    """input ─ Sub(mean) ─ Div(std) ─ Mul(2) ─ Conv3x3(pads, group) ─ Relu ─ output   [Div ─ Relu ─ side]"""
    b = GraphBuilder("normalised", seed=0)
    x = b.input("input", [1, 4, 8, 8])
    mean = np.array([0.1, 0.2, 0.3, 0.4] if shift else [0.0] * 4, np.float32).reshape(4, 1, 1)
    y = b.node("Sub", [x, b.const("mean", mean)])
    y = b.node("Div", [y, b.const("std", np.array([0.5, 0.6, 0.7, 0.8], np.float32).reshape(1, 4, 1, 1))])
    side = [b.relu(y, out="side")] if extra_reader else []
    y = b.mul(y, b.const("two", np.array(2.0, np.float32)))
    y = b.conv(y, 4, 8, 3, pads=[pads] * 4, group=group)
    return b.build([b.relu(y, out="output"), *side])


@pytest.mark.parametrize("group", [1, 2, 4])
def test_a_normalisation_chain_goes_into_an_unpadded_conv(group: int) -> None:
    model = normalised_conv(pads=0, group=group)
    graph, report = run_pass(model, "fold_input_affine")
    assert ops(graph) == ["Conv", "Relu"] and report.counts() == {"fold_input_affine": 1}
    assert_same_outputs(model, graph)


def test_a_shift_stays_before_a_padded_conv_a_pure_scale_does_not() -> None:
    graph, report = run_pass(normalised_conv(pads=1, group=1), "fold_input_affine")
    assert not report.changed and ops(graph)[:3] == ["Sub", "Div", "Mul"]
    model = normalised_conv(pads=1, group=1, shift=False)
    graph, report = run_pass(model, "fold_input_affine")
    assert ops(graph) == ["Conv", "Relu"]
    assert_same_outputs(model, graph)


def test_a_chain_read_elsewhere_is_folded_only_past_that_reader() -> None:
    model = normalised_conv(pads=0, group=1, extra_reader=True)
    graph, report = run_pass(model, "fold_input_affine")
    assert ops(graph).count("Mul") == 0 and {"Sub", "Div"} <= set(ops(graph))  # the Div output is read twice
    assert_same_outputs(model, graph)


def test_the_last_mul_of_a_written_out_gelu_stays() -> None:
    """x ─ Div(√2) ─ Erf ─ Add(1) ─ Mul(x) ─ Mul(0.5) ─ Conv: the 0.5 belongs to the GELU, which the CPU lowering
    fuses into one kernel only while its last Mul is there."""
    b = GraphBuilder("gelu", seed=0)
    x = b.input("input", [1, 4, 8, 8])
    gelu = b.gelu(x)
    model = b.build([b.conv(gelu, 4, 4, 1, pads=[0, 0, 0, 0], out="output")])
    graph, report = run_pass(model, "fold_input_affine")
    assert not report.changed and ops(graph).count("Mul") == 2


def test_a_learnable_affine_after_a_hard_swish_folds() -> None:
    """x ─ HardSigmoid ─ Mul(x) ─ Mul(w) ─ Add(b) ─ Conv1x1: PP-LCNet's learnable scale and shift after a HardSwish
    (as `rewrite_hard_swish` writes PaddleOCR's Clip spelling) go into the conv, unlike a GELU's last Mul."""
    b = GraphBuilder("hard_swish_affine", seed=0)
    x = b.input("input", [1, 4, 8, 8])
    y = b.mul(x, b.node("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5))
    y = b.mul(y, b.const("w", np.array(1.3, np.float32)))
    y = b.node("Add", [y, b.const("shift", np.array(-0.2, np.float32))])
    model = b.build([b.conv(y, 4, 4, 1, pads=[0, 0, 0, 0], out="output")])
    graph, report = run_pass(model, "fold_input_affine")
    assert report.counts() == {"fold_input_affine": 1} and ops(graph) == ["HardSigmoid", "Mul", "Conv"]
    assert_same_outputs(model, graph)
