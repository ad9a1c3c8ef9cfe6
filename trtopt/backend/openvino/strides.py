"""Strided 1x1 convolutions on a quantised tensor, written so OpenVINO keeps them INT8.

OpenVINO's `StridesOptimization` (src/common/transformations/src/transformations/common_optimizations/
strides_optimization.cpp, run at the end of `CommonOptimizations`, before the low-precision transformations in
the CPU plugin's `Transformations::PreLpt`, intel_cpu/src/transformations/transformation_pipeline.cpp) moves the
stride of a 1x1 convolution up to the convolution's input: through elementwise ops (`ConvStridesPropagation`,
`SupportedNodesStridesPropagation`) when every consumer asks for the same stride, and where it meets any other
op it inserts a `MaxPool` (kernel 1, that stride). A DequantizeLinear is, by then, Convert -> Subtract ->
Multiply: elementwise. So a dequantised activation read only by stride-2 1x1 convs (a ResNet-50 v1 stage's
entry: branch2a and the projection shortcut) gets the pool between the Convert and the Subtract; the
dequantisation no longer sits on the convolutions' input, LPT leaves them f32 on weights dequantised at every
call (open-nsfw: 6 of 53 convs, brgconv_avx2_1x1_f32, measured on an avx2 EPYC, OpenVINO 2026.4.1). NNCF's
graph does not meet this: its FakeQuantize (not elementwise) stops the propagation.

`subsample_strided_pointwise` does the subsampling itself, after the DequantizeLinear, as an ONNX MaxPool with
kernel 1 (exactly a subsample: one value per window) and the convolutions at stride 1: nothing is left to
propagate, LPT moves the dequantisation through the pool (a precision-preserving op), and pool and
convolutions run u8 (open-nsfw: all 53 convs INT8, as NNCF's). Same values, same arithmetic as before.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _strided_pointwise(node: onnx.NodeProto, tensor: str) -> tuple[int, ...] | None:
    """The strides of a 1x1 Conv reading `tensor` as its data without padding, or None for any other node."""
    if node.op_type != "Conv" or not node.input or node.input[0] != tensor:
        return None
    attrs = _attributes(node)
    kernel = attrs.get("kernel_shape")
    if not isinstance(kernel, list) or not kernel or any(k != 1 for k in kernel):
        return None  # a kernel read from the weight's shape: left alone (trtopt's passes write kernel_shape)
    pads = attrs.get("pads") or [0] * (2 * len(kernel))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    if any(pads) or auto_pad not in (b"NOTSET", b"VALID", "NOTSET", "VALID"):
        return None
    strides = attrs.get("strides") or [1] * len(kernel)
    return tuple(int(s) for s in strides)


def subsample_strided_pointwise(model: onnx.ModelProto) -> int:
    """For each DequantizeLinear whose output only unpadded 1x1 Convs read, all with the same stride > 1: a
    MaxPool (kernel 1, that stride) after it, the Convs at stride 1. In place; returns how many tensors."""
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    nodes: list[onnx.NodeProto] = []
    changed = 0
    for node in graph.node:
        nodes.append(node)
        if node.op_type != "DequantizeLinear" or node.output[0] in outputs:
            continue
        tensor = node.output[0]
        convs = readers.get(tensor, [])
        strides = {_strided_pointwise(conv, tensor) for conv in convs}
        if not convs or len(strides) != 1 or None in strides:
            continue
        stride = strides.pop()
        if stride is None or all(s == 1 for s in stride):
            continue
        sub = f"{tensor}/subsampled"
        nodes.append(helper.make_node("MaxPool", [tensor], [sub], name=f"{node.name or tensor}/subsample",
                                      kernel_shape=[1] * len(stride), strides=list(stride)))  # fmt: skip
        for conv in convs:
            conv.input[0] = sub
            for attr in conv.attribute:
                if attr.name == "strides":
                    attr.ints[:] = [1] * len(stride)
        changed += 1
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)
    return changed
