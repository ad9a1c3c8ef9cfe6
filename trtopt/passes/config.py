"""The graph stage's config (shared by `build`, `calibrate` and `optimize`), and loading a model for a build."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from trtopt.errors import TrtoptError, format_shape
from trtopt.frontend.loader import graph_from_onnx, load_model
from trtopt.frontend.opset import MIN_OPSET, MIN_QDQ_OPSET
from trtopt.frontend.shapes import Shape, require_static_shapes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphConfig:
    """How the model is read and optimised: `shapes` (--shapes) fixes the sizes of dynamic input
    dimensions; `passes` (--passes) the graph passes to run, in order (None: all, in the default order;
    empty: none). Unknown pass names fail here, before any work, listing the valid ones."""

    shapes: Mapping[str, Shape] | None = None
    passes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.passes is None:
            return
        if isinstance(self.passes, str) or not isinstance(self.passes, Sequence):
            raise TrtoptError(
                f"--passes (GraphConfig.passes) is {self.passes!r}; expected a sequence of pass names.",
                fix="Pass e.g. GraphConfig(passes=('fold_batchnorm', 'fuse_cbr')), or () for no passes.",
            )
        from trtopt.passes import PASSES

        for name in self.passes:
            PASSES.get(name)  # raises UnknownNameError listing the valid names
        object.__setattr__(self, "passes", tuple(self.passes))

    @classmethod
    def from_text(cls, shapes: Sequence[str] | None, passes: str | None) -> GraphConfig:
        """From the CLI's spellings: `--shapes NAME:DxDxD ...` and `--passes a,b` ('' for none)."""
        from trtopt.frontend.shapes import parse_shapes

        names = None if passes is None else tuple(p.strip() for p in passes.split(",") if p.strip())
        return cls(shapes=parse_shapes(list(shapes) if shapes else None) or None, passes=names)


def load_graph(
    path: Path, config: GraphConfig, *, int8: bool, batch: int, data: Sequence[str] = (), keeps: Sequence[str] = ()
) -> gs.Graph:
    """The model at `path` as a graph with static shapes, ready for the passes. INT8 needs per-axis Q/DQ
    (opset 13): the front end converts older models (trtopt.frontend.opset). The memory check runs before
    anything does: a message, not an out-of-memory kill, for activations at `batch` that cannot fit. An INT8
    build of a model quantised already is refused here (trtopt.frontend.prequantized); one that computes in float16
    works on a float32 copy (trtopt.frontend.float_types); `keeps` says what each backend keeps of such a model
    (`trtopt.backend.prequantized_keeps`). Where `data` (--calib) is one .npz or .npy file, dynamic
    input sizes that --shapes leaves open are taken from its arrays."""
    from trtopt.memory import check_graph_memory

    model = load_model(path, min_opset=MIN_QDQ_OPSET if int8 else MIN_OPSET).model
    if int8:  # a graph quantised already has nothing to calibrate: say so before any work
        from trtopt.frontend.float_types import lifted_to_float32, low_float_uses, refuse_float64
        from trtopt.frontend.prequantized import refuse_prequantized

        refuse_prequantized((node.op_type for node in model.graph.node), keeps)
        refuse_float64(model, str(path))
        uses = low_float_uses(model)
        if uses:  # calibrated and quantised on a float32 copy (trtopt.frontend.float_types)
            log.info("%s computes in float16 (%s): INT8 works on a float32 copy; the plan keeps its input and "
                     "output types", path, "; ".join(uses[:4]))  # fmt: skip
            model = lifted_to_float32(model)
    shapes = {**_array_shapes(model, data, config.shapes or {}), **(config.shapes or {})}
    graph = graph_from_onnx(model, shapes=shapes or None)
    require_static_shapes(graph)
    check_graph_memory(graph, batch)
    return graph


def _array_shapes(model: onnx.ModelProto, data: Sequence[str], given: Mapping[str, Shape]) -> dict[str, Shape]:
    """`trtopt.data.arrays.shapes_from_arrays` for the inputs --shapes does not name, when `data` is one
    array file; said in the log (-v), since the plan is built for those sizes."""
    from trtopt.data.arrays import ARRAY_EXTENSIONS, has_batch_axis, shapes_from_arrays
    from trtopt.data.inputs import InputInfo

    if len(data) != 1 or Path(data[0]).suffix.lower() not in ARRAY_EXTENSIONS or not Path(data[0]).is_file():
        return {}
    weights = {t.name for t in model.graph.initializer}
    dims = {
        t.name: [d.dim_value or d.dim_param or None for d in t.type.tensor_type.shape.dim]
        for t in model.graph.input
        if t.name not in weights and t.type.tensor_type.HasField("shape")
    }
    # whole feeds or a shared batch axis, as the model declares its inputs (--shapes may fix one input's batch)
    feeds = not has_batch_axis([InputInfo(name, shape, "float32") for name, shape in dims.items()])
    unset = {name: shape for name, shape in dims.items() if name not in given}
    found = shapes_from_arrays(Path(data[0]), unset, feeds=feeds)
    for name, shape in found.items():
        log.info("input %r: dynamic sizes taken from %s: %s (--shapes sets others)", name, data[0], format_shape(shape))
    return found  # type: ignore[return-value]  # a named batch dimension stays a name: apply_shapes keeps it
