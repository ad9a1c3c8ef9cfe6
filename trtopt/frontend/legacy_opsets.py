"""Old models brought up to a newer opset with the semantics they were written for, where onnx's version
converter alone changes them: at opset 7 (broadcasting, below), at 11 (`at_opset_11`: resizes) and at 13
(`single_axis_hardmax`). Each was found by running the old form in ONNX Runtime beside the converted one
(docs/holdout.md, round 6; tests/test_frontend_opset.py, `test_conversion_keeps_what_changed_meaning`).

Models older than opset 7 are the 2017 exports of the first ONNX model zoo, PyTorch 0.3-0.4 and Caffe2. Up to
opset 6 broadcasting was explicit and not numpy's: an elementwise op (`Add`, `Mul`, ...) with
`broadcast=1` and `axis=a` lines the second input up with the first from axis `a` (a [C] bias added to
[N, C, H, W] at axis 1), and a `PRelu` slope of C values applies per channel. From opset 7 on both broadcast
like numpy, against the trailing axes. onnx 1.23's converter keeps a PRelu slope as it is, and unsqueezes an
axis-aligned operand by one axis too many ([C] to [C, 1, 1, 1] against [N, C, H, W], so the sum comes out
[C, C, H, W]); and it needs shapes that its shape inference cannot give through opset-1 `BatchNormalization`
(`consumed_inputs`). So an opset < 7 model is converted to opset 6 first (one opset at a time where a step needs
shapes), its shapes are inferred there, both broadcasts are rewritten into numpy's form with explicit trailing
axes, and only then does it go to opset 7. Found on the opset-6 PReLU models inside the onnx wheel
(docs/holdout.md, round 6) and an opset-3 model of the old model zoo's kind (tests/test_frontend_opset.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtopt.frontend import weightless

# The ops that took `broadcast` / `axis` attributes up to opset 6 (onnx's Changelog, version 7 of each).
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"})


def at_opset_7(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model`, of default-domain `opset` < 7, converted to opset 7 with its own broadcasting semantics."""
    at_6 = stepwise(model, opset, 6) if opset < 6 else model
    return onnx.version_converter.convert_version(_numpy_broadcasting(at_6, _ranks(at_6)), 7)


def at_opset_11(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model`, of default-domain `opset` <= 10, converted to opset 11 with its resizes' meaning.

    `Resize`-10 (and `Upsample`, which onnx's converter turns into it) maps output pixels to input ones the
    "asymmetric" way (x_in = x_out / scale); opset 11 added `coordinate_transformation_mode`, whose default is
    "half_pixel", and the converter leaves it out, so every linear upsampling of an opset 7-10 model moved by
    half a pixel (largest difference 1.29 on a [0, 1)-scaled test ramp). Each resize is given "asymmetric"
    here, and nearest ones the rounding ONNX Runtime's opset-10 kernel uses: down for scales of at least 1,
    up for scales below 1. Where one resize mixes both, or its scales are computed, it rounds down (upsampling,
    the common case); were that wrong, the build's graph check against the model file says so."""
    at_10 = stepwise(model, opset, 10) if opset < 10 else model
    converted = onnx.version_converter.convert_version(at_10, 11)
    constants = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    constants.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in converted.graph.node
                      if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})  # fmt: skip
    for node in (n for n in converted.graph.node if n.op_type == "Resize"):
        kept = [a for a in node.attribute if a.name not in ("coordinate_transformation_mode", "nearest_mode")]
        kept.append(helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
        mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"), b"nearest")
        scales = constants.get(node.input[2]) if len(node.input) > 2 else None
        if mode == b"nearest" and scales is not None and (np.all(scales >= 1) or np.all(scales <= 1)):
            kept.append(helper.make_attribute("nearest_mode", "floor" if np.all(scales >= 1) else "ceil"))
        elif mode == b"nearest":
            kept.append(helper.make_attribute("nearest_mode", "floor"))  # upsampling: the common case
        del node.attribute[:]
        node.attribute.extend(kept)
    return converted


def single_axis_hardmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (opset 11 or 12) with each `Hardmax` over more than its last axis spelt Flatten -> Hardmax ->
    Reshape. Up to opset 12 Hardmax (like Softmax) flattens everything from `axis` on into one; from 13 it
    works along `axis` alone. onnx's converter rewrites Softmax and LogSoftmax for that and not Hardmax, whose
    one-hot then lands along one axis only (every value wrong on a [2, 3, 4, 5] input at axis 1)."""
    if not any(n.op_type == "Hardmax" for n in model.graph.node):
        return model
    ranks = _ranks(model)
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    nodes = []
    for node in clone.graph.node:
        rank = ranks.get(node.input[0]) if node.op_type == "Hardmax" else None
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
        if rank is None or (axis % rank if rank else 0) >= rank - 1:
            nodes.append(node)
            continue
        x, y = node.input[0], node.output[0]
        flat, hard, shape = f"{y}_flat", f"{y}_2d", f"{y}_shape"
        nodes += [helper.make_node("Flatten", [x], [flat], axis=axis % rank),
                  helper.make_node("Hardmax", [flat], [hard], axis=1),
                  helper.make_node("Shape", [x], [shape]), helper.make_node("Reshape", [hard, shape], [y])]  # fmt: skip
    del clone.graph.node[:]
    clone.graph.node.extend(nodes)
    return clone


def stepwise(model: onnx.ModelProto, opset: int, target: int) -> onnx.ModelProto:
    """onnx's conversion to `target`; where it fails for want of a shape, one opset at a time with shapes
    inferred before each step."""
    try:
        return onnx.version_converter.convert_version(model, target)
    except RuntimeError as exc:
        if "has_sizes" not in str(exc) or abs(target - opset) < 2:
            raise
    step = 1 if target > opset else -1
    for version in range(opset + step, target + step, step):
        model = onnx.version_converter.convert_version(onnx.shape_inference.infer_shapes(model), version)
    return model


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of every value of `model`'s main graph that onnx's shape inference can say, and of its weights."""
    inferred = weightless.infer_shapes(model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
             if v.type.tensor_type.HasField("shape")}  # fmt: skip
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    return ranks


def _numpy_broadcasting(model: onnx.ModelProto, ranks: dict[str, int]) -> onnx.ModelProto:
    """A copy of the opset-6 `model` whose axis-aligned broadcasts and per-channel PRelu slopes are spelt with
    an `Unsqueeze` to the trailing axes numpy broadcasting needs; the `axis` attributes go. A node whose
    ranks shape inference cannot say is left to the converter."""
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    nodes = []
    for node in clone.graph.node:
        axis = _aligned_at(node, ranks)
        if axis is not None:
            first, second = ranks[node.input[0]], ranks[node.input[1]]
            trailing = first - axis - second
            if trailing > 0:
                name = f"{node.input[1]}_aligned_{node.output[0]}"
                nodes.append(helper.make_node("Unsqueeze", [node.input[1]], [name],
                                              axes=list(range(second, second + trailing))))  # fmt: skip
                node.input[1] = name
            kept = [a for a in node.attribute if a.name != "axis"]
            del node.attribute[:]
            node.attribute.extend(kept)
        nodes.append(node)
    del clone.graph.node[:]
    clone.graph.node.extend(nodes)
    return clone


def _aligned_at(node: onnx.NodeProto, ranks: dict[str, int]) -> int | None:
    """The axis the second input lines up with, for a node whose broadcast numpy's rules would read otherwise."""
    if len(node.input) != 2 or node.input[0] not in ranks or node.input[1] not in ranks:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "PRelu":  # a slope of C values: per channel, axis 1
        return 1 if ranks[node.input[0]] > 2 and ranks[node.input[1]] == 1 else None
    if node.op_type not in BROADCASTING or attrs.get("broadcast") != 1 or "axis" not in attrs:
        return None
    axis = int(attrs["axis"])
    return axis + ranks[node.input[0]] if axis < 0 else axis
