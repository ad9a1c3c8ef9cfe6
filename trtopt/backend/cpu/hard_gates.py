"""HardSigmoid and HardSwish between pairs, written as ONNX Runtime's integer Add and Mul in the CPU plan.

ONNX Runtime has no integer kernel for HardSigmoid or HardSwish (it expands HardSwish into HardSigmoid and Mul), so
MobileNetV3's activations and squeeze-excite gates ran in float between a DequantizeLinear and a QuantizeLinear
(docs/exports.md: at b8 on the corpus's MobileNetV3, 8.4 ms of float Mul and 2 ms of HardSigmoid in a 41 ms run).
Both have an integer form its QDQ fusions turn into QLinearAdd and QLinearMul:

- HardSigmoid(x) = clip(alpha * x + beta, 0, 1). A uint8 tensor q with scale s and zero point z holds
  x = s * (q - z); read through a second DequantizeLinear with scale alpha * s and the same zero point it holds
  alpha * x, exactly (the same bytes, no rounding). Adding the constant beta (a DequantizeLinear of one uint8
  value) and quantising to a grid with zero point 0 whose top value 255 * scale is at most 1 is the whole op:
  uint8 saturation is the clip. DQ -> Add -> Q is ONNX Runtime's QLinearAdd (one rounding, where the float op
  rounds once at its QuantizeLinear too).
- HardSwish(x) = x * HardSigmoid(x; 1/6, 1/2): the gate as above, quantised to [0, 1] in 255 steps (scale 1/255,
  zero point 0: the one rounding the integer form adds, at most half a step of 1/255 of the gate), then
  DQ(x) * DQ(gate) -> Q, ONNX Runtime's QLinearMul on the HardSwish output's grid.
- HardSigmoid(c * x), c one positive constant per channel (the gate of a HardSwish that activation equalisation
  rescaled, `trtopt.quant.equalize`): a depthwise 1x1 conv with weights alpha * c and bias beta into the same
  [0, 1] grid, ONNX Runtime's QLinearConv (one rounding; the bias on its int32 grid, within 1/254 of an input step).
- a * x + b (or x - b), a and b one per channel or one for all (PP-LCNetV3's affine block, its b per channel once
  equalised; `trtopt.quant.gates.channel_offset`): the same depthwise conv with weights a and bias b.

A HardSigmoid whose QuantizeLinear has another grid (a zero point other than 0, or a top above 1: a calibration
cache from another tool) stays float. Where the pairs are is `trtopt.quant.gates`'s decision (`QuantConfig.
integer_hard_swish`); this module only writes, in the lowered (uint8) model, each op that already reads a
DequantizeLinear and whose only reader is a QuantizeLinear. A global ReduceMean (over every spatial axis, keeping
them: how PyTorch's dynamo exporter writes a squeeze-excite pool) between pairs becomes GlobalAveragePool, which
computes the same and which ONNX Runtime runs as QLinearGlobalAveragePool.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtopt.quant.gates import channel_vector

HARD_SWISH = (1.0 / 6.0, 0.5)  # alpha, beta (ONNX HardSwish)
HARD_SIGMOID_DEFAULT = (0.2, 0.5)  # ONNX HardSigmoid's default attributes
GATE_SCALE = 1.0 / 255.0  # a HardSwish gate's grid: [0, 1] in 255 steps


def write_hard_gates(graph: onnx.GraphProto) -> int:
    """Rewrite (in place) each HardSigmoid, HardSwish and global ReduceMean that reads a uint8 DequantizeLinear
    and is read by one uint8 QuantizeLinear into the integer form (see the module); returns how many."""
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    ranks = _ranks(graph)
    rewritten: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        scale = _input_scale(node, producers, readers, inits)
        source = [name for name in (scale or node).input if name not in inits][:1]
        dq = producers.get(source[0]) if source else None
        after = readers.get(node.output[0], []) if node.output else []
        pair = dq is not None and _uint8_pair(dq, inits) and len(after) == 1 and _uint8_pair(after[0], inits)
        new = None
        if pair and dq is not None and (scale is not None or _offset(node, inits) is not None):
            new = _scaled(node, scale, dq, after[0], inits, graph)
        elif pair and dq is not None:
            new = _rewrite(node, dq, after[0], inits, graph, ranks)
        rewritten.extend(new if new is not None else [node])
        count += new is not None
    if count:
        read = _names_read(rewritten) | {o.name for o in graph.output}
        del graph.node[:]  # a DequantizeLinear (or an input's scale Mul) that only the rewritten op read is dead now
        graph.node.extend(n for n in rewritten if n.op_type not in ("DequantizeLinear", "Mul") or n.output[0] in read)
    return count


def _channel_value(tensor: onnx.TensorProto) -> np.ndarray | None:
    """A constant's value where it is one number or one per channel ([1, C, 1, ...], rank 3 or more: what a depthwise
    conv reads; `trtopt.quant.gates` checked it against the other operand's rank), else None."""
    value = numpy_helper.to_array(tensor).astype(np.float64)
    return value if value.size == 1 or channel_vector(value.shape) else None


def _offset(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> np.ndarray | None:
    """b of x + b, b + x or x - b (as -b), b a constant of `_channel_value`'s shapes; None for any other node."""
    if node.op_type not in ("Add", "Sub") or len(node.input) != 2 or sum(n in inits for n in node.input) != 1:
        return None
    if node.op_type == "Sub" and node.input[1] not in inits:
        return None
    value = _channel_value(inits[next(n for n in node.input if n in inits)])
    return None if value is None else -value if node.op_type == "Sub" else value


def _input_scale(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], readers: dict[str, list[onnx.NodeProto]],
                 inits: dict[str, onnx.TensorProto]) -> onnx.NodeProto | None:  # fmt: skip
    """The Mul by constants (`_channel_value`'s shapes) that feeds a HardSigmoid (positive ones: an equalised
    HardSwish's gate, `trtopt.quant.gates.gate_scale`) or an Add / Sub of constants (nonzero ones: PP-LCNetV3's
    affine block, `trtopt.quant.gates.channel_offset`) and nothing else; None where there is none."""
    data: str | None = None
    if node.op_type == "HardSigmoid" and node.input:
        data = node.input[0]
    elif _offset(node, inits) is not None:
        data = next(n for n in node.input if n not in inits)
    mul = producers.get(data) if data is not None else None
    if data is None or mul is None or mul.op_type != "Mul" or len(readers.get(data, [])) != 1 or len(mul.input) != 2:
        return None
    constants = [inits[name] for name in mul.input if name in inits]
    value = _channel_value(constants[0]) if len(constants) == 1 else None
    if value is None:
        return None
    return mul if np.all(value > 0) or node.op_type != "HardSigmoid" and np.all(value != 0) else None


def _scaled(node: onnx.NodeProto, mul: onnx.NodeProto | None, dq: onnx.NodeProto, q: onnx.NodeProto,
            inits: dict[str, onnx.TensorProto], graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:
    """HardSigmoid(c * x) for a QuantizeLinear on [0, 1] (its saturation the clip), or a * x + b, with c, a, b one
    value per channel or one for all: a depthwise 1x1 conv (weights alpha * c or a; bias beta or b), ONNX Runtime's
    QLinearConv, whose depthwise kernel is exact on every CPU kind; with one value for all and a positive weight,
    the QLinearAdd form (`_gate`)."""
    scale = np.ones(1) if mul is None else _channel_value(next(inits[n] for n in mul.input if n in inits))
    offset = _offset(node, inits)
    if scale is None:
        return None
    if node.op_type == "HardSigmoid":
        alpha, beta = (_attr(node, "alpha", HARD_SIGMOID_DEFAULT[0]), _attr(node, "beta", HARD_SIGMOID_DEFAULT[1]))
        if not alpha > 0 or not _clips_to_unit(q, inits):
            return None
        scale, offset = alpha * scale, np.array(beta)
    assert offset is not None
    name = node.name or node.output[0]
    if scale.size == 1 and offset.size == 1:
        weight = float(scale.reshape(()))
        return _gate(name, dq, weight, float(offset.reshape(())), node.output[0], inits, graph) if weight > 0 else None
    return _depthwise(name, dq, scale, offset, node.output[0], inits, graph)


def _depthwise(name: str, dq: onnx.NodeProto, weights: np.ndarray, bias: np.ndarray, out: str,
               inits: dict[str, onnx.TensorProto], graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:  # fmt: skip
    """y = weights * x + bias per channel as a depthwise 1x1 conv reading `dq`'s uint8 tensor. Each weight is stored
    as +-127 with its own scale (|w| / 127: exact), the bias on the int32 grid ONNX Runtime requires (input scale
    times weight scale: within 1/254 of one input step)."""
    channels, rank = max(weights.size, bias.size), max(weights.ndim, bias.ndim)
    w = np.broadcast_to(weights.reshape(-1), (channels,))
    w_scale = np.abs(w) / 127.0
    step = _scalar(inits[dq.input[1]]) * w_scale
    bias_q = np.round(np.broadcast_to(bias.reshape(-1), (channels,)) / step)
    if not np.all(w_scale > 0) or not np.all(np.abs(bias_q) < 2**31 - 1):
        return None
    names = [_constant(graph, inits, f"{name}/{part}", array) for part, array in (
        ("w_q", (127 * np.sign(w)).astype(np.int8).reshape(channels, 1, *[1] * (rank - 2))),
        ("w_scale", w_scale.astype(np.float32)), ("w_zero_point", np.zeros(channels, np.int8)),
        ("b_q", bias_q.astype(np.int32)), ("b_scale", step.astype(np.float32)),
        ("b_zero_point", np.zeros(channels, np.int32)))]  # fmt: skip
    return [
        helper.make_node("DequantizeLinear", names[:3], [f"{name}/w"], name=f"{name}/w/DQ", axis=0),
        helper.make_node("DequantizeLinear", names[3:], [f"{name}/b"], name=f"{name}/b/DQ", axis=0),
        helper.make_node("Conv", [dq.output[0], f"{name}/w", f"{name}/b"], [out], name=f"{name}/conv",
                         group=channels, kernel_shape=[1] * (rank - 2)),  # fmt: skip
    ]


def _rewrite(node: onnx.NodeProto, dq: onnx.NodeProto, q: onnx.NodeProto, inits: dict[str, onnx.TensorProto],
             graph: onnx.GraphProto, ranks: dict[str, int]) -> list[onnx.NodeProto] | None:  # fmt: skip
    if node.op_type == "HardSigmoid":
        alpha, beta = (_attr(node, "alpha", HARD_SIGMOID_DEFAULT[0]), _attr(node, "beta", HARD_SIGMOID_DEFAULT[1]))
        if not alpha > 0 or not _clips_to_unit(q, inits):
            return None
        return _gate(node.name or node.output[0], dq, alpha, beta, node.output[0], inits, graph)
    if node.op_type == "HardSwish":
        return _hard_swish(node, dq, inits, graph)
    if node.op_type == "ReduceMean" and _is_global_mean(node, inits, ranks.get(node.output[0])):  # keepdims: its rank
        return [helper.make_node("GlobalAveragePool", [node.input[0]], list(node.output), name=node.name)]
    return None


def _gate(name: str, dq: onnx.NodeProto, alpha: float, beta: float, out: str, inits: dict[str, onnx.TensorProto],
          graph: onnx.GraphProto) -> list[onnx.NodeProto]:  # fmt: skip
    """alpha * x (x's bytes read at alpha times its scale) + beta, written to `out`: DQ -> Add for a QuantizeLinear."""
    scale = _scalar(inits[dq.input[1]])
    scaled = _constant(graph, inits, f"{name}/alpha_scale", np.array(alpha * scale, np.float32))
    value, zero, step = (1, 0, beta) if beta > 0 else (0, 1, -beta) if beta < 0 else (0, 0, 1.0)
    names = [_constant(graph, inits, f"{name}/beta_{part}", array) for part, array in
             (("q", np.array(value, np.uint8)), ("scale", np.array(step, np.float32)),
              ("zero_point", np.array(zero, np.uint8)))]  # fmt: skip
    return [
        helper.make_node("DequantizeLinear", [dq.input[0], scaled, dq.input[2]], [f"{name}/alpha_x"],
                         name=f"{name}/alpha_x/DQ"),  # fmt: skip
        helper.make_node("DequantizeLinear", names, [f"{name}/beta"], name=f"{name}/beta/DQ"),
        helper.make_node("Add", [f"{name}/alpha_x", f"{name}/beta"], [out], name=f"{name}/add"),
    ]


def _hard_swish(node: onnx.NodeProto, dq: onnx.NodeProto, inits: dict[str, onnx.TensorProto],
                graph: onnx.GraphProto) -> list[onnx.NodeProto]:  # fmt: skip
    """x * gate, the gate quantised on [0, 1] in 255 steps, for the HardSwish output's QuantizeLinear."""
    name = node.name or node.output[0]
    gate = f"{name}/gate"
    grid = [_constant(graph, inits, f"{gate}/scale", np.array(GATE_SCALE, np.float32)),
            _constant(graph, inits, f"{gate}/zero_point", np.array(0, np.uint8))]  # fmt: skip
    return [
        *_gate(name, dq, *HARD_SWISH, gate, inits, graph),
        helper.make_node("QuantizeLinear", [gate, *grid], [f"{gate}/q"], name=f"{gate}/Q"),
        helper.make_node("DequantizeLinear", [f"{gate}/q", *grid], [f"{gate}/dq"], name=f"{gate}/DQ"),
        helper.make_node("Mul", [node.input[0], f"{gate}/dq"], list(node.output), name=f"{name}/mul"),
    ]


def _names_read(nodes: list[onnx.NodeProto]) -> set[str]:
    """Every name `nodes` read, in their subgraphs (If / Loop bodies) too."""
    names = set()
    for node in nodes:
        names.update(node.input)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                names |= _names_read(list(sub.node))
    return names


def _uint8_pair(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A Quantize- or DequantizeLinear with a scalar scale and a scalar uint8 zero point, both constants (as the
    lowering writes them; ONNX Runtime 1.32 fused the integer Add only with scalars, not with [1] shapes)."""
    if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
        return False
    scale, zero = inits.get(node.input[1]), inits.get(node.input[2])
    return (scale is not None and zero is not None and not scale.dims and not zero.dims
            and zero.data_type == onnx.TensorProto.UINT8)  # fmt: skip


def _clips_to_unit(q: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """Whether the QuantizeLinear's saturation clips to [0, t] with t <= 1, so that it stands for the clip."""
    scale, zero = _scalar(inits[q.input[1]]), _scalar(inits[q.input[2]])
    return zero == 0 and 0 < 255 * scale <= 1 + 1e-6


def _scalar(tensor: onnx.TensorProto) -> float:
    return float(numpy_helper.to_array(tensor).reshape(-1)[0])


def _is_global_mean(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], rank: int | None) -> bool:
    """A ReduceMean over every axis after the channels, keeping them (GlobalAveragePool's output shape)."""
    if rank is None or rank < 3 or _attr(node, "keepdims", 1) != 1:
        return False
    if len(node.input) > 1 and node.input[1]:
        axes_init = inits.get(node.input[1])
        axes = numpy_helper.to_array(axes_init).tolist() if axes_init is not None else None
    else:
        attr = next((a for a in node.attribute if a.name == "axes"), None)
        axes = list(attr.ints) if attr is not None else None
    return axes is not None and sorted(a % rank for a in axes) == list(range(2, rank))


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    infos = [*graph.input, *graph.value_info, *graph.output]
    return {i.name: len(i.type.tensor_type.shape.dim) for i in infos if i.type.tensor_type.HasField("shape")}


def _attr(node: onnx.NodeProto, name: str, default: float) -> float:
    attr = next((a for a in node.attribute if a.name == name), None)
    return float(helper.get_attribute_value(attr)) if attr is not None else default


def _constant(graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], name: str, value: np.ndarray) -> str:
    graph.initializer.append(numpy_helper.from_array(value, name))
    inits[name] = graph.initializer[-1]
    return name
