"""A small model with every kind of layer 2:4 sparsity treats differently, and a hand-written 2:4 mask.

    input 1x8x10x10
      ─ Conv3x3 8->16 ─ Relu          conv_1  eligible (8 input channels)
      ─ Conv3x3 depthwise 16          conv_2  not eligible (1 input channel per group)
      ─ Conv1x1 16->12                conv_3  eligible
      ─ Conv3x3 12->6                 conv_4  eligible (12)
      ─ Conv1x1 6->8                  conv_5  not eligible (6 input channels)
      ─ GlobalAveragePool ─ Flatten
      ─ Gemm transB 8->8              gemm_1  eligible (K = 8, axis 1 of the [N, K] weight)
      ─ MatMul 8->4 ─ Add             matmul_1 eligible (K = 8, axis 0 of the [K, N] weight) ─ logits
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtopt.zoo.builder import GraphBuilder

ELIGIBLE = {"conv_1": 1, "conv_3": 1, "conv_4": 1, "gemm_1": 1, "matmul_1": 0}  # layer -> 2:4 axis
NOT_ELIGIBLE = ("conv_2", "conv_5")


def mixed_model(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    b = GraphBuilder("mixed", seed=seed, opset=13)
    x = b.input("input", [batch, 8, 10, 10])
    y = b.relu(b.conv(x, 8, 16, 3))
    y = b.conv(y, 16, 16, 3, group=16)
    y = b.conv(y, 16, 12, 1)
    y = b.conv(y, 12, 6, 3)
    y = b.conv(y, 6, 8, 1)
    y = b.gemm(b.pool_flatten(y), 8, 8)
    return b.build([b.linear_matmul(y, 8, 4, out="logits")])


def weights_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """{layer: its weight} for the Conv / Gemm / MatMul nodes, read from the initializers."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.name: inits[n.input[1]] for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")}


def mask_by_hand(weight: np.ndarray, axis: int) -> np.ndarray:
    """The 2:4 keep-mask written out with loops, independently of trtopt: for every position of the other
    axes, walk the groups of four along `axis` and keep the two largest magnitudes (lower index on ties)."""
    keep = np.zeros(weight.shape, dtype=bool)
    others = [range(n) for i, n in enumerate(weight.shape) if i != axis]
    for index in np.ndindex(*[len(r) for r in others]):
        for start in range(0, weight.shape[axis], 4):
            group = [(*index[:axis], start + j, *index[axis:]) for j in range(4)]
            ranked = sorted(range(4), key=lambda j: (-abs(float(weight[group[j]])), j))
            for j in ranked[:2]:
                keep[group[j]] = True
    return keep


def with_masks_by_hand(model: onnx.ModelProto, layers: dict[str, int]) -> onnx.ModelProto:
    """A copy of `model` whose listed layers' weights are multiplied by `mask_by_hand`."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    weight_names = {n.input[1]: n.name for n in result.graph.node if n.name in layers}
    for i, tensor in enumerate(result.graph.initializer):
        layer = weight_names.get(tensor.name)
        if layer is not None:
            values = numpy_helper.to_array(tensor)
            masked = np.where(mask_by_hand(values, layers[layer]), values, 0).astype(values.dtype)
            result.graph.initializer[i].CopyFrom(numpy_helper.from_array(masked, tensor.name))
    return result
