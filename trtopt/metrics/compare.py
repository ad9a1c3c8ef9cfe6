"""FP32 model vs plan on the same inputs: how far did quantisation move the outputs, and where.

Per output: cosine similarity, relative error, max and mean absolute error, top-1 agreement (for [batch,
classes] outputs), argmax agreement over positions (for per-position class scores: CTC time steps, softmaxed
segmentation pixels; trtopt.metrics.agreement says which outputs qualify), and the distribution shift (how far the plan
moves the bulk of the values, which the largest values carrying cosine cannot hide: trtopt.metrics.distribution_shift).
Per task (`compare_outputs`, trtopt.metrics): box matching for detectors, binarised score-map IoU for text
detectors, decoded-sequence agreement for CTC recognizers. Per layer: the plan's ONNX graph keeps the
optimised FP32 graph's tensor names (Q/DQ sit on edges), so the same intermediate tensors are exposed in both
and compared; the layer that adds the most error to what it received (`added_errors`) is the first candidate
for `--exclude`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from trtopt.metrics import TaskConfig, TaskEvaluator, choose_task
from trtopt.metrics.agreement import SAMPLE_MIN_VALUES
from trtopt.metrics.arrays import row_cosines, zero_padded


@dataclass
class ErrorStats:
    """Streaming error statistics between a reference and a test tensor (sums, so batches combine)."""

    name: str
    count: int = 0
    dot: float = 0.0
    ref_sq: float = 0.0
    test_sq: float = 0.0
    abs_sum: float = 0.0
    diff_sq: float = 0.0
    max_abs: float = 0.0
    ref_abs_max: float = 0.0
    top1_same: int = 0
    rows: int = 0
    argmax_same: int = 0
    positions: int = 0  # untied positions of per-position class scores (trtopt.metrics.agreement.argmax_counts)
    shift: bool = True  # keep values for the distribution shift (per-layer statistics do not: their memory)
    sampled: int = 0  # samples seen with one row each (see `update`'s `batch`)
    worst_sample: tuple[float, int] | None = None  # the lowest one-sample cosine, and that sample's index
    # the same positions of both, BATCH_SAMPLE per batch up to SAMPLE in all (trtopt.metrics.distribution_shift)
    kept: tuple[list[np.ndarray], list[np.ndarray]] = field(default_factory=lambda: ([], []), repr=False)

    def update(self, ref: np.ndarray, test: np.ndarray, *, classify: bool = False, axis: int | None = None,
               batch: int | None = None) -> None:
        """Add a batch; `axis`: the class axis of an output of per-position class scores (None: not one);
        `batch`: the samples in it, whose one-sample cosines count towards `worst_sample` where the output has
        a row of `trtopt.metrics.agreement.SAMPLE_MIN_VALUES` or more per sample (None: not counted)."""
        ref, test = zero_padded([ref, test])  # a data-dependent length: the missing part compares with 0
        if batch and ref.ndim >= 2 and ref.shape[0] == batch and ref[0].size >= SAMPLE_MIN_VALUES and axis is None \
                and ref.dtype.kind == "f":  # class scores and label maps: their argmax agreement and IoU judge them
            self._per_sample(ref, test)
        ref64, test64 = ref.astype(np.float64).ravel(), test.astype(np.float64).ravel()
        diff = np.abs(ref64 - test64)
        self.count += ref64.size
        self.dot += float(ref64 @ test64)
        self.ref_sq += float(ref64 @ ref64)
        self.test_sq += float(test64 @ test64)
        self.abs_sum += float(diff.sum())
        self.diff_sq += float(diff @ diff)
        self.max_abs = max(self.max_abs, float(diff.max(initial=0.0)))
        self.ref_abs_max = max(self.ref_abs_max, float(np.abs(ref64).max(initial=0.0)))
        self._keep(ref, test)
        if classify and ref.ndim == 2:
            self.rows += ref.shape[0]
            self.top1_same += int((ref.argmax(axis=1) == test.argmax(axis=1)).sum())
        if axis is not None:
            from trtopt.metrics.agreement import argmax_counts

            same, untied = argmax_counts(test, ref, axis)
            self.argmax_same, self.positions = self.argmax_same + same, self.positions + untied

    def _per_sample(self, ref: np.ndarray, test: np.ndarray) -> None:
        from trtopt.metrics.agreement import comparable

        got, want = comparable(*(a.astype(np.float64).reshape(len(a), -1) for a in (test, ref)))
        with np.errstate(invalid="ignore", over="ignore"):
            cosines = np.nan_to_num(row_cosines(got, want), nan=-1.0)  # NaN: the worst (as the build reads it)
        i = int(np.argmin(cosines))
        if self.worst_sample is None or cosines[i] < self.worst_sample[0]:
            self.worst_sample = (float(cosines[i]), self.sampled + i)
        self.sampled += len(cosines)

    def _keep(self, ref: np.ndarray, test: np.ndarray) -> None:
        from trtopt.metrics.distribution_shift import BATCH_SAMPLE, SAMPLE, sampled

        if self.shift and sum(len(k) for k in self.kept[1]) < SAMPLE:
            for kept, values in zip(self.kept, sampled(test, ref, BATCH_SAMPLE), strict=True):
                kept.append(values.astype(np.float32))

    @property
    def cosine(self) -> float:
        denom = np.sqrt(self.ref_sq * self.test_sq)
        return float(self.dot / denom) if denom > 0 else float(self.ref_sq == self.test_sq)

    @property
    def rel_error(self) -> float:
        """||test - ref|| / ||ref|| over every element seen (as trtopt.verify measures it); inf when the
        reference is all zero and the test is not."""
        if self.ref_sq > 0:
            return float(np.sqrt(self.diff_sq / self.ref_sq))
        return 0.0 if self.diff_sq == 0 else float("inf")

    @property
    def distribution_shift(self) -> float | None:
        """trtopt.metrics.distribution_shift over the kept values (None: too few values, or none seen)."""
        from trtopt.metrics.distribution_shift import distribution_shift

        if not self.kept[1]:
            return None
        return distribution_shift(np.concatenate(self.kept[0]), np.concatenate(self.kept[1]))

    @property
    def mean_abs(self) -> float:
        return self.abs_sum / self.count if self.count else 0.0

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_same / self.rows if self.rows else None

    @property
    def argmax_agreement(self) -> float | None:
        return self.argmax_same / self.positions if self.positions else None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cosine": self.cosine,
            "rel_error": self.rel_error,
            "max_abs_error": self.max_abs,
            "mean_abs_error": self.mean_abs,
            "reference_abs_max": self.ref_abs_max,
            "top1_agreement": self.top1_agreement,
            "samples": self.rows or None,
            "argmax_agreement": self.argmax_agreement,
            "argmax_positions": self.positions or None,
            "distribution_shift": self.distribution_shift,
            "worst_sample_cosine": self.worst_sample[0] if self.worst_sample else None,
            "worst_sample_index": self.worst_sample[1] if self.worst_sample else None,
        }


def compare_batches(
    pairs: Iterable[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]],
    names: list[str],
    *,
    classify: set[str] | None = None,
) -> list[ErrorStats]:
    """Accumulate stats over (reference outputs, test outputs) pairs for the given tensor names."""
    stats = {n: ErrorStats(n, shift=False) for n in names}  # per layer: many tensors, no distribution shift
    for ref, test in pairs:
        for n in names:
            stats[n].update(np.asarray(ref[n]), np.asarray(test[n]), classify=n in (classify or set()))
    return [stats[n] for n in names]


@dataclass
class OutputComparison:
    """Per-output statistics and the task metric, over every compared sample."""

    outputs: list[ErrorStats]
    task: TaskEvaluator | None  # None when no batch was compared
    samples: int

    @property
    def worst_cosine(self) -> float:
        return min((s.cosine for s in self.outputs), default=1.0)

    def to_dict(self) -> dict[str, object]:
        return {
            "outputs": [s.to_dict() for s in self.outputs],
            "task": self.task.to_dict() if self.task else None,
            "samples": self.samples,
        }


Triple = tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray], Mapping[str, np.ndarray]]


def compare_outputs(
    batches: Iterable[Triple], names: list[str], config: TaskConfig | None = None, selected: Collection[str] = ()
) -> OutputComparison:  # fmt: skip
    """Per-output statistics and the task metric over (inputs, FP32 outputs, plan outputs) batches.

    The task is chosen on the first batch (`trtopt.metrics.choose_task`: FP32 outputs, batch size, and the
    height and width of the first image-shaped input); [N, C] outputs also get top-1 agreement, and outputs of
    per-position class scores (`trtopt.metrics.agreement.class_axes`, also decided on the first batch) argmax agreement.
    `selected` outputs (after TopK / NMS, `trtopt.verify.selection`) get neither, nor are they chosen for a task: the
    first entry of TopK's sorted scores is always the largest, so their top-1 agreement would be 100%.
    """
    from trtopt.metrics.agreement import class_axes

    config = config or TaskConfig()
    stats = {n: ErrorStats(n) for n in names}
    evaluator = None
    samples = 0
    axes: dict[str, int] = {}
    for feeds, ref, test in batches:
        batch = len(next(iter(feeds.values()))) if feeds else 1
        if evaluator is None:
            hw = image_hw(feeds)
            evaluator = TaskEvaluator(choose_task({n: ref[n] for n in names}, hw, config, batch, selected), config, hw)
            axes = class_axes({n: np.asarray(ref[n]) for n in names if n not in selected}, hw)
        for n in names:
            r, t = np.asarray(ref[n]), np.asarray(test[n])
            classify = r.ndim == 2 and r.shape[0] == batch and r.shape[1] > 1 and n not in selected
            stats[n].update(r, t, classify=classify, axis=axes.get(n), batch=batch)
        evaluator.update(ref, test)
        samples += batch
    return OutputComparison([stats[n] for n in names], evaluator, samples)


def image_hw(feeds: Mapping[str, np.ndarray]) -> tuple[int, int] | None:
    """Height and width of the first rank-4 input: NCHW unless only the last axis looks like channels."""
    return next((shape_hw(np.shape(v)) for v in feeds.values() if np.ndim(v) == 4), None)


def shape_hw(shape: Sequence[int]) -> tuple[int, int]:
    """Height and width of a rank-4 image shape: NCHW unless only the last axis looks like channels."""
    channels_last = shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4)
    return (int(shape[1]), int(shape[2])) if channels_last else (int(shape[2]), int(shape[3]))


def added_errors(graph: gs.Graph, losses: Mapping[str, float]) -> dict[str, float]:
    """The error each compared tensor adds: its loss minus the largest loss among the compared tensors it
    reads from, found by walking back through the ops that were not compared (pooling, reshapes...).

    `losses` maps compared tensor names to 1 - cosine. Graph inputs carry no error. In a branching graph
    (residual blocks, Inception branches) this attributes error to the layer that made it, where the
    difference between consecutive layers in graph order would compare unrelated branches. A negative
    value means the layer shrank the error it received (a ReLU clipping noise below zero, an average).
    """
    carried: dict[str, float] = {}  # per tensor: its own loss if compared, else the worst loss feeding it
    added: dict[str, float] = {}
    for node in graph.nodes:  # topological order (the front end and every pass leave the graph sorted)
        received = max(
            (carried.get(t.name, 0.0) for t in node.inputs if not isinstance(t, gs.Constant) and t.name),
            default=0.0,
        )
        for out in node.outputs:
            if out.name in losses:
                added[out.name] = losses[out.name] - received
                carried[out.name] = losses[out.name]
            else:
                carried[out.name] = received
    return added
