"""The blocks of `trtopt.zoo.random_graphs`: a generator of layers and heads, and one function per block.

Each block takes the generator and the current feature map and returns the next one; every random
decision goes through the generator's `Choices` (see random_graphs.py for what each block covers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from trtopt.zoo.builder import GraphBuilder
from trtopt.zoo.choices import Choices

ACTIVATIONS = ("none", "relu", "relu6", "relu6_node", "clip_pm1", "clip_min", "leaky_relu", "sigmoid", "silu",
               "hard_swish", "tanh", "gelu")  # fmt: skip


@dataclass(frozen=True)
class Feature:
    """A 4-D NCHW float tensor of the graph being built."""

    name: str
    channels: int
    height: int
    width: int


@dataclass
class Generator:
    """Layers and heads on a `GraphBuilder`, every choice made through `c`; `blocks` describes the graph."""

    b: GraphBuilder
    c: Choices
    blocks: list[str]
    outputs: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.blocks.append(text)

    # -- layers ----------------------------------------------------------------------------------

    def conv(self, x: Feature, *, stem: bool = False, cout: int | None = None, keep_size: bool = False) -> Feature:
        """A conv block; `cout` fixes the output channels (then no depthwise), `keep_size` the spatial size."""
        kind = "dense" if stem else self.c.choice(("dense", "dense", "grouped", "depthwise"))
        kind = "dense" if cout is not None and kind == "depthwise" else kind
        kernel = self.c.choice((1, 3))
        strided = min(x.height, x.width) >= 8 and kernel == 3 and not keep_size
        stride = self.c.choice((1, 2)) if strided else 1
        group = 1
        if kind == "depthwise":
            cout, group = x.channels, x.channels
        else:
            cout = cout or self.c.choice((16, 24, 32))
            if kind == "grouped":
                group = next((g for g in (4, 2) if x.channels % g == 0 and cout % g == 0), 1)
        bn, act = self.c.choice((False, True)), self.c.choice(ACTIVATIONS)
        y = self.b.conv(x.name, x.channels, cout, kernel, stride=stride, group=group, bias=not bn)
        y = self.b.batchnorm(y, cout) if bn else y
        self.note(f"conv {kind} {kernel}x{kernel}/{stride} {x.channels}->{cout} g{group} bn={bn} {act}")
        out = Feature(self.activation(y, act), cout, _strided(x.height, stride), _strided(x.width, stride))
        return out

    def activation(self, x: str, act: str) -> str:
        b = self.b
        simple: dict[str, Callable[[], str]] = {
            "none": lambda: x,
            "relu": lambda: b.relu(x),
            "relu6": lambda: b.clip(x, 0.0, 6.0),
            "relu6_node": lambda: b.clip(x, 0.0, 6.0, constant_nodes=True),
            "clip_pm1": lambda: b.clip(x, -1.0, 1.0),
            "clip_min": lambda: b.node("Clip", [x, b.const("clip_min", np.array(-0.5, np.float32))]),
            "leaky_relu": lambda: b.node("LeakyRelu", [x], alpha=0.1),
            "sigmoid": lambda: b.node("Sigmoid", [x]),
            "silu": lambda: b.silu(x),
            "hard_swish": lambda: b.hard_swish(x),
            "tanh": lambda: b.node("Tanh", [x]),
            "gelu": lambda: b.gelu(x),
        }
        return simple[act]()

    def pointwise(self, x: Feature, cout: int, act: str = "relu") -> Feature:
        y = self.b.conv(x.name, x.channels, cout, 1)
        return Feature(self.activation(y, act), cout, x.height, x.width)

    # -- heads -----------------------------------------------------------------------------------

    def heads(self, x: Feature) -> None:
        count = self.c.integer(1, 2)
        kinds = [self.c.choice(("gap_gemm", "gap_matmul", "flatten_gemm", "feature_map")) for _ in range(count)]
        for kind in dict.fromkeys(kinds):
            self.note(f"head {kind}")
            self.outputs.append(self.head(x, kind))

    def head(self, x: Feature, kind: str) -> str:
        b, n = self.b, self.c.choice((10, 16))
        if kind == "feature_map":
            return b.node("Identity", [x.name]) if x.name in self.outputs else x.name
        if kind == "gap_matmul":
            pooled = b.node("GlobalAveragePool", [x.name])
            flat = b.node("Reshape", [pooled, b.const("shape", np.array([1, x.channels], np.int64))])
            return b.linear_matmul(flat, x.channels, n)
        if kind == "flatten_gemm":
            return self._gemm(b.node("Flatten", [x.name], axis=1), x.channels * x.height * x.width, n)
        return self._gemm(b.pool_flatten(x.name), x.channels, n)

    def _gemm(self, x: str, k: int, n: int) -> str:
        if self.c.choice((True, False)):
            return self.b.gemm(x, k, n)
        weight = self.b.const("fc_w", self.b.he_weight((k, n), k))
        return self.b.node("Gemm", [x, weight, self.b.const("fc_b", self.b.bias(n))])


def _strided(size: int, stride: int) -> int:
    return (size - 1) // stride + 1  # 3x3 kernel, pad 1 (1x1 convs always run at stride 1)


# -- blocks --------------------------------------------------------------------------------------


def _conv_block(gen: Generator, x: Feature) -> Feature:
    return gen.conv(x)


def _residual(gen: Generator, x: Feature) -> Feature:
    b = gen.b
    y = gen.conv(x, cout=x.channels, keep_size=True)
    z = b.conv(y.name, y.channels, x.channels, gen.c.choice((1, 3)))
    operands = [z, x.name] if gen.c.choice((True, False)) else [x.name, z]
    out = b.add(*operands)
    relu = gen.c.choice((True, False))
    gen.note(f"residual {x.channels} relu={relu}")
    return Feature(b.relu(out) if relu else out, x.channels, x.height, x.width)


def _inception(gen: Generator, x: Feature) -> Feature:
    b, c = gen.b, gen.c
    kinds = [c.choice(("1x1", "1x1_3x3", "1x1_pool", "pool_1x1", "input")) for _ in range(c.integer(2, 4))]
    branches: list[Feature] = []
    for kind in kinds:
        width = c.choice((8, 16, 24))
        if kind == "input":
            branches.append(x)
        elif kind == "pool_1x1":
            pooled = Feature(b.maxpool(x.name, 3, pad=1), x.channels, x.height, x.width)
            branches.append(gen.pointwise(pooled, width))
        else:
            y = gen.pointwise(x, width, c.choice(("relu", "relu6", "relu6_node")))
            if kind == "1x1_3x3":
                y = Feature(b.relu(b.conv(y.name, width, width, 3)), width, x.height, x.width)
            elif kind == "1x1_pool":
                y = Feature(b.maxpool(y.name, 3, pad=1), width, x.height, x.width)
            branches.append(y)
    nested = len(branches) >= 3 and c.choice((False, True))
    names = [f.name for f in branches]
    if nested:
        names = [b.concat(names[:2]), *names[2:]]
    gen.note(f"inception {'+'.join(kinds)} nested={nested}")
    return Feature(b.concat(names), sum(f.channels for f in branches), x.height, x.width)


def _split(gen: Generator, x: Feature) -> Feature:
    b = gen.b
    if x.channels % 2:
        return _conv_block(gen, x)
    half = x.channels // 2
    sizes = b.const("split", np.array([half, half], np.int64))
    node = b.unique("split")
    first, second = f"{node}_a", f"{node}_b"
    b.nodes.append(onnx.helper.make_node("Split", [x.name, sizes], [first, second], name=node, axis=1))
    how = gen.c.choice(("in_order", "reversed", "conv_one"))
    pieces = {"in_order": [first, second], "reversed": [second, first]}.get(how)
    if pieces is None:
        pieces = [first, b.relu(b.conv(second, half, half, 3))]
    gen.note(f"split {x.channels} -> concat {how}")
    return Feature(b.concat(pieces), x.channels, x.height, x.width)


def _shared(gen: Generator, x: Feature) -> Feature:
    b = gen.b
    cin = x.channels
    weight = b.const("shared_w", b.he_weight((cin, cin, 3, 3), cin * 9))
    def conv(inp: str) -> str:
        bias = b.const("shared_b", b.bias(cin))
        return b.node("Conv", [inp, weight, bias], kernel_shape=[3, 3], pads=[1, 1, 1, 1])

    how = gen.c.choice(("chained", "siblings_add", "siblings_concat"))
    gen.note(f"shared weight {how}")
    if how == "chained":
        return Feature(b.relu(conv(b.relu(conv(x.name)))), cin, x.height, x.width)
    left, right = b.relu(conv(x.name)), conv(x.name)
    if how == "siblings_add":
        return Feature(b.add(left, right), cin, x.height, x.width)
    return Feature(b.concat([left, right]), 2 * cin, x.height, x.width)


def _pad(gen: Generator, x: Feature) -> Feature:
    b = gen.b
    mode = gen.c.choice(("zero", "constant", "reflect"))
    pads = b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    if mode == "reflect":
        y = b.node("Pad", [x.name, pads], mode="reflect")
    else:
        value = b.const("pad_value", np.array(0.0 if mode == "zero" else 0.5, np.float32))
        y = b.node("Pad", [x.name, pads, value], mode="constant")
    cout = gen.c.choice((16, 24))
    gen.note(f"pad {mode} -> conv3x3 {x.channels}->{cout}")
    return Feature(b.relu(b.conv(y, x.channels, cout, 3, pads=[0, 0, 0, 0])), cout, x.height, x.width)


def _resize(gen: Generator, x: Feature) -> Feature:
    b = gen.b
    if x.height > 8:
        return _conv_block(gen, x)
    scales = b.const("scales", np.array([1, 1, 2, 2], np.float32))
    y = b.node("Resize", [x.name, "", scales], mode="nearest")
    gen.note("resize nearest x2")
    return gen.conv(Feature(y, x.channels, 2 * x.height, 2 * x.width))


def _nhwc(gen: Generator, x: Feature) -> Feature:
    b = gen.b
    y = b.node("Transpose", [x.name], perm=[0, 2, 3, 1])
    how = gen.c.choice(("mul", "relu"))
    if how == "mul":
        y = b.mul(y, b.const("nhwc_scale", b.rng.uniform(0.5, 1.5, x.channels).astype(np.float32)))
    else:
        y = b.relu(y)
    gen.note(f"nhwc {how}")
    return Feature(b.node("Transpose", [y], perm=[0, 3, 1, 2]), x.channels, x.height, x.width)


def _side_output(gen: Generator, x: Feature) -> Feature:
    if x.name not in gen.outputs:
        gen.outputs.append(x.name)
        gen.note("side output")
    return gen.conv(x)


def _affine(gen: Generator, x: Feature) -> Feature:
    """A conv followed by a constant Mul / Add / Sub / Div, per channel or scalar (what fold_batchnorm folds),
    sometimes with the constant first or shaped so it must not fold (per column)."""
    b = gen.b
    y = b.conv(x.name, x.channels, x.channels, 1, bias=gen.c.choice((True, False)))
    op = gen.c.choice(("Mul", "Add", "Sub", "Div"))
    shape = gen.c.choice(((1, x.channels, 1, 1), (x.channels, 1, 1), (), (1, 1, 1, x.width)))
    value = b.rng.uniform(0.5, 1.5, shape).astype(np.float32)
    constant = b.const("affine", value)
    first = op != "Div" and gen.c.choice((True, False))  # c / x is not affine (and x may be near 0)
    gen.note(f"affine {op} {shape} constant_first={first}")
    out = b.node(op, [constant, y] if first else [y, constant])
    return Feature(b.relu(out), x.channels, x.height, x.width)


def _squeeze_excite(gen: Generator, x: Feature) -> Feature:
    """SE block: GlobalAveragePool - 1x1 reduce - Relu - 1x1 expand - Sigmoid, times the input."""
    b = gen.b
    mid = max(x.channels // 4, 4)
    gate = b.relu(b.conv(b.node("GlobalAveragePool", [x.name]), x.channels, mid, 1))
    gate = b.node("Sigmoid", [b.conv(gate, mid, x.channels, 1)])
    gen.note("squeeze-excite")
    return Feature(b.mul(x.name, gate), x.channels, x.height, x.width)


def _concat_axes(gen: Generator, x: Feature) -> Feature:
    """Concats that are not plain channel joins: the same tensor twice, a spatial (negative) axis, nested."""
    b = gen.b
    how = gen.c.choice(("same_twice", "height", "nested"))
    gen.note(f"concat {how}")
    left = gen.pointwise(x, x.channels)
    if how == "same_twice":
        return Feature(b.concat([left.name, x.name, left.name]), 3 * x.channels, x.height, x.width)
    right = gen.pointwise(x, x.channels, "relu6")
    tall = b.concat([left.name, right.name], axis=gen.c.choice((2, -2)))
    y = b.conv(tall, x.channels, x.channels, 3, stride=2)  # back to x.height rows (2H -> H), W/2 columns
    width = _strided(x.width, 2)
    if how == "height":
        return Feature(b.relu(y), x.channels, x.height, width)
    pooled = b.node("MaxPool", [x.name], kernel_shape=[1, 2], strides=[1, 2], pads=[0, 0, 0, x.width % 2])
    inner = b.concat([y, pooled])
    return Feature(b.concat([inner, y]), 3 * x.channels, x.height, width)


def _siblings(gen: Generator, x: Feature) -> Feature:
    """1x1 siblings for horizontal fusion where one of them must stay apart: its output is a graph output,
    it has another activation, or it feeds a residual Add."""
    b = gen.b
    how = gen.c.choice(("graph_output", "other_activation", "residual"))
    gen.note(f"siblings {how}")
    first = gen.pointwise(x, 16)
    second = gen.pointwise(x, 16, "relu6" if how == "other_activation" else "relu")
    if how == "graph_output":
        gen.outputs.append(second.name)
    if how == "residual":
        third = b.conv(x.name, x.channels, 16, 1)
        return Feature(b.concat([first.name, b.add(third, second.name)]), 32, x.height, x.width)
    return Feature(b.concat([first.name, second.name]), 32, x.height, x.width)


def _upsample(gen: Generator, x: Feature) -> Feature:
    """ConvTranspose 2x2 stride 2 (+ BN), on small maps only."""
    b = gen.b
    if x.height > 8:
        return _pooling(gen, x)
    cout = gen.c.choice((16, 24))
    weight = b.const("deconv_w", b.he_weight((x.channels, cout, 2, 2), x.channels))
    bias = b.const("deconv_b", b.bias(cout))
    y = b.node("ConvTranspose", [x.name, weight, bias], kernel_shape=[2, 2], strides=[2, 2])
    bn = gen.c.choice((False, True))
    gen.note(f"convtranspose {x.channels}->{cout} bn={bn}")
    y = b.batchnorm(y, cout) if bn else y
    return Feature(b.relu(y), cout, 2 * x.height, 2 * x.width)


def _pooling(gen: Generator, x: Feature) -> Feature:
    """AveragePool 3x3 (pads counted or not), or a dilated 3x3 conv, or a GlobalMaxPool side branch."""
    b = gen.b
    how = gen.c.choice(("avgpool", "dilated", "global_max"))
    gen.note(f"pooling {how}")
    if how == "avgpool":
        include = gen.c.choice((0, 1))
        y = b.node("AveragePool", [x.name], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=include)
        return Feature(y, x.channels, x.height, x.width)
    if how == "dilated":
        return Feature(b.relu(b.conv(x.name, x.channels, 16, 3, dilation=2)), 16, x.height, x.width)
    gen.outputs.append(b.node("Flatten", [b.node("GlobalMaxPool", [x.name])], axis=1))
    return gen.conv(x)


def _conditional(gen: Generator, x: Feature) -> Feature:
    """An `If` with two outputs whose branches read a conv's output from the outer graph, as exporters write a
    Python branch: decided by a constant (a sample rate the export fixed, as in silero-vad; folding takes the
    branch) or by the data (the sign of the map's sum; it stays an `If`)."""
    b = gen.b
    y = gen.conv(x)
    if gen.c.choice(("data", "constant")) == "constant":
        taken = gen.c.choice((True, False))
        cond, how = b.constant_node("cond", np.array(taken)), f"constant {taken}"
    else:
        total = b.node("ReduceSum", [y.name], keepdims=0)
        cond, how = b.node("Greater", [total, b.const("zero", np.zeros((), np.float32))]), "data"
    two = b.const("two", np.full((), 2.0, np.float32))
    branches = [_body(b, "then", [("Relu", [y.name]), ("Mul", [y.name, two])]),
                _body(b, "else", [("Sigmoid", [y.name]), ("Add", [y.name, two])])]  # fmt: skip
    outs = [b.unique("if_out"), b.unique("if_out")]
    b.nodes.append(onnx.helper.make_node("If", [cond], outs, name=b.unique("if"), then_branch=branches[0],
                                         else_branch=branches[1]))  # fmt: skip
    gen.note(f"conditional ({how})")
    return gen.conv(Feature(b.add(*outs), y.channels, y.height, y.width))


def _body(b: GraphBuilder, kind: str, ops: list[tuple[str, list[str]]]) -> onnx.GraphProto:
    """A branch of one node per output, each reading outer tensors."""
    nodes, outputs = [], []
    for op, inputs in ops:
        name = b.unique(f"{kind}_{op.lower()}")
        nodes.append(onnx.helper.make_node(op, inputs, [f"{name}_out"], name=name))
        outputs.append(onnx.helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, None))
    return onnx.helper.make_graph(nodes, b.unique(kind), [], outputs)


def _conv1d(gen: Generator, x: Feature) -> Feature:
    """tf2onnx's Conv1D twice (Squeeze - bias Add - act - Unsqueeze - Conv 1x3) on the height mean, times x."""
    b, c, act = gen.b, x.channels, gen.c.choice(ACTIVATIONS[:8])
    axes = lambda: b.const("axes", np.array([2], np.int64))  # noqa: E731 - opset 13+: the axes are an input
    row = b.node("Squeeze", [b.node("ReduceMean", [x.name], axes=[2], keepdims=1), axes()])
    for _ in range(2):
        row = b.node("Unsqueeze", [gen.activation(b.add(row, b.const("bias", b.bias(c).reshape(c, 1))), act), axes()])
        row = b.node("Squeeze", [b.node("Conv", [row, b.const("w", b.he_weight((c, c, 1, 3), 3 * c))],
                                        kernel_shape=[1, 3], pads=[0, 1, 0, 1]), axes()])  # fmt: skip
    gen.note(f"conv1d {act}")
    return Feature(b.mul(x.name, b.node("Unsqueeze", [row, axes()])), c, x.height, x.width)


BLOCKS: dict[str, Callable[[Generator, Feature], Feature]] = {
    "conv": _conv_block,
    "residual": _residual,
    "inception": _inception,
    "split": _split,
    "shared": _shared,
    "pad": _pad,
    "resize": _resize,
    "nhwc": _nhwc,
    "side": _side_output,
    "affine": _affine,
    "squeeze_excite": _squeeze_excite,
    "concat_axes": _concat_axes,
    "siblings": _siblings,
    "upsample": _upsample,
    "pooling": _pooling,
    "conditional": _conditional,
    "conv1d": _conv1d,
}
