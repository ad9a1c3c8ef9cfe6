"""How closely one run's outputs follow another's: the figures a plan's self-check (trtopt.verify) records.

Besides cosine and relative error, outputs of **per-position class scores** get an argmax agreement: the share
of positions (time steps of a CTC recogniser, pixels of a segmentation map) whose top class is the same in both
runs. Cosine is a weak bar there: PP-OCRv3-rec's default plan scored cosine 0.9957 while 19 of 640 time steps
flipped their top class (FP32 margins 0.005-0.084) and a quarter of its text lines decoded differently
(docs/holdout.md). `class_axes` says which outputs qualify and along which axis their classes lie:

- values that are a probability distribution along one axis of size >= 2 (non-negative, summing to 1 at every
  position: a Softmax over that axis; or log-probabilities, a LogSoftmax), on an output of rank >= 3. This is
  evident from the values whatever the model calls its outputs, finds the class axis wherever it is ([N, T, C],
  [T, N, C], a softmaxed segmentation map [N, C, H, W]), and leaves out what merely looks like scores: sigmoid
  detector heads ([N, anchors, classes], each class independent), hidden states and recurrent states, YOLO's
  [N, 4 + C, anchors] (boxes and scores on one axis);
- raw logits only where trtopt's task rule reads the output as a text recogniser (trtopt.metrics.task, rule 4:
  rank 3, an image input at least twice as wide as high, no more time steps than it has columns), with the
  classes on the last axis, the largest one (ddddocr's [T, 1, classes] Gemm output). Segmentation logits
  [N, C, H, W] without a Softmax are not recognised: nothing in their values tells classes from channels.

**Label maps** (integer class ids, a segmenter whose graph ends in its own ArgMax: `trtopt.metrics.labels`) get
the figures of semantic segmentation instead of a reading of their cosine, which weighs class 2 twice class 1
and is set by the background (wired-table-rec's line segmenter: cosine 0.986 with 99.93% of its pixels keeping
FP32's label, docs/holdout.md): the mean IoU of the classes other than the background and the share of pixels
whose label is unchanged.

Every output of 1024 elements or more also gets a distribution shift (trtopt.metrics.distribution_shift): how far
the plan moves the bulk of its values, which the few huge values that carry cosine cannot hide (LORE's heat map: cosine
0.96, two thirds of the positions across the detection threshold).

Positions where FP32's top two scores tie (a margin within `TIE` of the position's score range: zero-padded
steps, saturated scores) are left out: no plan can be expected to keep either order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trtopt.metrics.arrays import is_distribution, row_cosines, zero_padded
from trtopt.metrics.distribution_shift import distribution_shift

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Agreement:
    """How closely outputs follow target outputs over the verification samples (worst output counts)."""

    cosine: float  # per-sample cosine similarity, mean over samples; the lowest output's
    rel_error: float  # ||outputs - target|| / ||target||, the largest output's
    top1: float | None  # share of samples with the same argmax, over outputs shaped [N, C] (C > 1); else None
    argmax: float | None = None  # share of untied positions with the same top class (see the module); else None
    positions: int | None = None  # the untied positions `argmax` counted, on the output it comes from
    shift: float | None = None  # the largest distribution shift (metrics.distribution_shift); None: no large output
    shift_output: str | None = None  # the output `shift` comes from
    labels: float | None = None  # label maps: the lowest output's mean IoU of its non-background classes
    label_pixels: float | None = None  # that output's share of pixels with an unchanged label
    labels_output: str | None = None  # the output `labels` comes from
    # the lowest cosine of one sample's output (outputs of `SAMPLE_MIN_VALUES` or more per sample, 2+ samples),
    # where it is, and which sample: a mean over samples hides a plan that fails a few inputs (`sample_warning`)
    worst_sample: float | None = None
    worst_sample_output: str | None = None
    worst_sample_index: int | None = None  # 0-based, in the order the samples ran

    def describe(self, worst_sample: bool = False) -> str:
        """The figures in one line; with `worst_sample`, the worst sample's cosine too where it was measured."""
        top1 = f", top-1 {self.top1:.1%}" if self.top1 is not None else ""
        if self.argmax is not None:
            top1 += f", argmax {self.argmax:.2%} of {self.positions} positions"
        if self.labels is not None:
            top1 += (f", label map {self.labels_output}: mean IoU {self.labels:.2%} (non-background classes), "
                     f"{self.label_pixels:.2%} of pixels unchanged")
        if self.shift is not None:
            top1 += f", distribution shift {self.shift:.3f} ({self.shift_output})"
        if worst_sample and self.worst_sample is not None:
            top1 += f", worst sample {self.worst_sample:.4f}"
        return f"cosine {self.cosine:.5f}, relative error {self.rel_error:.4f}{top1}"


# Below this share of positions keeping their top class, the build warns (`argmax_warning`). For a CTC line of
# 25-40 steps, 0.99 of steps means a flipped step on about one line in three (PP-OCRv3-rec at 0.97: 25% of
# lines changed); a plan meeting it changes few decoded strings.
ARGMAX_MIN_AGREEMENT = 0.99
# Below this mean IoU of a label map's non-background classes, the build warns (`label_warning`). Thin classes
# (table lines a few pixels wide) lose IoU at their borders first: wired-table-rec's line segmenter keeps 96.8%
# on held-out pages with its default plan and 99.93% of its pixels (docs/holdout.md), while a plan that has lost
# a tenth of a class's pixels, or drawn a tenth more, is at or under 0.9 for that class; its all-INT8 plan (no
# sensitivity search) measures 83.2% with 99.55% of its pixels on its 16 calibration pages (avx2), and is warned.
LABEL_MIN_IOU = 0.95
# Below this cosine with FP32 on one sample's output, the build warns (`sample_warning`), whatever the mean over
# samples: that input is as far from FP32 as a whole plan the build calls far (trtopt.verify.REFERENCE_MIN_COSINE).
# A ViT saliency model met a mean of 0.99 on its verification photos while 10 of 60 held-out photos scored
# below 0.99, the worst 0.895 (round 12's hunt for untuned models, docs/zoo.md).
SAMPLE_MIN_COSINE = 0.95
# ... on outputs of at least this many values per sample. A cosine of a few values swings with small moves:
# table-cls's 2 logits scored 0.844 on one page whose top class (like every page's) stayed FP32's, and at a
# mean of 0.991 (avx2, its default plan). Their decision is what `top1` judges; per-position class scores and
# label maps have theirs judged too (argmax agreement, mean IoU) and get no worst sample either: PP-OCRv4-rec's
# default plan (avx2) has a line at 0.949, two of its 40 steps flipped, a string the exact-match rate counts.
SAMPLE_MIN_VALUES = 16
TIE = 1e-5  # a top-2 margin at most this share of the position's score range counts as a tie


def class_axes(outputs: Outputs, input_hw: tuple[int, int] | None = None) -> dict[str, int]:
    """The outputs of per-position class scores (see the module), each with its class axis."""
    axes = {}
    for name, value in outputs.items():
        axis = class_axis(np.asarray(value), input_hw)
        if axis is not None:
            axes[name] = axis
    return axes


def class_axis(value: np.ndarray, input_hw: tuple[int, int] | None = None) -> int | None:
    """`value`'s class axis if it holds per-position class scores, else None (the rule: the module's)."""
    if value.ndim < 3 or value.size == 0 or not np.issubdtype(value.dtype, np.floating):
        return None
    if not np.all(np.isfinite(value)):
        return None
    for axis in reversed(range(value.ndim)):
        if value.shape[axis] >= 2 and is_distribution(value, axis):
            return axis
    last = value.shape[-1]
    if value.ndim == 3 and last >= 2 and last == max(value.shape) and last > sorted(value.shape)[-2]:
        steps = max(value.shape[0], value.shape[1])
        if input_hw is not None and input_hw[1] >= 2 * input_hw[0] and steps <= input_hw[1]:
            return 2
    return None


def argmax_counts(got: np.ndarray, want: np.ndarray, axis: int) -> tuple[int, int]:
    """(positions whose top class is the same in `got` as in `want`, untied positions of `want`)."""

    got, want = zero_padded([np.asarray(got), np.asarray(want)])
    classes = want.shape[axis]
    ref = np.moveaxis(want, axis, -1).reshape(-1, classes).astype(np.float64)
    test = np.moveaxis(got, axis, -1).reshape(-1, classes)
    top2 = np.partition(ref, classes - 2, axis=1)[:, -2:]
    untied = top2[:, 1] - top2[:, 0] > TIE * (top2[:, 1] - ref.min(axis=1))
    same = ref.argmax(axis=1) == test.argmax(axis=1)
    return int(np.sum(same & untied)), int(np.sum(untied))


def agreement(
    outputs: Outputs, target: Outputs, axes: dict[str, int] | None = None, label_maps: Sequence[str] = (),
    samples: int | None = None,
) -> Agreement:
    """Compare two runs output by output; the worst output decides each figure. `axes` (`class_axes` of the
    target) names the outputs of per-position class scores that get an argmax agreement; None (the sensitivity
    search's per-trial calls, which read cosine only) also leaves out the distribution shift, for its time.
    `label_maps` (`trtopt.metrics.labels.label_map_outputs` of the target) get the label-map figures. With the
    number of `samples` run, the outputs with one row per sample get the worst sample's cosine (not a
    time-major [T, N, C] output, whose rows are time steps)."""

    cosines, errors, top1, shifts, lows = [], [], [], [], []
    for name, want in target.items():
        if not want.size and not np.size(outputs[name]):  # empty in both (a zero-size split): nothing differs
            continue
        padded = zero_padded([outputs[name], want])  # a data-dependent length: the missing part compares with 0
        rows = len(padded[1]) if want.ndim else 1  # a 0-d output (a count, a loss) is one row
        got, ref = comparable(*(a.astype(np.float64).reshape(rows, -1) for a in padded))
        with np.errstate(invalid="ignore", over="ignore"):  # NaN is the worst agreement (`_or_worst`)
            per_sample = row_cosines(got, ref)
            cosines.append(float(np.mean(per_sample)))
        judged = name in (axes or {}) or name in label_maps  # by their positions' classes: argmax agreement, IoU
        if samples and samples > 1 and rows == samples and got.shape[1] >= SAMPLE_MIN_VALUES and not judged:
            index = int(np.argmin(np.nan_to_num(per_sample, nan=-1.0)))
            lows.append((_or_worst(float(per_sample[index]), -1.0), name, index))
        shift = distribution_shift(got, ref) if axes is not None else None
        if shift is not None:
            shifts.append((shift, name))
        with np.errstate(invalid="ignore", over="ignore"):  # NaN is the worst agreement (`_or_worst`)
            scale = float(np.linalg.norm(ref))
            errors.append(float(np.linalg.norm(got - ref)) / scale if scale > 0 else float(np.linalg.norm(got)))
        if want.ndim == 2 and want.shape[1] > 1:
            top1.append(float(np.mean(padded[0].argmax(1) == padded[1].argmax(1))))
    argmax = [argmax_counts(outputs[name], target[name], axis) for name, axis in (axes or {}).items()]
    worst = min(((same / n, n) for same, n in argmax if n), default=None)
    moved = max(shifts, key=lambda s: s[0], default=None)  # the first of equals
    labels = _worst_label_map(outputs, target, label_maps)
    lowest = min(lows, key=lambda s: s[0], default=None)  # the first of equals
    return Agreement(
        cosine=_or_worst(min(cosines, default=1.0), -1.0),
        rel_error=_or_worst(max(errors, default=0.0), math.inf),
        top1=min(top1) if top1 else None,
        argmax=worst[0] if worst else None,
        positions=worst[1] if worst else None,
        shift=moved[0] if moved else None,
        shift_output=moved[1] if moved else None,
        labels=labels[0] if labels else None,
        label_pixels=labels[1] if labels else None,
        labels_output=labels[2] if labels else None,
        worst_sample=lowest[0] if lowest else None,
        worst_sample_output=lowest[1] if lowest else None,
        worst_sample_index=lowest[2] if lowest else None,
    )


def comparable(got: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`got` and `ref` ready for cosine and relative error, which neither step changes:

    - positions where both hold the same NaN or infinity are 0 in both: a model that computes NaN (Sqrt or Log
      of a negative feed, 0/0) or inf is followed when the plan computes the same there. Where only one is
      non-finite, or the infinities' signs differ, the values stay and the figures come out NaN: the worst
      agreement (`_or_worst`);
    - values so large that their squares overflow float64 (onnx's own test inputs hold 1e198) are scaled down
      by a power of two, both by the same."""
    got_bad, ref_bad = ~np.isfinite(got), ~np.isfinite(ref)
    if got_bad.any() or ref_bad.any():
        same = got_bad & ref_bad & ((np.isnan(got) & np.isnan(ref)) | (got == ref))
        if not np.array_equal(same, got_bad | ref_bad):
            return got, ref
        got, ref = np.where(same, 0.0, got), np.where(same, 0.0, ref)
    top = max(float(np.max(np.abs(got), initial=0.0)), float(np.max(np.abs(ref), initial=0.0)))
    if top > 1e100:
        factor = 2.0 ** -math.ceil(math.log2(top))
        got, ref = got * factor, ref * factor
    return got, ref


def unlabelled_cosine(outputs: Outputs, target: Outputs, label_maps: Sequence[str]) -> float:
    """The worst output cosine over the outputs that are not label maps (1.0: there are none): what says a plan
    is far from FP32 (trtopt.verify.REFERENCE_MIN_COSINE), while a label map has its mean IoU and warning."""
    others = [name for name in target if name not in label_maps]
    return agreement({n: outputs[n] for n in others}, {n: target[n] for n in others}).cosine if others else 1.0


def _worst_label_map(outputs: Outputs, target: Outputs, names: Sequence[str]) -> tuple[float, float, str] | None:
    """(mean IoU, pixel agreement, name) of the label map with the lowest mean IoU; None: no label maps."""
    from trtopt.metrics.labels import LabelAgreement

    found = []
    for name in names:
        got, want = zero_padded([np.asarray(outputs[name]), np.asarray(target[name])])
        labels = LabelAgreement()
        labels.update(want, got)
        if labels.mean_iou is not None and labels.agreement is not None:
            found.append((labels.mean_iou, labels.agreement, name))
    return min(found, default=None)


def argmax_warning(argmax: float | None, positions: int | None, cosine: float) -> str | None:
    """The warning for a plan that changes the top class at too many positions (None: it does not, or the
    outputs hold no per-position class scores)."""
    if argmax is None or argmax >= ARGMAX_MIN_AGREEMENT:
        return None
    return (
        f"the INT8 plan changes the top class at {1 - argmax:.1%} of {positions} positions of an "
        f"output of per-position class scores (argmax agreement with FP32 {argmax:.2%}, below "
        f"{ARGMAX_MIN_AGREEMENT:.0%}, though its cosine is {cosine:.4f}): decoded results (a recogniser's "
        "strings, a segmentation's labels) will differ from the float model's on some inputs. Calibrate on more "
        "samples like the model's real inputs (--calib), or keep the layers `trtopt compare --per-layer` names "
        "float (--exclude)."
    )


def label_warning(iou: float | None, pixels: float | None, output: str | None, cosine: float) -> str | None:
    """The warning for a plan whose label map loses too much of its classes' regions (None: it does not, or the
    outputs hold no label map)."""
    if iou is None or iou >= LABEL_MIN_IOU:
        return None
    return (
        f"the INT8 plan's label map {output} keeps a mean IoU of only {iou:.1%} with FP32's over its "
        f"non-background classes (below {LABEL_MIN_IOU:.0%}; {pixels:.2%} of its pixels keep their label, cosine of "
        f"the class ids {cosine:.4f}): the regions a user reads from it differ. Calibrate on more samples like the "
        "model's real inputs (--calib), or keep the layers `trtopt compare --per-layer` names float (--exclude)."
    )


def sample_warning(figures: Agreement, samples: int) -> str | None:
    """The warning for a plan whose mean over samples is fine while one sample's output is far from FP32 (None:
    every sample is within `SAMPLE_MIN_COSINE`, or the mean is far too, which the build flags already)."""
    worst, index = figures.worst_sample, figures.worst_sample_index or 0
    if worst is None or worst >= SAMPLE_MIN_COSINE or figures.cosine < SAMPLE_MIN_COSINE:
        return None
    return (
        f"one input is far from FP32 though the mean is not: sample {index + 1} of {samples} "
        f"keeps a cosine of only {worst:.4f} on output {figures.worst_sample_output} (below {SAMPLE_MIN_COSINE}; the "
        f"mean over samples is {figures.cosine:.4f}). INT8 error that gathers on some inputs will meet your users on "
        "theirs: `trtopt compare MODEL PLAN --data DIR` names the worst inputs; calibrate on more samples like "
        "them (--calib), or keep the layers `trtopt compare --per-layer` names float (--exclude)."
    )


def _or_worst(value: float, worst: float) -> float:
    """NaN or inf (a non-finite output) counts as the worst possible agreement."""
    return value if math.isfinite(value) else worst
