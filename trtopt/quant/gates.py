"""Element-wise gates on the integer grid between INT8 layers (`QuantConfig.integer_gates`, the CPU backend's default).

Squeeze-excite blocks and SiLU are element-wise ops between convs: EfficientNet's x * sigmoid(x) after each
conv, its squeeze-excite GlobalAveragePool -> 1x1 convs -> Sigmoid -> Mul(x, gate), MobileNetV3's Mul by a
HardSigmoid gate. ONNX Runtime has integer kernels for Sigmoid (QLinearSigmoid, a 256-entry table), Mul and Add
(QLinearMul, QLinearAdd) and GlobalAveragePool (QLinearGlobalAveragePool), which its QDQ fusions choose where
the op reads DequantizeLinear and writes one QuantizeLinear. Left float, each such op between two INT8 convs
costs a DequantizeLinear of the conv's output, the float op(s) on four times the bytes, a QuantizeLinear, and
layout Transposes where the NHWC integer stretch is cut.

An op of `INTEGER_OPS` goes on the grid (a pair on each input edge and on each edge that reads its output) where

- each data input is quantised already (an INT8 layer's output, or an op put on the grid here), or is *small*
  (no spatial extent: a squeeze-excite vector after the pool, which costs nothing to quantise), and
- every reader of its output is an INT8 layer, another op put on the grid here (through Flatten / Reshape /
  Squeeze / Unsqueeze, sharing one threshold as `trtopt.quant.pools` does), a Concat whose output is quantised
  (QLinearConcat: `placement._concat_sites` quantises its inputs), or the output is small and either some reader
  is integer or some input is a large tensor on the grid (a squeeze-excite pool before float 1x1 convs under
  `min_channels`: the DequantizeLinear of its large input saved, one of a vector paid);
- nothing it reads or that reads it is a node `--exclude` names (the sensitivity search excludes the same way):
  a layer kept float reads its input unrounded, as `placement._output_sites` keeps it.

Ops that only move values (`MOVEMENT_OPS`: Concat, Reshape, Transpose, Split, Slice, ...) join them on the same
terms, with every reader of every output integer, and read and write one grid (a Concat's inputs share it by
`placement._concat_sites`). ShuffleNet's channel shuffle between its units (Concat -> Reshape -> Transpose ->
Reshape -> Split) ran in float between DequantizeLinear and QuantizeLinear on each unit's output; on the grid, a
paddle ShuffleNetV2-swish (avx2, 1 thread, interleaved) went from 1.25x / 1.23x FP32's speed at b1 / b8 to
1.31x / 1.30x (ONNX Runtime's own quantizer 1.26x / 1.23x in that run). The CPU backend writes that shuffle as one
Gather (`trtopt.passes.channel_shuffle`), which is on the list for it: without it, torch's ShuffleNetV2 ran its
Concat, Gather and Split in float again (b8, 1 thread, AVX-512 VNNI: 31 QuantizeLinear and 33 DequantizeLinear,
2.2 of 23.8 ms).

Both conditions are settled together (a fixed point): an op whose output would feed float ops stays float,
then so may the ops before it. Decided by op pattern, never by model; the CPU backend measures whether the
plan pays (`trtopt.backend.cpu.choice`). What it bought on EfficientNet-B0 (and what it cost in SiLU
equalisation, which such plans leave out) is in `trtopt.backend.cpu.backend.CpuBackend.quant_config`.

With `QuantConfig.integer_hard_swish` (the CPU backend's default too) MobileNetV3's ops join them: HardSwish,
HardSigmoid (written x * HardSigmoid(x) below opset 14, or as a squeeze-excite gate) and a global ReduceMean (how
PyTorch's dynamo exporter writes the squeeze-excite pool). ONNX Runtime has no integer kernel for the first two;
the CPU lowering writes them as its QLinearAdd and QLinearMul, the ReduceMean as GlobalAveragePool
(`trtopt.backend.cpu.hard_gates`), and this module only places the pairs, so the graph keeps its ops until then.
A HardSwish that activation equalisation rescaled (`trtopt.quant.equalize`: its gate reads x' * c, the rescaled x
times one positive constant per channel) keeps its gate: the pair goes before that Mul (`gate_scale`), and the
lowering writes Mul and HardSigmoid as one depthwise 1x1 QLinearConv. So does an affine map a * x + b (an Add or Sub
of constants, one per channel or one for all, after an optional Mul by such: `channel_offset`), PP-LCNetV3's
learnable affine block after each HardSwish (PP-OCRv4's backbones), whose readers were float before it: the
HardSwish before it then joins too. On PP-OCRv4-rec (avx2, all-INT8 plans without the search, b1, 1 thread, side
by side) 18 float HardSigmoid and 44 DequantizeLinear went to 1 and 14 (62 QLinearConv, 34 QLinearMul): 30.0 ->
26.4 ms (FP32 49.7), its all-INT8 reference 0.9777 -> 0.9828 on the verification samples (with the HardSwish
equalisation back, above).

HardSwish spelt in Clip arithmetic (x * Clip(x + 3, 0, 6) / 6: Add, Clip, Mul, Div, as PyTorch wrote it before
opset 14 and older paddle2onnx releases did) is written as the ops by the CPU backend's `rewrite_hard_swish` pass
before placement. Where the build writes float instead: docs/exports.md.

Not covered: a HardSigmoid with alpha <= 0, and other spellings (a Relu6 then a Mul by 1/6, say) stay float; such
plans leave SiLU out of the gated equalisation (its QLinearSigmoid's table holds one input scale); the sensitivity
search does not weigh gates (below). The Sigmoid output's threshold comes from calibration like any other tensor's.

Why HardSwish stays in the equalisation (avx2, ONNX Runtime 1.32.0, 2026-11-29): from the day HardSwish joined the
grid until then, such plans left it out, as SiLU, and the zoo's worst held-out cosines fell below 0.99 (layout-cdla
0.9912 -> 0.9784, table-cls 0.9915 -> 0.9865). Measured on 24 calibration samples before the sensitivity search,
in the form the search measures, the equalisation was the whole loss: layout-cdla's all-INT8 plan scored 0.9661
equalised with HardSwish float, 0.6762 neither, 0.6901 with HardSwish on the grid unequalised, and 0.9712 both
(this module's gate-scale reads); table-cls 0.9029, 0.8589, 0.8735 and 0.8917. The depthwise gate costs speed
where the QLinearAdd form did not: side by side, all-INT8 plans without the search, b1, 1 thread, every site
rescaled, layout-cdla 114 -> 129 ms (FP32 295) and table-cls 10.4 -> 10.9 ms (FP32 14.5); a float gate branch
(DequantizeLinear, Mul, HardSigmoid, Mul, QuantizeLinear) took 2.3-6.8x the QLinearAdd form's time on one tensor,
the depthwise form 1.5-2.6x. Where the rescaling buys nothing (channel ranges within `trtopt.quant.equalize.
GATED_SPREAD` of each other: the corpus's MobileNetV3s on photos) a site keeps the QLinearAdd form.

What they cost in fidelity, measured (avx2, 2026-11-29, PP-OCRv4-rec, the layers kept float fixed so that only
the gates differ): nothing the search could buy back. On the Q/DQ arithmetic the sensitivity search measures, the
plan with its SiLUs on the grid scored 0.9854 against 0.9836 without (16 held-out lines; 0.9802 / 0.9801 on 128),
and ONNX Runtime's QLinearSigmoid and QLinearMul matched that reference on all 256 inputs: the only rounding a gate
adds is its Sigmoid's output, on 255 steps over (0, 1), since the conv output it reads is rounded by the INT8
kernel either way. The 0.9884 -> 0.9844 measured when gates came in was the search keeping other layers float on
its 16 lines (gates on: 0.9823 on 128 lines, gates off 0.9913). Gates as candidates of the search were tried and
not kept: none earned `MIN_GAIN` on PP-OCRv4-rec or ddddocr-det, and they cost up to 8 trials a search.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.passes.query import constant_array
from trtopt.quant.pools import SHAPE_OPS, Edge, is_global_mean

INTEGER_OPS = ("Sigmoid", "Mul", "Add", "GlobalAveragePool")
# Ops that move or pick values without computing new ones. ONNX Runtime 1.32 runs each on uint8 where it reads a
# DequantizeLinear and writes QuantizeLinears of the same grid (its QDQ rules drop the pair; checked for each op
# listed, and not Pad, which stays float there: the CPU lowering moves its pairs, `trtopt.backend.cpu.movement`),
# and Concat as its QLinearConcat. On one shared grid they are exact (a Pad of zeros pads with the zero point).
MOVEMENT_OPS = ("Transpose", "Reshape", "Flatten", "Split", "Slice", "Squeeze", "Unsqueeze", "DepthToSpace", "Resize",
                "Gather", "Pad", "Concat")  # Gather with constant indices (not a data input)
HARD_OPS = ("HardSwish", "HardSigmoid", "ReduceMean")  # with `hard`: MobileNetV3's (see the module)


def gate_edges(
    graph: gs.Graph, edges: Collection[Edge], layers: Collection[str], excluded: Collection[str] = (), *,
    hard: bool = False,
) -> tuple[list[Edge], list[tuple[str, str]]]:
    """The edges to quantise so that the ops of `INTEGER_OPS` that qualify (see the module) run on the grid,
    given the activation `edges` quantised already and the INT8 `layers` (names); and the (tensor, tensor)
    pairs that share a threshold across shape ops. An op that reads or is read by a node `excluded` names (by name or
    op type: kept float by the user or the sensitivity search, to read its input unrounded) stays float. `hard`:
    `HARD_OPS` too."""
    quantized = {tensor for tensor, _, _ in edges}
    paired = {(tensor, reader) for tensor, reader, _ in edges}
    ops = INTEGER_OPS + MOVEMENT_OPS + (HARD_OPS if hard else ())
    candidates = [n for n in graph.nodes if (_candidate(n, ops) or hard and channel_offset(n) is not None)
                  and n.name not in excluded and n.op not in excluded]  # fmt: skip
    chosen = {n.name for n in candidates}
    outputs = {t.name for t in graph.outputs}
    scales = {n.name: [r.name for _, r in _reads(n) if r is not n] for n in candidates}  # a gate scale reads for it
    while True:
        reading = set(chosen) | {mul for name in chosen for mul in scales[name]}
        kept = {n.name for n in candidates if n.name in chosen and _inputs_ready(n, quantized, chosen)
                and _readers_ready(n, quantized, reading, layers, outputs, paired)
                and not any(r.name in excluded or r.op in excluded for r in _readers(n) + _writers(n))}  # fmt: skip
        if kept == chosen:
            break
        chosen = kept
    return _edges_of(graph, [n for n in candidates if n.name in chosen], edges)


def _candidate(node: gs.Node, ops: Collection[str]) -> bool:
    data = _data_inputs(node)
    if node.op not in ops or not node.outputs:
        return False
    if node.op == "ReduceMean":
        return len(data) == 1 and node.inputs[0] is data[0] and is_global_mean(node)
    if node.op == "HardSigmoid" and not float(node.attrs.get("alpha", 0.2)) > 0:
        return False  # the integer form reads x at alpha times its scale
    if node.op == "Concat":
        return bool(data) and len(data) == len(node.inputs)
    if node.op in MOVEMENT_OPS:  # the data input first, the rest constants (shapes, axes, scales)
        nearest = node.op != "Resize" or node.attrs.get("mode", "nearest") == "nearest"
        return nearest and len(data) == 1 and node.inputs[0] is data[0] and _moves_values(node)
    return len(data) == len(node.inputs) and len(data) == (2 if node.op in ("Mul", "Add") else 1)


def _moves_values(node: gs.Node) -> bool:
    """Any but a Pad whose new values are not zeros (reflect and edge copy values; constant pads with a value)."""
    if node.op != "Pad" or node.attrs.get("mode", "constant") != "constant" or len(node.inputs) < 3:
        return True
    value = constant_array(node.inputs[2]) if node.inputs[2].name else np.zeros(1)
    return value is not None and not np.any(value)


def _data_inputs(node: gs.Node) -> list[gs.Tensor]:
    return [t for t in node.inputs if isinstance(t, gs.Variable) and t.name]


def _reads(node: gs.Node) -> list[tuple[gs.Tensor, gs.Node]]:
    """The (tensor, node) edges on which `node` reads its data: its own data inputs, or where a HardSigmoid or an
    affine map reads its input through a Mul by constants (`gate_scale`, `channel_offset`), that Mul's (the pair
    goes before it, and the CPU lowering computes both on the integer grid: `trtopt.backend.cpu.hard_gates`)."""
    scale = gate_scale(node) if node.op == "HardSigmoid" else channel_offset(node)
    if scale is not None:
        return [(t, scale) for t in _data_inputs(scale) if constant_array(t) is None]
    return [(t, node) for t in _data_inputs(node)]


def gate_scale(node: gs.Node) -> gs.Node | None:
    """The Mul of a HardSigmoid's input by positive constants, one per channel or one for all ([1, C, 1, ...] or a
    scalar), that only the HardSigmoid reads: how `trtopt.quant.equalize` feeds the gate of a rescaled HardSwish
    the original x. None for any other node."""
    source = node.inputs[0] if node.op == "HardSigmoid" and node.inputs else None
    mul = source.inputs[0] if source is not None and len(source.inputs) == 1 and len(source.outputs) == 1 else None
    value = _channel_constant(mul) if mul is not None and mul.op == "Mul" and len(mul.inputs) == 2 else None
    return mul if value is not None and np.all(value > 0) else None


def channel_offset(node: gs.Node) -> gs.Node | None:
    """For an Add of constants (x + b, b + x) or a Sub of them (x - b), one per channel or one for all: the Mul of x
    by such constants that feeds it and nothing else (PP-LCNetV3's learnable affine block after each HardSwish, a *
    y + b, its b per channel once equalised), else `node` itself; None for any other node. The CPU lowering writes
    the affine map as one depthwise 1x1 QLinearConv (`trtopt.backend.cpu.hard_gates`)."""
    if node.op not in ("Add", "Sub") or len(node.inputs) != 2 or _channel_constant(node) is None:
        return None
    data = [t for t in node.inputs if constant_array(t) is None]
    if len(data) != 1 or node.op == "Sub" and data[0] is not node.inputs[0]:
        return None
    mul = data[0].inputs[0] if len(data[0].inputs) == 1 and len(data[0].outputs) == 1 else None
    if mul is None or mul.op != "Mul" or len(mul.inputs) != 2 or _channel_constant(mul) is None:
        return node
    return mul if sum(constant_array(t) is None for t in mul.inputs) == 1 else node


def _channel_constant(node: gs.Node) -> np.ndarray | None:
    """The one nonzero constant operand of `node`, where it is one value, or one per channel ([1, C, 1, ...] of the
    other operand's rank, 3 or more: the depthwise conv's), and broadcasting it leaves the other's shape as it is."""
    values = [v for v in (constant_array(t) for t in node.inputs) if v is not None]
    data = [t for t in node.inputs if constant_array(t) is None]
    if len(values) != 1 or len(data) != 1 or not np.all(values[0] != 0):
        return None
    value, rank = values[0], len(data[0].shape) if data[0].shape is not None else None
    if rank is None or value.ndim > rank:
        return None
    return value if value.size == 1 or value.ndim == rank and channel_vector(value.shape) else None


def channel_vector(shape: tuple[int, ...]) -> bool:
    """[1, C, 1, ...] of rank 3 or more: one value per channel of what a depthwise conv reads."""
    return len(shape) >= 3 and shape[0] == 1 and all(d == 1 for d in shape[2:])


def _inputs_ready(node: gs.Node, quantized: Collection[str], chosen: Collection[str]) -> bool:
    return all(_on_grid(t, quantized, chosen) or is_small(t) for t, _ in _reads(node))


def _on_grid(tensor: gs.Tensor, quantized: Collection[str], chosen: Collection[str]) -> bool:
    return tensor.name in quantized or bool(tensor.inputs and tensor.inputs[0].name in chosen)


def _readers_ready(
    node: gs.Node, quantized: Collection[str], chosen: Collection[str], layers: Collection[str],
    outputs: Collection[str], paired: Collection[tuple[str, str]] = (),
) -> bool:  # fmt: skip
    """Every reader integer; or a small output, where some reader is integer or some input is a large quantised
    tensor (the DequantizeLinear saved). Never a graph output: its precision is the user's. A movement op: every
    reader of each of its outputs integer, or reading it through a pair placed already (a fused residual Add's
    identity branch: BlazeFace's channel Pad)."""
    if node.op in MOVEMENT_OPS:
        return all(t.outputs and t.name not in outputs
                   and all(_integer(r, quantized, chosen, layers) or (t.name, r.name) in paired for r in t.outputs)
                   for t in node.outputs)  # fmt: skip
    out = node.outputs[0]
    end = _past_shape_ops(out)[0]
    if out.name in outputs or end.name in outputs or not end.outputs:
        return False
    integer = [_integer(r, quantized, chosen, layers) for r in end.outputs]
    if all(integer):
        return True
    return is_small(out) and (any(integer) or any(_on_grid(t, quantized, chosen) and not is_small(t)
                                                  for t, _ in _reads(node)))  # fmt: skip


def _integer(reader: gs.Node, quantized: Collection[str], chosen: Collection[str], layers: Collection[str]) -> bool:
    concat = reader.op == "Concat" and reader.outputs[0].name in quantized  # QLinearConcat: `placement._concat_sites`
    return reader.name in chosen or reader.name in layers or concat


def _writers(node: gs.Node) -> list[gs.Node]:
    return [t.inputs[0] for t, _ in _reads(node) if t.inputs]


def _readers(node: gs.Node) -> list[gs.Node]:
    if node.op in MOVEMENT_OPS:
        return [r for t in node.outputs for r in t.outputs]
    return list(_past_shape_ops(node.outputs[0])[0].outputs)


def _past_shape_ops(tensor: gs.Tensor) -> list[gs.Tensor]:
    """`tensor`, or where its sole reader is a chain of shape ops, the tensor at the chain's end."""
    while len(tensor.outputs) == 1 and tensor.outputs[0].op in SHAPE_OPS and tensor.outputs[0].outputs:
        tensor = tensor.outputs[0].outputs[0]
    return [tensor]


def is_small(tensor: gs.Tensor) -> bool:
    """Whether `tensor` has no spatial extent (N x C x 1 x 1 ..., or N x C): a vector per sample."""
    shape = tensor.shape
    if not shape or len(shape) < 2 or any(not isinstance(d, int) for d in shape[2:]):
        return False
    return all(d == 1 for d in shape[2:])


def _edges_of(
    graph: gs.Graph, nodes: list[gs.Node], edges: Collection[Edge]
) -> tuple[list[Edge], list[tuple[str, str]]]:
    taken = set(edges)
    added: list[Edge] = []
    shared: list[tuple[str, str]] = []

    def add(tensor: gs.Tensor, reader: gs.Node) -> None:
        for index, t in enumerate(reader.inputs):
            if t is tensor and (tensor.name, reader.name, index) not in taken:
                added.append((tensor.name, reader.name, index))
                taken.add((tensor.name, reader.name, index))

    graph_outputs = {t.name for t in graph.outputs}
    for node in nodes:
        for tensor, reader in _reads(node):
            add(tensor, reader)
        if node.op in MOVEMENT_OPS:  # every output on the input's grid (a Concat's: `placement._concat_sites`)
            for out in node.outputs:
                for reader in list(out.outputs):
                    add(out, reader)
                shared += [(out.name, node.inputs[0].name)] if node.op != "Concat" else []
            continue
        out = node.outputs[0]
        end = _past_shape_ops(out)[0]
        for reader in list(out.outputs):
            add(out, reader)
        if end is not out and end.name not in graph_outputs:
            for reader in list(end.outputs):
                add(end, reader)
            shared.append((end.name, out.name))
    return added, shared
