"""A small ONNX graph builder for the test zoo: one method per op, realistic random weights.

Weights are He-initialised (std = sqrt(2 / fan_in), He et al. 2015, "Delving Deep into Rectifiers")
so activations keep roughly unit scale through ReLU stacks; biases and BatchNorm statistics are
non-trivial (running mean != 0, running var != 1, gamma/beta varied) so that a fusion that drops or
misorders a term changes the numbers and a numeric test catches it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtopt.errors import ModelError
from trtopt.frontend import weightless
from trtopt.registry import Registry

# Opsets the zoo can write: 11 introduced Clip/Pad with tensor inputs, 21 is the newest every
# supported ONNX Runtime runs.
MIN_ZOO_OPSET = 11
MAX_ZOO_OPSET = 21
DEFAULT_OPSET = 17
IR_VERSION = 10  # onnx >= 1.21 writes IR 14+, which ONNX Runtime rejects.

ModelFn = Callable[[int, int, int], onnx.ModelProto]  # (batch, seed, opset) -> model
MODELS: Registry[ModelFn] = Registry("zoo model")


class GraphBuilder:
    """Accumulates nodes and initializers; each op method returns the name of its output tensor."""

    def __init__(self, name: str, *, seed: int, opset: int = DEFAULT_OPSET) -> None:
        if not MIN_ZOO_OPSET <= opset <= MAX_ZOO_OPSET:
            raise ModelError(
                f"The zoo cannot build opset {opset}.",
                fix=f"Choose an opset from {MIN_ZOO_OPSET} to {MAX_ZOO_OPSET}.",
            )
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        self._counts: Counter[str] = Counter()

    # -- graph plumbing --------------------------------------------------------------------------

    def unique(self, hint: str) -> str:
        self._counts[hint] += 1
        return f"{hint}_{self._counts[hint]}"

    def input(self, name: str, shape: Sequence[int]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.unique(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], *, out: str | None = None, **attrs: Any) -> str:
        name = self.unique(op.lower())
        output = out or f"{name}_out"
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=name, **attrs))
        return output

    def build(self, outputs: Sequence[str]) -> onnx.ModelProto:
        """A checked-ready model whose graph outputs carry inferred shapes."""
        graph = helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.initializers,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", self.opset)], producer_name="trtopt.zoo"
        )
        model.ir_version = IR_VERSION
        inferred = weightless.infer_shapes(model)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        return model

    # -- random parameters -----------------------------------------------------------------------

    def he_weight(self, shape: Sequence[int], fan_in: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def bias(self, n: int) -> np.ndarray:
        return self.rng.uniform(-0.2, 0.2, n).astype(np.float32)

    # -- layers ----------------------------------------------------------------------------------

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        kernel: int | tuple[int, int],
        *,
        stride: int = 1,
        pads: Sequence[int] | None = None,
        group: int = 1,
        dilation: int = 1,
        bias: bool = True,
        out: str | None = None,
    ) -> str:
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        if pads is None:  # "same" padding for odd kernels
            pads = [dilation * (kh // 2), dilation * (kw // 2)] * 2
        weight = self.const("conv_w", self.he_weight((cout, cin // group, kh, kw), cin // group * kh * kw))
        inputs = [x, weight] + ([self.const("conv_b", self.bias(cout))] if bias else [])
        return self.node(
            "Conv",
            inputs,
            out=out,
            kernel_shape=[kh, kw],
            strides=[stride, stride],
            pads=list(pads),
            dilations=[dilation, dilation],
            group=group,
        )

    def batchnorm(self, x: str, channels: int, *, out: str | None = None) -> str:
        gamma = self.rng.uniform(0.5, 1.5, channels).astype(np.float32)
        beta = self.rng.uniform(-0.3, 0.3, channels).astype(np.float32)
        mean = self.rng.uniform(-0.5, 0.5, channels).astype(np.float32)
        var = self.rng.uniform(0.5, 2.0, channels).astype(np.float32)
        params = [self.const(h, v) for h, v in (("bn_scale", gamma), ("bn_bias", beta), ("bn_mean", mean))]
        params.append(self.const("bn_var", var))
        return self.node("BatchNormalization", [x, *params], out=out, epsilon=1e-5)

    def conv_bn(
        self, x: str, cin: int, cout: int, kernel: int, *, act: str | None = "relu", **conv: Any
    ) -> str:
        """Conv (without bias, as exporters write it before a BN) + BN + optional activation: "relu", "relu6"
        (Clip with initializer bounds), "relu6_node" (bounds from `Constant` nodes) or None."""
        y = self.batchnorm(self.conv(x, cin, cout, kernel, bias=False, **conv), cout)
        if act == "relu":
            return self.relu(y)
        if act in ("relu6", "relu6_node"):
            return self.clip(y, 0.0, 6.0, constant_nodes=act == "relu6_node")
        return y

    def relu(self, x: str, *, out: str | None = None) -> str:
        return self.node("Relu", [x], out=out)

    def clip(self, x: str, low: float, high: float, *, constant_nodes: bool = False, out: str | None = None) -> str:
        """Clip with tensor bounds: initializers, or `Constant` nodes as some exporters write them."""
        make = self.constant_node if constant_nodes else self.const
        bounds = [make("clip_min", np.array(low, np.float32)), make("clip_max", np.array(high, np.float32))]
        return self.node("Clip", [x, *bounds], out=out)

    def constant_node(self, hint: str, value: np.ndarray) -> str:
        """A value written by a `Constant` node instead of an initializer."""
        tensor = numpy_helper.from_array(np.ascontiguousarray(value), self.unique(f"{hint}_value"))
        return self.node("Constant", [], out=self.unique(hint), value=tensor)

    def add(self, a: str, b: str, *, out: str | None = None) -> str:
        return self.node("Add", [a, b], out=out)

    def mul(self, a: str, b: str, *, out: str | None = None) -> str:
        return self.node("Mul", [a, b], out=out)

    def silu(self, x: str, *, out: str | None = None) -> str:
        """x * sigmoid(x), as PyTorch exports nn.SiLU before opset 24 (no Swish op)."""
        return self.mul(x, self.node("Sigmoid", [x]), out=out)

    def gelu(self, x: str, *, out: str | None = None) -> str:
        """x * 0.5 * (1 + erf(x / sqrt 2)), as PyTorch exports nn.GELU before opset 20 (no Gelu op)."""
        scaled = self.node("Div", [x, self.const("sqrt2", np.array(np.sqrt(2.0), np.float32))])
        gate = self.add(self.node("Erf", [scaled]), self.const("one", np.array(1.0, np.float32)))
        return self.mul(self.mul(x, gate), self.const("half", np.array(0.5, np.float32)), out=out)

    def hard_swish(self, x: str, *, out: str | None = None) -> str:
        """HardSwish exists from opset 14; older opsets get x * HardSigmoid(x, 1/6, 0.5)."""
        if self.opset >= 14:
            return self.node("HardSwish", [x], out=out)
        return self.mul(x, self.node("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5), out=out)

    def maxpool(self, x: str, kernel: int, *, stride: int = 1, pad: int = 0) -> str:
        return self.node(
            "MaxPool", [x], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4
        )

    def concat(self, xs: Sequence[str], *, axis: int = 1, out: str | None = None) -> str:
        return self.node("Concat", list(xs), out=out, axis=axis)

    def gemm(self, x: str, k: int, n: int, *, out: str | None = None) -> str:
        """Gemm with transB=1, the layout torch.nn.Linear exports."""
        weight = self.const("fc_w", self.he_weight((n, k), k))
        return self.node("Gemm", [x, weight, self.const("fc_b", self.bias(n))], out=out, transB=1)

    def linear_matmul(self, x: str, k: int, n: int, *, out: str | None = None) -> str:
        """MatMul + Add, the other way exporters write a linear layer."""
        y = self.node("MatMul", [x, self.const("mm_w", self.he_weight((k, n), k))])
        return self.add(y, self.const("mm_b", self.bias(n)), out=out)

    def pool_flatten(self, x: str) -> str:
        return self.node("Flatten", [self.node("GlobalAveragePool", [x])], axis=1)
