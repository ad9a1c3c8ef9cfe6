"""Small models built in code whose outputs look like real task heads, for the task-metric tests (see the
sketches in tests/test_compare_tasks.py): a YOLOv8-layout detector, a DB-style text score map, a CTC head,
a segmenter ending in ArgMax."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtopt.zoo.builder import GraphBuilder


def detector() -> onnx.ModelProto:
    b = GraphBuilder("tiny_yolo", seed=3, opset=13)
    x = b.input("images", [1, 3, 64, 96])
    x = b.relu(b.conv(x, 3, 8, 3))
    heads: dict[str, list[str]] = {"boxes": [], "scores": []}
    for stride in (8, 16, 32):
        for kind, channels in (("boxes", 4), ("scores", 3)):
            y = b.conv(x, 8, channels, stride, stride=stride, pads=[0, 0, 0, 0])
            heads[kind].append(b.node("Reshape", [y, b.const("shape", np.array([1, channels, -1], np.int64))]))
    boxes = b.mul(b.node("Sigmoid", [b.concat(heads["boxes"], axis=2)]), b.const("px", np.array(64, np.float32)))
    scores = b.node("Sigmoid", [b.concat(heads["scores"], axis=2)])
    return b.build([b.concat([boxes, scores], axis=1, out="output0")])


def text_map() -> onnx.ModelProto:
    b = GraphBuilder("tiny_db", seed=4, opset=13)
    x = b.relu(b.conv(b.input("x", [1, 3, 32, 32]), 3, 8, 3))
    return b.build([b.node("Sigmoid", [b.conv(x, 8, 1, 3)], out="maps")])


def recognizer() -> onnx.ModelProto:
    b = GraphBuilder("tiny_ctc", seed=5, opset=13)
    x = b.relu(b.conv(b.input("x", [1, 3, 32, 64]), 3, 8, 3))
    y = b.conv(x, 8, 12, (32, 4), stride=4, pads=[0, 0, 0, 0])  # [1, 12, 1, 16]
    y = b.node("Transpose", [b.node("Reshape", [y, b.const("shape", np.array([1, 12, 16], np.int64))])], perm=[0, 2, 1])
    return b.build([b.node("Softmax", [y], axis=2, out="probs")])


def segmenter() -> onnx.ModelProto:
    """Three class scores per pixel and the graph's own ArgMax: an int64 [N, H, W] map of class ids, as
    wired-table-rec's line segmenter ends."""
    b = GraphBuilder("tiny_seg", seed=6, opset=13)
    x = b.relu(b.conv(b.input("x", [1, 3, 32, 32]), 3, 8, 3))
    b.node("ArgMax", [b.conv(x, 8, 3, 3)], axis=1, keepdims=0, out="labels")
    graph = onnx.helper.make_graph(b.nodes, b.name, b.inputs,
                                   [onnx.helper.make_tensor_value_info("labels", onnx.TensorProto.INT64, None)],
                                   b.initializers)  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def decoded_detector() -> onnx.ModelProto:
    """A detector that decodes and filters its own boxes, as torchvision's detection exports do: boxes [K, 4],
    scores [K], labels [K] (int64) of the one image, K the anchors whose best class score passes 0.9."""
    b = GraphBuilder("tiny_decoded", seed=5, opset=13)
    x = b.relu(b.conv(b.input("images", [1, 3, 64, 96]), 3, 8, 3))
    boxes = b.node("Reshape", [b.conv(x, 8, 4, 8, stride=8, pads=[0, 0, 0, 0]), b.const("b", np.array([4, -1]))])
    unit = b.node("Transpose", [b.node("Sigmoid", [boxes])], perm=[1, 0])  # [96, 4] in (0, 1)

    def columns(first: int, scale: float, offset: float) -> str:
        cut = b.node("Slice", [unit, *(b.const(n, np.array([v])) for n, v in (("s", first), ("e", first + 2),
                                                                                 ("a", 1)))])  # fmt: skip
        return b.add(b.mul(cut, b.const("k", np.array(scale, np.float32))), b.const("o", np.array(offset, np.float32)))

    corner = columns(0, 48.0, 0.0)
    boxes = b.concat([corner, b.add(corner, columns(2, 16.0, 8.0))], axis=1)  # x1 y1 x2 y2, 8 to 24 pixels a side
    classes = b.node("Sigmoid", [b.node("Reshape", [b.conv(x, 8, 3, 8, stride=8, pads=[0, 0, 0, 0]),
                                                    b.const("c", np.array([3, -1]))])])  # fmt: skip
    scores = b.node("ReduceMax", [classes], axes=[0], keepdims=0)
    labels = b.node("ArgMax", [classes], axis=0, keepdims=0)
    keep = b.node("Squeeze", [b.node("NonZero", [b.node("Greater", [scores, b.const("t", np.array(0.9, np.float32))])]),
                              b.const("axis", np.array([0]))])  # fmt: skip
    for t, name in ((boxes, "boxes"), (scores, "scores"), (labels, "labels")):
        b.node("Gather", [t, keep], axis=0, out=name)
    model = b.build([])
    model.graph.output.extend([helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["K", 4]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["K"]),
                               helper.make_tensor_value_info("labels", TensorProto.INT64, ["K"])])  # fmt: skip
    return model
