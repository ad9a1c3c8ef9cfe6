"""How `--method auto` scores a tensor's candidates at one node that reads it (`trtopt.calib.auto`).

`NodeRunner.errors` gives, for each candidate rounding of the tensor, the relative squared error of the
node's outputs against their FP32 values from the model run. Most nodes run alone in ONNX Runtime (a
one-node model with the node's own weights, all candidates stacked along the batch axis in one call).
Two kinds are computed without running them, with the same numbers:

- Add, Sub, Mul whose result has the tensor's shape: the node's float32 result in one compiled pass
  (`trtopt.calib.auto_kernels.elementwise_errors`), never written out;
- Concat (not along the batch axis): it copies its inputs, so its output differs from FP32 exactly where
  the tensor's rounding does: the error is the tensor's own squared error (times the number of times the
  Concat reads it) over the energy of the Concat's FP32 output.

Both replace a run over candidates x samples of the node's whole output, and the copies of its other
inputs per candidate (measured on ddddocr's detector and PP-OCRv4's recogniser, issue #21).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
import onnx

from trtopt.calib.auto_kernels import ELEMENTWISE, elementwise_errors, squared_errors, sum_of_squares

log = logging.getLogger("trtopt.calib.auto")

Feeds = Mapping[str, np.ndarray]


@lru_cache(maxsize=1)
def quiet_run() -> Any:
    """Run options without ONNX Runtime's error log, for runs whose failure is expected and handled (a node
    that cannot run on stacked inputs, an output that does not fit its array)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4
    return options



def relative_errors(stacked: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """||part - reference||^2 / ||reference||^2 for each of the equal parts of `stacked` along axis 0 (its
    copies of `reference`'s shape)."""
    errors, energy = squared_errors(stacked, reference)
    return errors / energy if energy > 0 else errors


def _ort_errors() -> tuple[type[BaseException], ...]:
    from trtopt.frontend.model_errors import plan_errors

    return plan_errors()


class NodeRunner:
    """Runs single nodes of `model` in ONNX Runtime on stacked inputs; one session per node, built lazily."""

    def __init__(self, model: onnx.ModelProto, threads: int | None) -> None:
        self.model = model
        self.threads = threads
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.sessions: dict[int, object] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.scratch: dict[int, np.ndarray] = {}  # output index -> bytes, the largest output so far

    def errors(
        self,
        node: onnx.NodeProto,
        name: str,
        stacked: np.ndarray,
        copies: int,
        cached: Mapping[str, np.ndarray],
    ) -> np.ndarray | None:
        """Relative squared error of the node's float outputs (`cached`, from the FP32 model) for each rounding
        of `name` in `stacked` (one copy per candidate), or None if the node cannot run alone."""
        rows = stacked.shape[0] // copies
        variable = [i for i in dict.fromkeys(node.input) if i and i not in self.initializers]
        if any(i != name and i not in cached for i in variable) or any(o not in cached for o in node.output if o):
            return None
        references = [cached[o] for o in node.output if o]
        if any(not np.issubdtype(r.dtype, np.floating) or r.ndim == 0 or r.size == 0 for r in references):
            return None  # an empty output (a detector's boxes when none passed its score threshold) scores nothing
        computed = self._elementwise(node, name, stacked, copies, cached)
        computed = self._concat(node, name, stacked, copies, cached) if computed is None else computed
        if computed is not None:
            return computed
        feeds = {}
        for i in variable:
            if i == name:
                feeds[i] = stacked
            else:
                other = cached[i]
                floating = np.issubdtype(other.dtype, np.floating)
                grows = floating and other.ndim > 0 and other.shape[0] == rows
                feeds[i] = np.concatenate([other] * copies) if grows else other
        failures: tuple[type[BaseException], ...] = (*_ort_errors(), ValueError, RuntimeError)
        try:
            outputs = self._run(node, feeds, references, copies)
        except failures as exc:
            log.debug("auto calibration: %s (%s) cannot run alone on stacked inputs: %s", node.name, node.op_type, exc)
            return None
        errors = np.zeros(copies)
        for out, reference in zip(outputs, references, strict=True):
            errors += relative_errors(out, reference)
        return errors

    def _run(
        self, node: onnx.NodeProto, feeds: Feeds, references: list[np.ndarray], copies: int
    ) -> list[np.ndarray]:
        """The node's outputs on `feeds`, of the FP32 outputs' dtypes and `copies` times their rows, written
        by ONNX Runtime into scratch arrays reused from node to node (IO binding): fresh output arrays of
        candidates x samples cost page faults on every run. Raises if an output has another shape or dtype.
        The arrays are overwritten by the next run."""
        session: Any = self._session(node, feeds)
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        outputs = []
        for index, (name, reference) in enumerate(zip([o for o in node.output if o], references, strict=True)):
            shape = (copies * reference.shape[0], *reference.shape[1:])
            size = int(np.prod(shape)) * reference.dtype.itemsize
            if index not in self.scratch or self.scratch[index].size < size:
                self.scratch[index] = np.empty(size, np.uint8)
            array = self.scratch[index][:size].view(reference.dtype).reshape(shape)
            binding.bind_output(name, "cpu", 0, array.dtype, list(shape), array.ctypes.data)
            outputs.append(array)
        session.run_with_iobinding(binding, quiet_run())
        return outputs

    def _elementwise(
        self, node: onnx.NodeProto, name: str, stacked: np.ndarray, copies: int, cached: Mapping[str, np.ndarray]
    ) -> np.ndarray | None:
        """`errors` of an Add, Sub or Mul that reads `name` once and whose result has its shape, computed in
        one compiled pass (`trtopt.calib.auto_kernels.elementwise_errors`: the same float32 results as ONNX
        Runtime's kernel, never written out); None for any other node."""
        if node.op_type not in ELEMENTWISE or len(node.input) != 2 or list(node.input).count(name) != 1:
            return None
        reference = cached[node.output[0]]
        other_name = node.input[1] if node.input[0] == name else node.input[0]
        other = cached[other_name] if other_name in cached else self._constant(other_name)
        shape = (stacked.shape[0] // copies, *stacked.shape[1:])
        if other is None or reference.shape != shape or reference.dtype != np.float32 or other.dtype != np.float32:
            return None
        try:
            if np.broadcast_shapes(other.shape, shape) != shape:
                return None
        except ValueError:
            return None
        errors, energy = elementwise_errors(node.op_type, stacked, other, reference, scored_first=node.input[0] == name)
        return errors / energy if energy > 0 else errors

    def _concat(
        self, node: onnx.NodeProto, name: str, stacked: np.ndarray, copies: int, cached: Mapping[str, np.ndarray]
    ) -> np.ndarray | None:
        """`errors` of a Concat not along the batch axis: the tensor's own squared error, once per time the
        Concat reads it, over the energy of the Concat's output (see the module doc); None for other nodes."""
        if node.op_type != "Concat" or len(node.output) != 1:
            return None
        reference = cached[node.output[0]]
        values = cached[name]
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        if axis is None or reference.ndim != values.ndim or axis % max(values.ndim, 1) == 0:
            return None
        if reference.dtype != np.float32 or values.dtype != np.float32 or stacked.shape[0] != copies * len(values):
            return None
        errors, _ = squared_errors(stacked, values)
        total = sum_of_squares(reference)
        errors *= list(node.input).count(name)
        return errors / total if total > 0 else errors

    def _constant(self, name: str) -> np.ndarray | None:
        if name not in self.initializers:
            return None
        if name not in self.constants:
            self.constants[name] = onnx.numpy_helper.to_array(self.initializers[name])
        return self.constants[name]

    def _session(self, node: onnx.NodeProto, feeds: Feeds) -> object:
        key = id(node)
        if key not in self.sessions:
            self.sessions[key] = self._build(node, feeds)
        return self.sessions[key]

    def _build(self, node: onnx.NodeProto, feeds: Feeds) -> object:
        """A session over `node` alone: its variable inputs typed from `feeds`, its constants as initializers.
        Alone, the node has nothing to fuse with, so it is optimised to "extended", not "all": "all" adds the
        NCHWc layout, whose reorders in and out of every run cost a quarter of the scoring time (demo and
        ddddocr's detector). The FP32 reference may then come from another float kernel than the node's;
        that moves the scores by about 1e-5 relative, far below the gaps between candidates."""
        import onnxruntime as ort

        from trtopt.execution.ort_session import session_options

        def typed(name: str) -> onnx.ValueInfoProto:
            dtype = onnx.helper.np_dtype_to_tensor_dtype(feeds[name].dtype)
            return onnx.helper.make_tensor_value_info(name, dtype, None)

        graph = onnx.helper.make_graph(
            [node],
            f"auto-{node.name or node.op_type}",
            [typed(i) for i in feeds],
            [onnx.ValueInfoProto(name=o) for o in node.output if o],
            [self.initializers[i] for i in dict.fromkeys(node.input) if i in self.initializers],
        )
        single = onnx.helper.make_model(graph, opset_imports=list(self.model.opset_import))
        single.ir_version = self.model.ir_version
        options = session_options(threads=self.threads, opt_level="extended", spin=False)
        # No memory arena: these sessions are kept for the whole scoring, and each arena would keep the peak
        # of its stacked run (candidates x samples of one tensor); one per node reached 20 GB on a PicoDet.
        options.enable_cpu_mem_arena = False
        return ort.InferenceSession(single.SerializeToString(), options, providers=["CPUExecutionProvider"])
