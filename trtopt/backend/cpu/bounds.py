"""The least value a tensor can take, read from the graph alone: what the CPU lowering's uint8 grid can skip.

TensorRT's INT8 grid is symmetric: a tensor with threshold T is stored in steps of T / 127 over [-T, T].
ONNX Runtime's uint8 activations take a zero point, so a tensor that cannot fall below some L > -T needs
only [L, T] in its 255 steps (`trtopt.backend.cpu.lowering`):

- L = 0, after Relu, Sigmoid, Softmax, a Clip at 0 or above and the like (`NON_NEGATIVE_OPS`): steps of T / 255;
- L < 0 for the gated activations of most recent models: SiLU x * sigmoid(x) (L = -0.2785), HardSwish
  (-0.375), GELU (-0.1700), Mish (-0.3088); with T = 6 a HardSwish output is stored in steps of 6.375 / 255
  instead of 6 / 127, 1.88 times finer.

Exporters spell those activations many ways (PaddlePaddle's HardSwish as Add, Clip, Mul, Div; GELU's erf
form in three groupings; TensorFlow's SiLU through Mul with a sigmoid of a scaled input), so a tensor's bound
is not matched op by op: where a tensor is an element-wise function of one other tensor, with scalar constants
only (`ELEMENT_WISE`), that function is evaluated on a grid of inputs from -1e6 to 1e6, dense (steps of 1e-3)
over [-8, 8] where the activations bend, with the ONNX reference evaluator, so any spelling gives its bound.
A function still falling at an end of the grid has none (x + 1, a LeakyRelu), one flat there has its
value there (a Clip at -1, a Tanh), and one with values that are not finite is left alone. Each op of
`VALUE_PRESERVING_OPS` keeps its input's bound (Concat: the least of its inputs'). The bound found is lowered
by a margin (`MARGIN`), as a grid of finite steps can miss the true minimum between two points by a little;
a value below the bound would clip to it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtopt.calib.ranges import VALUE_PRESERVING_OPS
from trtopt.passes.query import read_clip_bounds

log = logging.getLogger(__name__)

# Ops whose output is non-negative whatever their input.
NON_NEGATIVE_OPS = {"Relu", "Sigmoid", "HardSigmoid", "Softmax", "Abs", "Exp", "Softplus"}
# Element-wise ops a bounded function of one tensor is built from (other inputs: scalar constants).
ELEMENT_WISE = {
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Neg", "Clip", "Relu", "Sigmoid", "HardSigmoid", "HardSwish",
    "Tanh", "Erf", "Softplus", "Exp", "Abs", "Elu", "Selu", "Celu", "LeakyRelu", "Mish", "Gelu", "Identity",
}  # fmt: skip
PAIR_OPS = ("QuantizeLinear", "DequantizeLinear")
# The reference evaluator runs Q/DQ from opset 19 on; with scalar scales they compute what opset 13's do, and the
# element-wise ops of `ELEMENT_WISE` compute the same on float inputs at both.
PAIR_OPSET = 19
MOST_NODES = 16  # the longest element-wise chain evaluated (GELU's tanh form takes 9)
_REMEMBERED = 4096  # chains evaluated and kept (a model repeats a few kinds; each sensitivity trial lowers again)
_EVALUATED: dict[bytes, float | None] = {}
MARGIN = 1e-3  # relative: how far below the least value found the bound is put
SOURCE = "bounds/source"  # the chain's one input, as the evaluated copy names it
_GRID = np.concatenate([-np.logspace(6, -4, 2001), np.linspace(-8, 8, 16001), np.logspace(-4, 6, 2001)])


def lower_bounds(model: onnx.ModelProto, wanted: set[str] | None = None) -> dict[str, float]:
    """tensor -> the least value it can take (0.0: non-negative), for the tensors of `model` (its graph in
    topological order) that have one. `wanted`: the tensors asked about (None: all), so that only the chains
    they are computed from are evaluated."""
    graph = model.graph
    consts = _constants(graph)
    producers = {out: node for node in graph.node for out in node.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    found: dict[str, float] = {}
    needed = _upstream(wanted, producers) if wanted is not None else None
    for node in graph.node:
        if needed is not None and not any(out in needed for out in node.output):
            continue
        bound = _bound(node, found, producers, consts, opset)
        if bound is not None:
            found.update((out, bound) for out in node.output if out)
    return found


def _bound(
    node: onnx.NodeProto, found: Mapping[str, float], producers: Mapping[str, onnx.NodeProto],
    consts: Mapping[str, onnx.TensorProto], opset: int,
) -> float | None:  # fmt: skip
    if node.op_type in NON_NEGATIVE_OPS:
        return 0.0
    if node.op_type == "Clip":
        low = _clip_min(node, consts)
        if low >= 0:
            return 0.0
    if node.op_type == "Pad":
        return _pad_bound(node, found, consts)
    if node.op_type in VALUE_PRESERVING_OPS:
        data = [i for i in node.input if i] if node.op_type == "Concat" else [i for i in node.input[:1] if i]
        bounds = [found.get(i) for i in data]
        return min(bounds) if bounds and all(b is not None for b in bounds) else None  # type: ignore[type-var]
    if node.op_type in ELEMENT_WISE and node.domain in ("", "ai.onnx"):
        return _function_bound(node, producers, consts, opset)
    return None


def _function_bound(
    last: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto], consts: Mapping[str, onnx.TensorProto], opset: int
) -> float | None:  # fmt: skip
    """The least value of `last`'s output as a function of the one tensor its element-wise chain starts from."""
    chain = _chain(last, producers, consts)
    if chain is None:
        return None
    low = _least_value(*chain, last.output[0], consts, opset)
    if low is None:
        return None
    return 0.0 if low >= 0 else low - MARGIN * abs(low)


def _chain(
    last: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto], consts: Mapping[str, onnx.TensorProto]
) -> tuple[list[onnx.NodeProto], set[str]] | None:  # fmt: skip
    """(the element-wise nodes from one source tensor to `last`, in graph order; the names that source goes
    by), or None where `last` reads more than one non-constant tensor through such nodes, a constant of
    more than one value, or more than `MOST_NODES` nodes. The chain grows back from `last` until every input is
    a constant or the one tensor not made by an element-wise node; in a Q/DQ graph, the outputs of Q/DQ pairs
    of the same tensor with the same scale and zero point are that one tensor (`_pair_key`: a SiLU whose
    Sigmoid and Mul each read x through a pair of their own). A pair on a tensor that an element-wise node makes
    is part of the chain (`_walks`: SiLU on the integer grid, whose Mul reads the Sigmoid through a pair)."""
    nodes: dict[int, onnx.NodeProto] = {}
    sources: dict[object, set[str]] = {}
    stack = [last]
    while stack:
        node = stack.pop()
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        if len(nodes) > MOST_NODES:
            return None
        for name in node.input:
            if not name:
                continue
            if name in consts:
                if int(np.prod(consts[name].dims)) != 1:
                    return None
                continue
            made_by = producers.get(name)
            if made_by is not None and _walks(made_by, producers):
                stack.append(made_by)
            else:
                sources.setdefault(_pair_key(name, producers, consts), set()).add(name)
    if len(sources) != 1:
        return None
    order = {id(n): i for i, n in enumerate(producers.values())}
    return sorted(nodes.values(), key=lambda n: order.get(id(n), 0)), next(iter(sources.values()))


def _walks(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether `node` is element-wise, or a QuantizeLinear of an element-wise node's output or the
    DequantizeLinear of such (its scale and zero point must be scalars, as `_chain` checks)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ELEMENT_WISE:
        return True
    if node.op_type == "DequantizeLinear":
        node = producers.get(node.input[0])  # type: ignore[assignment]
        if node is None or node.op_type != "QuantizeLinear":
            return False
    made_by = producers.get(node.input[0]) if node.op_type == "QuantizeLinear" else None
    return made_by is not None and made_by.op_type in ELEMENT_WISE and made_by.domain in ("", "ai.onnx")


def _pair_key(
    name: str, producers: Mapping[str, onnx.NodeProto], consts: Mapping[str, onnx.TensorProto]
) -> object:  # fmt: skip
    """What identifies the values of tensor `name`: for a DequantizeLinear of a QuantizeLinear, the tensor
    quantised and the pair's scale and zero point; else the name."""
    dq = producers.get(name)
    q = producers.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
    if dq is None or q is None or q.op_type != "QuantizeLinear" or list(q.input[1:]) != list(dq.input[1:]):
        return name
    params = [consts.get(n) for n in q.input[1:]]
    if any(p is None for p in params):
        return name
    return (q.input[0], *(numpy_helper.to_array(p).tobytes() for p in params if p is not None))


def _least_value(
    nodes: list[onnx.NodeProto], source: set[str], output: str, consts: Mapping[str, onnx.TensorProto], opset: int
) -> float | None:  # fmt: skip
    """The least value of `output` over `_GRID` as the tensor `nodes` read by the names in `source`; None where
    the function still falls at an end of the grid or some value is not finite (no bound), or the reference
    evaluator cannot run the chain. A chain alike to one evaluated before (the same ops, attributes and
    constants) is not evaluated again."""
    names = dict.fromkeys(source, SOURCE)  # every other tensor renamed by first use, so that alike chains match
    for node in nodes:
        for name in (*node.input, *node.output):
            if name:
                names.setdefault(name, f"t{len(names)}")
    chain = []
    for node in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = ""
        copy.input[:] = [names.get(n, n) for n in node.input]
        copy.output[:] = [names.get(n, n) for n in node.output]
        chain.append(copy)
    read = sorted({name for node in nodes for name in node.input if name in consts})
    if any(node.op_type in PAIR_OPS for node in nodes):
        opset = max(opset, PAIR_OPSET)
    model = helper.make_model(
        helper.make_graph(
            chain, "bound", [helper.make_tensor_value_info(SOURCE, onnx.TensorProto.FLOAT, [None])],
            [helper.make_tensor_value_info(names[output], onnx.TensorProto.FLOAT, None)],
            [_renamed(consts[name], names[name]) for name in read],
        ),
        opset_imports=[helper.make_opsetid("", opset)],
    )  # fmt: skip
    key = model.SerializeToString(deterministic=True)
    if key not in _EVALUATED:
        if len(_EVALUATED) >= _REMEMBERED:
            _EVALUATED.clear()
        _EVALUATED[key] = _evaluated_least(model)
    return _EVALUATED[key]


def _evaluated_least(model: onnx.ModelProto) -> float | None:
    """`_least_value` of the one chain `model` holds."""
    from onnx.reference import ReferenceEvaluator

    try:
        with np.errstate(all="ignore"):  # exp overflows at the grid's ends; the functions' values stay finite
            outputs = list(ReferenceEvaluator(model).run(None, {SOURCE: _GRID.astype(np.float32)}))
        values = np.asarray(outputs[0], np.float64)
    except Exception as exc:  # noqa: BLE001 - any failure means no bound, never a failed build
        log.debug("no lower bound for a chain of %s: %s", [n.op_type for n in model.graph.node], exc)
        return None
    values = values.reshape(-1)
    if values.size != _GRID.size or not np.all(np.isfinite(values)):
        return None
    at = int(np.argmin(values))
    still_falling = (at == 0 and values[0] < values[1]) or (at == values.size - 1 and values[-1] < values[-2])
    return None if still_falling else float(values[at])


def _upstream(wanted: set[str], producers: Mapping[str, onnx.NodeProto]) -> set[str]:
    """`wanted` and the tensors they are computed from through the ops that keep a bound."""
    seen: set[str] = set()
    stack = list(wanted)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producers.get(name)
        if node is not None and node.op_type in VALUE_PRESERVING_OPS | {"Pad"}:
            stack.extend(i for i in node.input if i)
    return seen


def _pad_bound(node: onnx.NodeProto, found: Mapping[str, float], consts: Mapping[str, onnx.TensorProto]
               ) -> float | None:  # fmt: skip
    """A Pad keeps its input's bound, and a constant-mode one adds its value (0 where none is given): BlazeFace's
    channel Pad of a Relu's output is non-negative."""
    bound = found.get(node.input[0]) if node.input else None
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "constant")
    if bound is None or mode != "constant":
        return bound
    name = node.input[2] if len(node.input) > 2 else ""
    if name and (name not in consts or int(np.prod(consts[name].dims)) != 1):
        return None
    value = float(numpy_helper.to_array(consts[name]).reshape(-1)[0]) if name else 0.0
    return min(bound, value)


def _clip_min(node: onnx.NodeProto, consts: Mapping[str, onnx.TensorProto]) -> float:
    attrs = {a.name: a.f for a in node.attribute}
    value = lambda n: numpy_helper.to_array(consts[n]) if n in consts else None  # noqa: E731
    low, _ = read_clip_bounds(attrs, node.input[1:3], value, lambda n: not n)
    return -np.inf if low is None else low


def _constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant nodes' values, by tensor name."""
    found = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = node.attribute[0].t
    return found


def _renamed(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy

