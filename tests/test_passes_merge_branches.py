"""merge_branches: summed parallel branches over one input (RepVGG's 3x3 conv + 1x1 conv + identity BatchNorm, a
depthwise block's the same) become one conv, the outputs unchanged in ONNX Runtime; branches that do not line up
(another stride, pads off centre, a channel count the identity cannot map) or that something else reads stay."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.frontend import graph_from_onnx
from trtopt.passes import optimize
from trtopt.zoo import GraphBuilder


def repvgg_block(
    channels: int = 8, *, group: int = 1, identity: bool = True, big_pads: tuple[int, ...] = (1, 1, 1, 1),
    stride: int = 1, small_group: int | None = None, also_read: bool = False,
) -> onnx.ModelProto:
    """input ─┬─ Conv 3x3 ─┐
              ├─ Conv 1x1 ─┼─ Add ─ Add ─ Relu ─ output       (RepVGG's training-time block)
              └─ BN ───────┘"""
    b = GraphBuilder("repvgg", seed=0)
    x = b.input("input", [2, channels, 9, 10])
    big = b.conv(x, channels, channels, 3, group=group, stride=stride, pads=list(big_pads))
    small = b.conv(x, channels, channels, 1, group=small_group or group, pads=[0] * 4, stride=stride)
    y = b.add(big, small)
    if identity:
        y = b.add(y, b.batchnorm(x, channels))
    outputs = [b.relu(y, out="output")]
    if also_read:
        outputs.append(b.relu(small, out="small"))
    return b.build(outputs)


@pytest.mark.parametrize("group", [1, 8])  # a dense block and a depthwise one (MobileOne's)
def test_three_branches_become_one_conv(group: int) -> None:
    model = repvgg_block(group=group)
    graph, report = run_pass(model, "merge_branches")
    assert ops(graph) == ["Conv", "Relu"] and report.changed
    assert_same_outputs(model, graph)


def test_two_convs_without_the_identity_branch() -> None:
    model = repvgg_block(identity=False)
    graph, _ = run_pass(model, "merge_branches")
    assert ops(graph) == ["Conv", "Relu"]
    assert_same_outputs(model, graph)


def test_strided_convs_merge() -> None:
    model = repvgg_block(stride=2, identity=False)  # (a strided block has no identity branch: its sizes differ)
    graph, _ = run_pass(model, "merge_branches")
    assert ops(graph) == ["Conv", "Relu"]
    assert_same_outputs(model, graph)


def test_convs_of_other_groups_stay_apart() -> None:
    model = repvgg_block(group=8, small_group=1, identity=False)  # a depthwise 3x3 and a dense 1x1
    graph, report = run_pass(model, "merge_branches")
    assert ops(graph).count("Conv") == 2 and not report.changed


def test_branches_that_do_not_line_up_or_are_read_elsewhere_stay() -> None:
    off_centre = repvgg_block(big_pads=(2, 2, 0, 0), identity=False)  # the same size, shifted by one pixel
    graph, report = run_pass(off_centre, "merge_branches")
    assert ops(graph).count("Conv") == 2 and not report.changed
    assert_same_outputs(off_centre, graph)
    shared = repvgg_block(also_read=True)
    graph, _ = run_pass(shared, "merge_branches")
    assert ops(graph).count("Conv") == 2, "the 1x1 branch another node reads stays; the 3x3 and BN merge"
    assert_same_outputs(shared, graph)


def test_the_default_order_merges_an_exported_repvgg_block() -> None:
    model = repvgg_block()
    result = optimize(graph_from_onnx(model))
    assert [n.op for n in result.graph.nodes] == ["Conv", "Relu"]
    assert_same_outputs(model, result.graph)
    assert np.isfinite(next(r for r in result.reports if r.name == "merge_branches").seconds)
