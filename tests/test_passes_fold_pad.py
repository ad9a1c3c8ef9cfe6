"""fold_pad: a zero, spatial-only constant Pad read only by Convs becomes each Conv's pads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.zoo import GraphBuilder


def pad_conv(
    pads: list[int],
    *,
    value: float = 0.0,
    mode: str = "constant",
    conv_pads=(1, 1, 1, 1),
    opset: int = 17,
    group: int = 1,
    extra_reader: bool = False,
    second_conv: bool = False,
) -> onnx.ModelProto:
    """input ─ Pad(pads, value, mode) ─ Conv3x3(pads=conv_pads, group) ─ output   [─ Relu ─ side] [─ Conv ─ other]"""
    b = GraphBuilder("pad_conv", seed=3, opset=opset)
    x = b.input("input", [1, 8, 9, 11])
    if opset < 11:
        padded = b.node("Pad", [x], pads=pads, value=value, mode=mode)
    else:
        inputs = [x, b.const("pads", np.array(pads, np.int64)), b.const("value", np.array(value, np.float32))]
        padded = b.node("Pad", inputs, mode=mode)
    w = b.const("w", b.he_weight((8, 8 // group, 3, 3), 72 // group))
    y = b.node(
        "Conv",
        [padded, w, b.const("b", b.bias(8))],
        out="output",
        kernel_shape=[3, 3],
        pads=list(conv_pads),
        group=group,
        strides=[2, 2],
    )
    outputs = [y] + ([b.relu(padded, out="side")] if extra_reader else [])
    if second_conv:  # a second branch reading the same padded tensor (Keras NASNet's separable-conv pairs)
        outputs.append(b.conv(padded, 8, 8, 5, group=group, stride=2, pads=[0, 0, 0, 0], out="other"))
    return b.build(outputs)


@pytest.mark.parametrize("opset", [11, 13, 17, 21])
@pytest.mark.parametrize(
    "pads", [[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 2, 1, 0, 0, 0, 3]], ids=["same-tf", "asym"]
)
def test_zero_pad_folds_into_conv_pads(opset: int, pads: list[int]) -> None:
    model = pad_conv(pads, opset=opset)
    graph, report = run_pass(model, "fold_pad")
    assert ops(graph) == ["Conv"]
    assert report.counts() == {"fold_pad": 1}
    # conv pads [1,1,1,1] plus the Pad's spatial begins (H, W) and ends (H, W)
    assert graph.nodes[0].attrs["pads"] == [1 + pads[2], 1 + pads[3], 1 + pads[6], 1 + pads[7]]
    assert_same_outputs(model, graph)


def test_a_pad_two_convs_read_folds_into_both() -> None:
    model = pad_conv([0, 0, 2, 2, 0, 0, 2, 2], group=8, second_conv=True)
    graph, report = run_pass(model, "fold_pad")
    assert ops(graph) == ["Conv", "Conv"] and report.counts() == {"fold_pad": 1}
    assert sorted(n.attrs["pads"] for n in graph.nodes) == [[2, 2, 2, 2], [3, 3, 3, 3]]
    assert_same_outputs(model, graph)


def test_depthwise_conv_also_folds() -> None:
    model = pad_conv([0, 0, 1, 1, 0, 0, 1, 1], group=8)
    graph, _ = run_pass(model, "fold_pad")
    assert ops(graph) == ["Conv"]
    assert_same_outputs(model, graph)


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"pads": [0, 0, 0, 0, 0, 0, 1, 1], "value": 1.5}, "non-zero fill"),
        ({"pads": [0, 0, 0, 0, 0, 0, 1, 1], "mode": "reflect"}, "reflect mode"),
        ({"pads": [1, 0, 0, 0, 0, 0, 0, 0]}, "pads the batch axis"),
        ({"pads": [0, 0, -1, 0, 0, 0, 0, 0]}, "negative pads crop"),
        ({"pads": [0, 0, 1, 1, 0, 0, 1, 1], "extra_reader": True}, "Pad output read twice"),
    ],
)
def test_unfoldable_pads_are_left_alone(kwargs: dict, why: str) -> None:
    model = pad_conv(**kwargs)
    graph, report = run_pass(model, "fold_pad")
    assert "Pad" in ops(graph), why
    assert not report.changed, why
    assert_same_outputs(model, graph)
