"""Inception module (Szegedy et al. 2015): sibling 1x1 convs on one tensor, joined by a Concat."""

from __future__ import annotations

import onnx

from trtopt.zoo.builder import MODELS, GraphBuilder


def inception_block(
    b: GraphBuilder, x: str, cin: int, widths: tuple[int, int, int, int, int, int], *, out: str | None = None
) -> str:
    """Four branches: 1x1 | 1x1 reduce -> 3x3 | 1x1 reduce -> 5x5 | maxpool3x3 -> 1x1.

    `widths` = (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj). The three 1x1 convs that read `x`
    share kernel, stride, pads, dilation and group: the horizontal-fusion case.
    """
    c1, r3, c3, r5, c5, cp = widths
    branch1 = b.relu(b.conv(x, cin, c1, 1))
    branch3 = b.relu(b.conv(b.relu(b.conv(x, cin, r3, 1)), r3, c3, 3))
    branch5 = b.relu(b.conv(b.relu(b.conv(x, cin, r5, 1)), r5, c5, 5))
    branch_pool = b.relu(b.conv(b.maxpool(x, 3, pad=1), cin, cp, 1))
    return b.concat([branch1, branch3, branch5, branch_pool], out=out)


@MODELS.register("inception")
def inception(batch: int, seed: int, opset: int) -> onnx.ModelProto:
    """Inception module on 16x16x16, plus a 3x3 sibling on the input that must *not* join the 1x1 group::

                 ┌─ Conv1x1 ─ Relu ──────────────────────┐
                 ├─ Conv1x1 ─ Relu ─ Conv3x3 ─ Relu ─────┤
        input ───┼─ Conv1x1 ─ Relu ─ Conv5x5 ─ Relu ─────┼─ Concat ─ output (32 ch)
                 ├─ MaxPool3x3 ─ Conv1x1 ─ Relu ─────────┘
                 └─ Conv3x3 ─ Relu ─ side (8 ch)
    """
    b = GraphBuilder("inception", seed=seed, opset=opset)
    x = b.input("input", [batch, 16, 16, 16])
    y = inception_block(b, x, 16, (8, 8, 12, 4, 6, 6), out="output")
    side = b.relu(b.conv(x, 16, 8, 3), out="side")
    return b.build([y, side])
