"""Random valid CNN graphs from composable blocks, for property-based tests of the passes and INT8 builds.

A graph is a stem conv, one to four blocks and one or two heads; every choice is made through a
`Choices` object, so the same generator runs on a seeded NumPy generator (`SeededChoices`) or on
hypothesis's `draw` (tests/graph_fuzz.py), which can then shrink a failing graph block by block. Shapes
stay tiny (batch 1, 8..16 pixels, 3..96 channels) so a graph builds, calibrates and runs in well under a
second. The blocks (trtopt/zoo/random_blocks.py) cover what the passes and the quantiser treat specially:

    conv        Conv (dense, grouped or depthwise; 1x1 or 3x3; stride 1 or 2), BatchNorm kept or not, and an
                activation: Relu, Clip(0,6) with initializer or Constant-node bounds, Clip(-1,1), Clip with
                only a min, LeakyRelu, Sigmoid, SiLU (Sigmoid*Mul), HardSwish, Tanh, GELU (Div/Erf/Add/Mul/Mul), or none
    residual    conv-act-conv + identity Add (+ Relu)
    inception   2-4 branches on one tensor (1x1, 1x1-3x3, 1x1-MaxPool, MaxPool-1x1, the input itself),
                one Concat or nested Concats
    split       Split on channels, then Concat in order, reversed, or with a conv on one piece
    shared      two convs reading one weight initializer (chained or siblings joined by Add / Concat)
    pad         explicit Pad (zero, non-zero constant or reflect) before a 3x3 conv without pads
    resize      nearest 2x Resize (small maps only), then a conv
    nhwc        Transpose to NHWC, a per-channel Mul or a Relu there, Transpose back
    side        the current tensor also becomes a graph output (and is read on)
    affine      a constant Mul / Add / Sub / Div after a conv: per channel, scalar, or per column (no fold)
    squeeze_excite  GlobalAveragePool - 1x1 - Relu - 1x1 - Sigmoid gate, times the input
    concat_axes the same tensor twice in a Concat, a Concat on the height axis (negative too), nested
    siblings    1x1 siblings where one must stay apart (graph output, other activation, residual Add)
    upsample    ConvTranspose 2x2/2 (+ BN); pooling: AveragePool, a dilated conv, a GlobalMaxPool output
    conditional an `If` with two outputs whose branches read a conv's output: a constant condition (folded
                away) or one the data decides (kept)
    conv1d      tf2onnx's Conv1D (Squeeze, bias Add, activation, Unsqueeze, a 1x3 Conv) on the height mean, as a gate
    heads       GlobalAveragePool-Flatten-Gemm (transB 0 or 1), GlobalAveragePool-Reshape-MatMul+Add,
                Flatten-Gemm, or the feature map itself
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from trtopt.zoo.builder import GraphBuilder
from trtopt.zoo.choices import Choices, T
from trtopt.zoo.random_blocks import BLOCKS, Feature, Generator

OPSETS = (13, 17)
MAX_BLOCKS = 4


class SeededChoices:
    """`Choices` from a seeded NumPy generator (no shrinking; for scripts and quick sampling)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def integer(self, low: int, high: int) -> int:
        return int(self.rng.integers(low, high + 1))

    def choice(self, options: Sequence[T]) -> T:
        return options[int(self.rng.integers(len(options)))]


@dataclass
class RandomGraph:
    """The model and the blocks it was made of, in order (a readable description for reports)."""

    model: onnx.ModelProto
    blocks: list[str] = field(default_factory=list)


def random_graph(choices: Choices, *, name: str = "random_graph", blocks: Sequence[str] | None = None) -> RandomGraph:
    """A valid ONNX model with one input named ``input`` and one or more float outputs; `blocks` limits the
    blocks drawn to those names (a test aimed at one kind of graph)."""
    opset = choices.choice(OPSETS)
    b = GraphBuilder(name, seed=choices.integer(0, 2**16), opset=opset)
    gen = Generator(b, choices, blocks=[f"opset {opset}"])
    channels, size = choices.choice((3, 8, 16)), choices.choice((8, 12, 16))
    x = Feature(b.input("input", [1, channels, size, size]), channels, size, size)
    x = gen.conv(x, stem=True)
    for _ in range(choices.integer(1, MAX_BLOCKS)):
        block = choices.choice(tuple(blocks or BLOCKS))
        x = BLOCKS[block](gen, x)
    gen.heads(x)
    return RandomGraph(b.build(gen.outputs), gen.blocks)
