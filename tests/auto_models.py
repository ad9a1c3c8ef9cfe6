"""Small models built in code that reproduce the real-model failures of issue #21, with data to calibrate them.

- `heavy_tail_conv`: PP-OCRv4's recogniser in miniature. A 1x1 conv reads a tensor whose values sit near
  +-0.04 on 63 of 64 channels and spread to +-0.4 on the last one, and that channel meets a large weight (the
  real layer, p2o.Conv.14: |x| has its median at 0.039 and 90 % below 0.044, 1 % above 0.3; weights up to
  38). Entropy clips just above the crowd at 0.04 and the conv's output loses the large channel; max or mse
  keep it.

      x [N,64,8,8] -> Conv 1x1 (64 -> 32; column 63 of the weights x40) -> y

- `yolo_head`: YOLOv8's output in miniature. Boxes in pixels (0..640) and class scores (Sigmoid, 0..1) joined
  by one Concat that is the graph output, after convs that run INT8; the class logits are mostly very
  negative with a few positive (a few objects), the tail that carries the detections.

      x -> Conv 3x3 -> Relu -> Conv 1x1 (boxes) -> Sigmoid -> Mul 640 ----------\\
                            \\-> Conv 1x1 (class logits) -> Sigmoid (scores) ---> Concat (axis 1) -> out

- `unlike_concat`: a Concat that placement quantises (its output feeds a conv) joining a 0..100 branch and a
  0..1 branch, where the conv after it reads mostly the small branch.

      x -> Conv -> Relu -> Conv 3x3 (x100) -> Relu --\\
                        \\-> Conv 1x1        -> Relu ---> Concat -> Conv 1x1 (small-branch weights x30) -> out
"""

from __future__ import annotations

import numpy as np
import onnx

from trtopt.zoo.builder import GraphBuilder


def heavy_tail_conv() -> onnx.ModelProto:
    g = GraphBuilder("heavy_tail_conv", seed=3, opset=13)
    x = g.input("x", [-1, 64, 8, 8])
    weight = g.he_weight((32, 64, 1, 1), 64)
    weight[:, 63] *= 40.0
    y = g.node("Conv", [x, g.const("w", weight), g.const("b", g.bias(32))], kernel_shape=[1, 1], out="y")
    return g.build([y])


def heavy_tail_data(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], (1, 64, 1, 1))
    data = (signs * rng.normal(0.04, 0.002, (count, 64, 8, 8))).astype(np.float32)
    data[:, 63] = rng.choice([-1.0, 1.0], (count, 8, 8)) * rng.uniform(0.3, 0.42, (count, 8, 8))
    return data


def yolo_head() -> onnx.ModelProto:
    g = GraphBuilder("yolo_head", seed=5, opset=13)
    x = g.input("x", [-1, 3, 16, 16])
    features = g.relu(g.conv(x, 3, 32, 3))
    boxes = g.conv(features, 32, 4, 1)
    pixels = g.mul(g.node("Sigmoid", [boxes]), g.const("stride", np.array(640.0, np.float32)))
    logits_weight = g.he_weight((16, 32, 1, 1), 32) * 2.0
    logits = g.node(
        "Conv",
        [features, g.const("cls_w", logits_weight), g.const("cls_b", np.full(16, -3.0, np.float32))],
        kernel_shape=[1, 1],
    )
    scores = g.node("Sigmoid", [logits])
    out = g.concat([pixels, scores], axis=1, out="out")
    return g.build([out])


def unlike_branches(g: GraphBuilder) -> tuple[str, str]:
    """A stem and two ReLU branches of ranges 100x apart: (the small branch, their Concat)."""
    x = g.input("x", [-1, 3, 12, 12])
    stem = g.relu(g.conv(x, 3, 16, 3))
    big_w = g.he_weight((16, 16, 3, 3), 144) * 100.0
    big = g.relu(g.node("Conv", [stem, g.const("big_w", big_w)], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    small = g.relu(g.conv(stem, 16, 16, 1))
    return small, g.concat([big, small], axis=1)


def unlike_concat() -> onnx.ModelProto:
    g = GraphBuilder("unlike_concat", seed=7, opset=13)
    _, joined = unlike_branches(g)
    weight = g.he_weight((16, 32, 1, 1), 32)
    weight[:, :16] *= 0.01
    weight[:, 16:] *= 30.0
    out = g.node("Conv", [joined, g.const("head_w", weight)], kernel_shape=[1, 1], out="out")
    return g.build([out])


def image_like(count: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Smooth random images: blocks of uniform noise, so neighbouring pixels agree as in photos."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(-1.0, 1.0, (count, shape[0], shape[1] // 4, shape[2] // 4))
    return np.repeat(np.repeat(coarse, 4, axis=2), 4, axis=3).astype(np.float32)
