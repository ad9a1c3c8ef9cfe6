"""The real architectures that ship inside the `onnx` package (backend test data, "light" models).

They are Caffe2 exports at opset 9 whose weights are ConstantOfShape fills (every weight 0.02), so
they give real topologies (ResNet-50, GoogLeNet, DenseNet-121, SqueezeNet, ShuffleNet, VGG-19) but
degenerate numbers. `light_model` upgrades them to a supported opset and replaces each fill with
seeded random values of the right kind (He-initialised conv/fc weights, BatchNorm statistics with
positive variance), so before/after comparisons exercise every weight. Not for accuracy: for
timing a real topology (`tools/bench_latency.py --model light:resnet50`) and for the optimiser.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, version_converter

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_NAMES = ("resnet50", "inception_v1", "densenet121", "squeezenet", "shufflenet", "vgg19")
TARGET_OPSET = 13


def light_path(name: str) -> Path:
    return LIGHT_DIR / f"light_{name}.onnx"


def light_model(
    name: str,
    *,
    seed: int = 0,
    opset: int = TARGET_OPSET,
    randomize: bool = True,
    logits: bool = True,
    dynamic_batch: bool = False,
) -> onnx.ModelProto:
    """A light model at `opset` with its data input first and real-looking weights.

    `logits=True` drops the final Softmax: with random weights it saturates to one-hot, which would
    hide any numeric difference; the tensor before it is compared instead. `dynamic_batch=True` names
    the batch dimension "N" (the exports fix it at 1) and lets constant Reshape targets follow it.
    """
    model = onnx.load(light_path(name))
    graph = model.graph
    if logits:
        _drop_final_softmax(graph)
    inits = {t.name: t for t in graph.initializer}
    # IR 3 lists initializers as graph inputs too; keep only the real inputs.
    real_inputs = [i for i in graph.input if i.name not in inits]
    del graph.input[:]
    graph.input.extend(real_inputs)
    if randomize:
        _randomize_fills(graph, inits, np.random.default_rng(seed))
    if dynamic_batch:
        _free_batch(graph, inits)
    model.ir_version = 7  # IR >= 4: initializers need not be graph inputs
    model = version_converter.convert_version(model, opset)
    model.ir_version = 10
    return model


def _drop_final_softmax(graph: onnx.GraphProto) -> None:
    outputs = {o.name for o in graph.output}
    for node in [n for n in graph.node if n.op_type == "Softmax" and n.output[0] in outputs]:
        for out in graph.output:
            if out.name == node.output[0]:
                out.name = node.input[0]
                out.type.tensor_type.ClearField("shape")
        graph.node.remove(node)


def _free_batch(graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto]) -> None:
    for value in [*graph.input, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "N"
    del graph.value_info[:]  # shapes recorded for batch 1
    for node in graph.node:
        target = inits.get(node.input[1]) if node.op_type == "Reshape" else None
        if target is None:
            continue
        shape = numpy_helper.to_array(target).copy()
        if shape.size and shape[0] == 1 and -1 not in shape:
            shape[0] = -1
            target.CopyFrom(numpy_helper.from_array(shape.astype(np.int64), target.name))


def _randomize_fills(
    graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], rng: np.random.Generator
) -> None:
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
    kept = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
        users = readers.get(node.output[0], [])
        value = _random_value(shape, users[0] if users else None, rng)
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)


def _random_value(
    shape: tuple[int, ...], user: tuple[onnx.NodeProto, int] | None, rng: np.random.Generator
) -> np.ndarray:
    op, index = (user[0].op_type, user[1]) if user else ("", 0)
    if op in ("Conv", "Gemm") and index == 1:
        fan_in = int(np.prod(shape[1:])) if op == "Conv" else int(shape[1])
        value = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    elif op == "BatchNormalization":
        low, high = {1: (0.5, 1.5), 2: (-0.3, 0.3), 3: (-0.5, 0.5), 4: (0.5, 2.0)}[index]
        value = rng.uniform(low, high, shape).astype(np.float32)
    elif op == "Mul":
        value = rng.uniform(0.5, 1.5, shape)
    else:
        value = rng.uniform(-0.2, 0.2, shape)
    return value.astype(np.float32)
