"""2:4 structured sparsity: which Conv / Gemm / MatMul weights can run on sparse Tensor Cores, and which do.

The rule, as NVIDIA's TensorRT developer guide states it in its section "Structured Sparsity" (8.x; TensorRT 11
covers structured sparsity on its page "Data Formats and Tensors", docs.nvidia.com/deeplearning/tensorrt/11.1.0/
inference-library/data-formats-tensors.html): NVIDIA Ampere and later GPUs run *convolution kernel weights and
fully connected weights* on sparse Tensor Cores when, for each output channel and each spatial position of
the kernel, every four *input* channels hold at least two zeros: with weights of shape [K, C, R, S] and
C % 4 == 0, every slice ``weights[k, 4c:4c+4, r, s]`` has at most two non-zeros. The input channels are the
reduction axis of the convolution as a matrix product; NVIDIA's blog posts on the sparse Tensor Cores
("Accelerating Inference with Sparsity Using the NVIDIA Ampere Architecture and NVIDIA TensorRT", "Exploiting
NVIDIA Ampere Structured Sparsity with cuSPARSELt") describe the same 2:4 pattern, two zeros in every
contiguous group of four weights, which halves the work of the weight operand.

How that axis lands in an ONNX weight, as NVIDIA's own tools read it:

- ``Conv``: axis 1 of the [K, C/group, *kernel] weight (Polygraphy's sparsity checker and pruner,
  NVIDIA/TensorRT tools/Polygraphy/polygraphy/tools/sparse/sparse.py; trtexec's ``--sparsity=force``,
  samples/common/sampleUtils.cpp ``sparsify``, which keeps two of every four input channels per output
  channel and kernel position). A depthwise conv has one input channel per group, so it never qualifies.
- ``Gemm``: B's reduction axis, axis 1 when ``transB`` else axis 0 (Polygraphy, same file).
- ``MatMul``: axis 0 of a constant 2-D B, [K, N] (Polygraphy; trtexec transposes such weights to [N, K]
  before pruning along K and only handles 2-D MatMuls, sampleUtils.cpp ``sparsifyMatMulKernelWeights``).
- The reduction length must be a multiple of 4 (the guide's ``C % 4 == 0``; Polygraphy skips other
  tensors). That is the only channel-count condition NVIDIA's documents give; whether a sparse kernel is
  *faster* is TensorRT's choice at build time: "in some cases, tactics with structured sparsity can be
  slower than normal tactics and TensorRT will choose normal tactics" (developer guide). The guide also
  asks for FP16 or INT8 precision; in TensorRT 11 that is what the ONNX says (Q/DQ or FP16 tensors).
- ``ConvTranspose`` is neither a convolution nor a fully connected layer in that sense and no NVIDIA tool
  prunes it, so it is listed as not eligible.

Weights behind a ``DequantizeLinear`` (a Q/DQ model, or a plan's ONNX) are read as stored: a value is zero
exactly where the stored integer equals its zero point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_graphsurgeon as gs

if TYPE_CHECKING:
    from trtopt.plan import SparsityRecord

GROUP = 4  # values per group along the reduction axis
KEEP = 2  # at most this many non-zeros per group
SPARSE_OPS = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class WeightSite:
    """Where a layer's weight lives and along which axis its groups of four run.

    `constant` is the float `gs.Constant` a pruner may rewrite; None when the weight is stored quantised
    (behind a DequantizeLinear), whose `values` are then the stored integers minus their zero point.
    """

    name: str
    values: np.ndarray
    axis: int
    constant: gs.Constant | None


@dataclass(frozen=True)
class LayerSparsity:
    """One Conv / Gemm / MatMul / ConvTranspose: can its weights run 2:4 sparse, and do they already."""

    name: str
    op: str
    weight: str | None
    shape: tuple[int, ...] | None
    axis: int | None
    eligible: bool
    reason: str  # why not eligible ('' when eligible)
    is_24: bool  # every group of four along the axis has at least two zeros
    zero_groups: float | None  # share of groups of four with at least two zeros
    macs: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "weight": self.weight,
            "shape": list(self.shape) if self.shape is not None else None,
            "axis": self.axis,
            "eligible": self.eligible,
            "reason": self.reason,
            "is_2_4": self.is_24,
            "groups_with_two_zeros": self.zero_groups,
            "macs": self.macs,
        }


@dataclass(frozen=True)
class SparsityReport:
    """Per layer, and the share of the model's MACs that could run sparse (eligible) or would (already 2:4)."""

    layers: tuple[LayerSparsity, ...]
    total_macs: int

    @property
    def eligible_macs(self) -> int:
        return sum(layer.macs or 0 for layer in self.layers if layer.eligible)

    @property
    def sparse_macs(self) -> int:
        return sum(layer.macs or 0 for layer in self.layers if layer.is_24)

    def share(self, macs: int) -> float:
        return macs / self.total_macs if self.total_macs else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_macs": self.total_macs,
            "eligible_macs": self.eligible_macs,
            "eligible_mac_share": self.share(self.eligible_macs),
            "sparse_macs": self.sparse_macs,
            "sparse_mac_share": self.share(self.sparse_macs),
            "eligible_layers": sum(layer.eligible for layer in self.layers),
            "sparse_layers": sum(layer.is_24 for layer in self.layers),
            "layers": [layer.to_dict() for layer in self.layers],
        }


# --- the math: pure numpy ----------------------------------------------------------------------------


def weight_groups(values: np.ndarray, axis: int) -> np.ndarray:
    """The weight as [n, 4]: each row four consecutive entries along `axis`, the other indices fixed."""
    moved = np.moveaxis(np.asarray(values), axis, -1)
    if moved.shape[-1] % GROUP:
        raise ValueError(f"axis {axis} has {moved.shape[-1]} entries, not a multiple of {GROUP}")
    return moved.reshape(-1, GROUP)


def zero_group_share(values: np.ndarray, axis: int) -> float:
    """Share of the groups of four along `axis` that hold at least two zeros (1.0: the weight is 2:4)."""
    groups = weight_groups(values, axis)
    return float(((groups == 0).sum(axis=1) >= GROUP - KEEP).mean()) if groups.size else 1.0


def satisfies_24(values: np.ndarray, axis: int) -> bool:
    return zero_group_share(values, axis) == 1.0


def mask_24(values: np.ndarray, axis: int) -> np.ndarray:
    """Boolean mask (same shape as `values`) keeping the two largest magnitudes of every group of four along
    `axis`; ties go to the lower index (a stable sort), so the mask is deterministic."""
    moved_shape = np.moveaxis(np.asarray(values), axis, -1).shape
    groups = np.abs(weight_groups(values, axis))
    order = np.argsort(-groups, axis=1, kind="stable")[:, :KEEP]
    keep = np.zeros(groups.shape, dtype=bool)
    np.put_along_axis(keep, order, True, axis=1)
    return np.moveaxis(keep.reshape(moved_shape), -1, axis)


def prune_24(values: np.ndarray, axis: int) -> np.ndarray:
    """`values` with the two smallest magnitudes of every group of four along `axis` set to zero."""
    return np.where(mask_24(values, axis), values, np.zeros_like(values))


# --- where the weight of a layer is --------------------------------------------------------------------


def weight_site(node: gs.Node) -> WeightSite | str:
    """The weight of a Conv / Gemm / MatMul and its reduction axis, or the reason it cannot run 2:4 sparse."""
    if node.op not in SPARSE_OPS:
        return f"{node.op}: TensorRT runs only convolution and fully connected weights sparse"
    if len(node.inputs) < 2:
        return "no weight input"
    found = _stored_values(node.inputs[1])
    if isinstance(found, str):
        return found
    values, constant = found
    rank = values.ndim
    if node.op == "Conv":
        axis, what = 1, "input channels (per group)"
    elif node.op == "Gemm":
        axis, what = (1 if node.attrs.get("transB", 0) else 0), "reduction (K) entries"
    else:
        if rank != 2:
            return f"MatMul weight of rank {rank}: only 2-D weights map to a fully connected layer"
        axis, what = 0, "reduction (K) entries"
    if rank <= axis:
        return f"weight of rank {rank} has no axis {axis}"
    length = values.shape[axis]
    if length % GROUP:
        depthwise = " (depthwise)" if node.op == "Conv" and length == 1 and int(node.attrs.get("group", 1)) > 1 else ""
        return f"{length} {what}{depthwise}, not a multiple of {GROUP}"
    return WeightSite(node.inputs[1].name, values, axis, constant)


def _stored_values(tensor: gs.Tensor) -> tuple[np.ndarray, gs.Constant | None] | str:
    """(values, the float constant holding them) for a constant weight; (stored integers minus zero point,
    None) for a weight behind DequantizeLinear; else the reason it is not a constant."""
    constant = _constant(tensor)
    if constant is not None:
        values = np.asarray(constant.values)
        if not np.issubdtype(values.dtype, np.floating):
            return f"{values.dtype} weight: only float weights are pruned"
        return values, constant
    producer = tensor.inputs[0] if tensor.inputs else None
    if producer is not None and producer.op == "DequantizeLinear":
        stored = _constant(producer.inputs[0])
        zero = _constant(producer.inputs[2]) if len(producer.inputs) > 2 and producer.inputs[2].name else None
        if stored is not None:
            q = np.asarray(stored.values).astype(np.int64)
            if zero is not None:
                q = q - _broadcast_zero_point(np.asarray(zero.values), q, int(producer.attrs.get("axis", 1)))
            return q, None
    return "weights are computed at run time (not a constant)"


def _broadcast_zero_point(zero: np.ndarray, q: np.ndarray, axis: int) -> np.ndarray:
    if zero.ndim == 0 or zero.size == 1:
        return zero.reshape(()).astype(np.int64)
    shape = [1] * q.ndim
    shape[axis % q.ndim] = -1
    return zero.astype(np.int64).reshape(shape)


def _constant(tensor: gs.Tensor) -> gs.Constant | None:
    if isinstance(tensor, gs.Constant):
        return tensor
    producer = tensor.inputs[0] if tensor.inputs else None
    value = producer.attrs.get("value") if producer is not None and producer.op == "Constant" else None
    return value if isinstance(value, gs.Constant) else None


# --- the report --------------------------------------------------------------------------------------


def layer_sparsity(node: gs.Node, macs: int | None = None) -> LayerSparsity:
    site = weight_site(node)
    if isinstance(site, str):
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        shape = tuple(int(d) for d in weight.shape) if weight is not None and _known_shape(weight) else None
        return LayerSparsity(node.name, node.op, weight.name if weight is not None else None, shape, None,
                             False, site, False, None, macs)  # fmt: skip
    share = zero_group_share(site.values, site.axis)
    shape = tuple(int(d) for d in site.values.shape)
    return LayerSparsity(node.name, node.op, site.name, shape, site.axis, True, "", share == 1.0, share, macs)


def analyze_sparsity(graph: gs.Graph, macs: Mapping[str, int | None] | None = None) -> SparsityReport:
    """Every Conv, ConvTranspose, Gemm and MatMul of `graph`; `macs` maps node names to their MACs (from
    `trtopt.analysis.summarize`), for the shares; the total counts every node it names."""
    macs = macs or {}
    layers = tuple(
        layer_sparsity(node, macs.get(node.name)) for node in graph.nodes if node.op in (*SPARSE_OPS, "ConvTranspose")
    )
    return SparsityReport(layers, sum(m or 0 for m in macs.values()))


def _known_shape(tensor: gs.Tensor) -> bool:
    return tensor.shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in tensor.shape)


# --- what a build records ------------------------------------------------------------------------------


def sparsity_record(graph: gs.Graph, int8_layers: Sequence[str], fp16: bool, backend: str) -> SparsityRecord:
    """What `trtopt build --sparsity` stores in the plan: the layers whose weights (as built, Q/DQ included)
    are 2:4 and run in INT8 or FP16, the precisions the developer guide names for sparse tactics; 2:4 layers
    left in FP32; eligible layers that are not 2:4; and their shares of the MACs. The note on what the kernels do
    is the backend's (`Backend.sparsity_note`)."""
    from trtopt.analysis.summary import summarize
    from trtopt.backend import get_backend
    from trtopt.plan import SparsityRecord

    summary = summarize(graph)
    macs = {n.name: cost.macs for n, cost in zip(graph.nodes, summary.layers, strict=True)}
    report = analyze_sparsity(graph, macs)
    reduced = set(int8_layers)
    qualifying = [x for x in report.layers if x.is_24 and (fp16 or x.name in reduced)]
    float32 = [x.name for x in report.layers if x.is_24 and x not in qualifying]
    return SparsityRecord(
        backend=backend,
        qualifying_layers=tuple(x.name for x in qualifying),
        qualifying_mac_share=report.share(sum(x.macs or 0 for x in qualifying)),
        fp32_layers_with_2_4_weights=tuple(float32),
        eligible_not_2_4=tuple(x.name for x in report.layers if x.eligible and not x.is_24),
        eligible_mac_share=report.share(report.eligible_macs),
        note=get_backend(backend).sparsity_note,
    )
