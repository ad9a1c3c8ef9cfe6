"""A quantised fully connected layer written as a 1x1 convolution, which OpenVINO runs faster.

OpenVINO's CPU plugin runs an INT8 Gemm / MatMul as `FullyConnected` on `jit_gemm_I8` (the legacy quantised
path), a 1x1 Convolution on its blocked int8 conv kernels (`jit_avx2_1x1_I8` on AVX2) with the weights packed
once at compile time. Measured on an avx2 EPYC (OpenVINO 2026.4.1, 1 thread, 300 interleaved rounds), a
1280 -> 1000 classifier took 438 us as a Gemm and 314 us as a 1x1 conv at batch 1 (823 / 575 us at batch 8); it
was the costliest single layer of keras-mobilenetv2 at batch 1 (10% of the time), and writing it as a conv
raised the whole model's speed-up over FP32 on ONNX Runtime from 1.34x to 1.41x at batch 1 (the demo: 1.31x ->
1.39x), level at batch 8. Not measured on VNNI / AMX CPUs.

`fc_as_pointwise_conv`: x (B, K) -> Reshape (B, K, 1, 1) -> Conv 1x1 with the int8 weights as (N, K, 1, 1) ->
Reshape (B, N). The activation's DequantizeLinear stays on the Reshape's input (LPT moves it through), the
weights keep their grid and scales (per output channel on axis 0), the bias is the Conv's. The same products,
summed in another order.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtopt.frontend import weightless


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> rank, where ONNX shape inference knows it."""
    try:
        inferred = weightless.infer_shapes(model)
    except Exception:  # noqa: BLE001 - shape inference is a convenience here: without it nothing is rewritten
        return {}
    infos = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {i.name: len(i.type.tensor_type.shape.dim) for i in infos if i.type.tensor_type.HasField("shape")}


def _dense_weight(node: onnx.NodeProto, graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto],
                  ranks: dict[str, int], readers: dict[str, int]) -> tuple[onnx.NodeProto, bool] | None:  # fmt: skip
    """(the weight's DequantizeLinear, whether the stored weight is (N, K)) for a Gemm / MatMul this rewrite
    handles, else None: 2-D input, int8 2-D constant weights read by this node only, a bias of N values."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gemm":
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            return None
    elif node.op_type != "MatMul" or ranks.get(node.input[0]) != 2:
        return None
    made_by = {out: n for n in graph.node for out in n.output}
    dq = made_by.get(node.input[1])
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or readers[dq.output[0]] != 1:
        return None
    if readers[dq.input[0]] != 1 or inits[dq.input[0]].data_type != onnx.TensorProto.INT8:
        return None
    shape = tuple(inits[dq.input[0]].dims)
    transposed = bool(attrs.get("transB", 0)) if node.op_type == "Gemm" else False
    if len(shape) != 2 or (len(node.input) > 2 and not _is_vector(node.input[2], made_by, inits,
                                                                    shape[0] if transposed else shape[1])):  # fmt: skip
        return None
    return dq, transposed


def _is_vector(name: str, made_by: dict[str, onnx.NodeProto], inits: dict[str, onnx.TensorProto], n: int) -> bool:
    """Whether a Gemm's C is a constant of shape (N,), directly or through a DequantizeLinear (trtopt's biases)."""
    source = made_by[name].input[0] if name in made_by and made_by[name].op_type == "DequantizeLinear" else name
    return source in inits and tuple(inits[source].dims) == (n,)


def fc_as_pointwise_conv(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each Gemm / MatMul on int8 weights (`_dense_weight`) as Reshape -> 1x1 Conv -> Reshape;
    returns how many."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    ranks = _ranks(model)
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    nodes: list[onnx.NodeProto] = []
    changed = 0
    for node in graph.node:
        found = _dense_weight(node, graph, inits, ranks, readers)
        if found is None:
            nodes.append(node)
            continue
        dq, transposed = found
        q = numpy_helper.to_array(inits[dq.input[0]])
        weight = q if transposed else q.T  # (N, K)
        inits[dq.input[0]].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(weight)[:, :, None, None],
                                                            dq.input[0]))  # fmt: skip
        del dq.attribute[:]
        dq.attribute.append(helper.make_attribute("axis", 0))
        base = node.name or node.output[0]
        graph.initializer.extend([numpy_helper.from_array(np.array([0, -1, 1, 1], np.int64), f"{base}/as_nchw"),
                                  numpy_helper.from_array(np.array([0, -1], np.int64), f"{base}/as_rows")])
        image, conv_out = f"{node.input[0]}/{base}/nchw", f"{node.output[0]}/nchw"
        bias = [node.input[2]] if node.op_type == "Gemm" and len(node.input) > 2 else []
        nodes += [helper.make_node("Reshape", [node.input[0], f"{base}/as_nchw"], [image], name=f"{base}/to_nchw"),
                  helper.make_node("Conv", [image, dq.output[0], *bias], [conv_out], name=base, kernel_shape=[1, 1]),
                  helper.make_node("Reshape", [conv_out, f"{base}/as_rows"], [node.output[0]], name=f"{base}/rows")]
        changed += 1
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)
    return changed
