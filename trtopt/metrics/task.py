"""Which task a model's outputs serve, and the task's fidelity metric between FP32 and a quantised plan.

`choose_task` looks at the FP32 outputs of the first batch (their actual shapes: exported models often
declare wrong or symbolic ones) and the image input's height and width. The rule, first match wins:

1. a user decoder (`TaskConfig.decoder`) -> **detect**, with the boxes it returns; or detections the model decodes
   and suppresses itself (torchvision's detection exports): a float [K, 4] output of boxes, a float [K] of scores
   and an integer [K] of labels, one image's (a leading batch axis of 1 allowed) -> **detect**, those above the
   score threshold matched as they are;
2. a rank-3 output [N, a, b] one of whose axes is the anchor count of a YOLO head on this input (one or three
   anchors per cell of the stride 8/16/32 or 8/16/32/64 grids, `yolo.yolo_grid_match`) -> **detect**:
   anchors last ([N, 4 + C, A]) is YOLOv8; anchors first ([N, A, 5 + C]) is YOLOX when the boxes are still
   raw (`yolo.is_raw_yolox`), else YOLOv5;
3. an integer output of rank 3 or more whose last two axes are at least a quarter of the input's height and
   width (a segmenter that ends in its own ArgMax: class ids per pixel, `trtopt.metrics.labels`) -> **segment**;
   so is a float [N, C, H, W] of 5 to 255 class scores per pixel at the input's height and width (torchvision's
   segmentation exports), compared through its argmax over C; `--task segment` takes such a map from 2
   classes and a quarter of the input's size;
4. a rank-4 output [N, C, H, W] with at most 4 channels, at least a quarter of the input's height and width,
   and every value in [0, 1] (a probability map) -> **text-detect**;
5. any other rank-3 output with at least 2 classes on its last axis, on an input at least twice as wide as
   high, with no more time steps than the input has columns (a recognizer reads a text line left to right,
   downsampling its width) -> **ctc**: [N, T, C] when its first axis is the batch size and its second is not,
   [T, N, C] in the opposite case (ambiguous: [N, T, C]). Without an image input (audio, tokens, arrays) nothing
   tells CTC classes from a language model's or a per-frame classifier's: `--task ctc` asks for it;
6. a rank-2 output [N, C] with C >= 2 -> **classify**;
7. otherwise **raw** (per-output cosine and relative error only, which every task reports anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtopt.errors import TrtoptError
from trtopt.metrics.boxes import BoxAgreement, Detections
from trtopt.metrics.ctc import CTC_LAYOUTS, SequenceAgreement, decode_batch
from trtopt.metrics.labels import LabelAgreement, is_label_map, is_score_map, labels_from_scores
from trtopt.metrics.maps import DB_THRESHOLD, MapAgreement
from trtopt.metrics.yolo import BOX_FORMATS, DecodeConfig, anchors_first, classes_first, decode, is_raw_yolox

TASKS = ("auto", "classify", "detect", "segment", "text-detect", "ctc", "raw")
Decoder = Callable[[dict[str, np.ndarray]], Sequence[Any]]  # one batch's outputs -> (boxes, scores, classes)s


@dataclass(frozen=True)
class TaskConfig:
    """How `trtopt compare` measures task fidelity. None / "auto" means: chosen from the outputs."""

    task: str = "auto"
    output: str | None = None  # the output the task metric reads
    box_format: str = "auto"  # auto, or one of yolo.BOX_FORMATS
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    match_iou: float = 0.5
    map_threshold: float = DB_THRESHOLD
    blank: int = 0
    ctc_layout: str = "auto"  # auto, ntc or tnc
    decoder: Decoder | None = None
    decoder_name: str = ""


@dataclass(frozen=True)
class TaskChoice:
    task: str
    output: str | None  # the output the metric reads (None: a user decoder reads them all)
    variant: str  # box format or CTC layout; "" where there is none
    reason: str
    others: tuple[str, ...] = ()  # variant "decoded": the scores and labels outputs beside `output`'s boxes


def choose_task(outputs: Mapping[str, np.ndarray], input_hw: tuple[int, int] | None, config: TaskConfig,
                batch: int, selected: Collection[str] = ()) -> TaskChoice:  # fmt: skip
    """The task (config.task, or by the rule in this module's docstring) and the output it reads. `selected`
    outputs (after TopK / NMS / NonZero, `trtopt.verify.selection`) are read only as decoded detections unless a
    task is asked for: TopK's first score is always the largest, so a classifier read there would always agree."""
    if config.task not in TASKS:
        raise TrtoptError(f"--task {config.task!r} is not a task.", fix=f"Use one of: {', '.join(TASKS)}.")
    if config.output is not None and config.output not in outputs:
        raise TrtoptError(f"--task-output {config.output!r} is not an output of the model.",
                          fix=f"Use one of: {', '.join(outputs)}.")  # fmt: skip
    names = [config.output] if config.output else [n for n in outputs if n not in selected or config.task != "auto"]
    wanted = config.task
    if wanted == "raw":
        return TaskChoice("raw", None, "", "asked for (--task raw)")
    if config.decoder is not None and wanted in ("auto", "detect"):
        return TaskChoice("detect", None, "decoder", f"user decoder {config.decoder_name}")
    decoded = _decoded_detections(outputs) if wanted in ("auto", "detect") and not config.output else None
    if decoded is not None:
        boxes, scores, labels = decoded
        why = f"outputs {boxes!r}, {scores!r}, {labels!r}: boxes [K, 4], scores [K], labels [K], decoded by the model"
        return TaskChoice("detect", boxes, "decoded", f"{'asked for' if wanted == 'detect' else 'chosen'}: {why}",
                          (scores, labels))
    checks = {"detect": _detector, "segment": _label_map, "text-detect": _score_map, "ctc": _ctc,
              "classify": _classifier}  # fmt: skip
    for task, check in checks.items():
        if wanted not in ("auto", task):
            continue
        for name in sorted(names, key=lambda n: not probabilities(outputs[n])) if task == "classify" else names:
            found = check(np.asarray(outputs[name]), input_hw, config, batch)
            if found is not None:
                how = "asked for" if wanted == task else "chosen"
                return TaskChoice(task, name, found[0], f"{how}: output {name!r} {found[1]}")
    if wanted != "auto":
        raise TrtoptError(
            f"--task {wanted}: no output of the model looks like one ({_shapes(outputs)}).",
            fix="Pick the output with --task-output NAME, force the layout (--box-format, --ctc-layout), pass a "
            "decoder (--decoder file.py:function) for other detectors, or use --task raw.",
        )
    return TaskChoice("raw", None, "", f"chosen: no output looks like a task's ({_shapes(outputs)})")


def _shapes(outputs: Mapping[str, np.ndarray]) -> str:
    from trtopt.errors import format_shape

    return ", ".join(f"{n} {format_shape(np.shape(v))}" for n, v in outputs.items())


Found = tuple[str, str] | None  # (variant, why)


def yolo_format(out: np.ndarray, input_hw: tuple[int, int]) -> str | None:
    """The YOLO box format (`trtopt.metrics.yolo.BOX_FORMATS`) an output's shape over the input's grid says, or
    None (what `trtopt run` decodes detections from)."""
    found = _detector(out, input_hw, TaskConfig(), len(out))
    return found[0] if found is not None else None


def _detector(out: np.ndarray, input_hw: tuple[int, int] | None, config: TaskConfig, batch: int) -> Found:
    if out.ndim != 3 or input_hw is None:
        return None
    forced = config.box_format if config.box_format != "auto" else None
    if classes_first(out.shape, input_hw) and forced in (None, "yolov8"):
        return "yolov8", f"{list(out.shape)}: [N, 4 + classes, anchors] over the input's YOLO grid -> YOLOv8"
    if anchors_first(out.shape, input_hw):
        raw = is_raw_yolox(out[0], input_hw)
        variant = forced or ("yolox" if raw else "yolov5")
        how = "raw boxes (negative log-sizes) -> YOLOX grid decoding" if raw else "decoded boxes -> YOLOv5"
        return variant, f"{list(out.shape)}: [N, anchors, 5 + classes] over the input's YOLO grid, {how}"
    if forced is not None and out.shape[1 if forced == "yolov8" else 2] >= 5:
        return forced, f"{list(out.shape)}: --box-format {forced}"
    return None


def _decoded_detections(outputs: Mapping[str, np.ndarray]) -> tuple[str, str, str] | None:
    """(boxes, scores, labels) output names of one image's decoded detections (see the module), or None."""
    def one_image(name: str, rank: int) -> np.ndarray | None:
        out = np.asarray(outputs[name])
        out = out[0] if out.ndim == rank + 1 and out.shape[0] == 1 else out
        return out if out.ndim == rank else None

    for boxes in outputs:
        b = one_image(boxes, 2)
        if b is None or b.shape[1] != 4 or b.dtype.kind != "f":
            continue
        rows = {n: one_image(n, 1) for n in outputs if n != boxes}
        same = {n: r for n, r in rows.items() if r is not None and len(r) == len(b)}
        scores = next((n for n, r in same.items() if r.dtype.kind == "f"), None)
        labels = next((n for n, r in same.items() if r.dtype.kind in "iu"), None)
        if scores is not None and labels is not None:
            return boxes, scores, labels
    return None


def _label_map(out: np.ndarray, input_hw: tuple[int, int] | None, config: TaskConfig, batch: int) -> Found:
    if is_label_map(out, input_hw):
        return "", f"{list(out.shape)}: a map of class ids (integer {out.dtype}), compared class by class"
    if is_score_map(out, input_hw, asked=config.task == "segment"):
        return "scores", f"{list(out.shape)}: [N, classes, H, W] class scores, compared by their argmax per pixel"
    return None


def _score_map(out: np.ndarray, input_hw: tuple[int, int] | None, config: TaskConfig, batch: int) -> Found:
    if out.ndim != 4 or input_hw is None:
        return None
    forced = config.task == "text-detect"
    if not forced and not (out.shape[1] <= 4 and out.shape[2] * 4 >= input_hw[0] and out.shape[3] * 4 >= input_hw[1]):
        return None
    if not forced and not (out.size and float(out.min()) >= 0.0 and float(out.max()) <= 1.0):
        return None
    return "", f"{list(out.shape)}: a dense probability map, binarised at {config.map_threshold:g}"


def _ctc(out: np.ndarray, input_hw: tuple[int, int] | None, config: TaskConfig, batch: int) -> Found:
    if out.ndim != 3 or out.shape[2] < 2:
        return None
    if config.ctc_layout != "auto":
        if config.ctc_layout not in CTC_LAYOUTS:
            raise TrtoptError(f"--ctc-layout {config.ctc_layout!r} is not a layout.",
                              fix=f"Use auto or one of: {', '.join(CTC_LAYOUTS)}.")  # fmt: skip
        return config.ctc_layout, f"{list(out.shape)}: --ctc-layout {config.ctc_layout}"
    time_major = out.shape[1] == batch and out.shape[0] != batch
    steps = out.shape[0] if time_major else out.shape[1]
    text_line = input_hw is None or (input_hw[1] >= 2 * input_hw[0] and steps <= input_hw[1])
    if config.task != "ctc" and not text_line:
        return None  # not a wide input read column by column: a dense head (anchors), not a text line
    if config.task != "ctc" and input_hw is None:
        # nothing tells a recogniser's per-step classes from others without a text-line image: a masked language
        # model's [N, T, vocab] softmax (g2p-id) or an EEG model's per-frame states ([T, N, 4], brainmaze) read as
        # CTC scored "exact sequence match" on sequences nobody decodes that way (round 13's hunt); LORE's
        # [1, cells, 4] coordinates are no classes at all. --task ctc asks for it.
        return None
    layout = "tnc" if time_major else "ntc"
    return layout, f"{list(out.shape)}: {'[T, N, C]' if time_major else '[N, T, C]'} class scores per time step"


def _classifier(out: np.ndarray, input_hw: tuple[int, int] | None, config: TaskConfig, batch: int) -> Found:
    if out.ndim == 2 and out.shape[1] >= 2:
        return "", f"{list(out.shape)}: [N, classes]{', probabilities' if probabilities(out) else ''}"
    return None


def probabilities(out: np.ndarray) -> bool:
    """[N, classes] that sum to 1 (a Softmax): a classifier's output before any other [N, C] one, which may be
    box offsets or landmarks (MTCNN's ONet: [N, 4] boxes, [N, 10] landmarks, then [N, 2] face probabilities)."""
    from trtopt.metrics.arrays import is_distribution

    out = np.asarray(out)
    return out.ndim == 2 and out.shape[1] >= 2 and out.dtype.kind == "f" and out.size > 0 and is_distribution(out, 1)


class TaskEvaluator:
    """Accumulates the chosen task's metric over batches of (FP32 outputs, plan outputs)."""

    def __init__(self, choice: TaskChoice, config: TaskConfig, input_hw: tuple[int, int] | None) -> None:
        self.choice = choice
        self.config = config
        self.input_hw = input_hw
        self.boxes = BoxAgreement(config.match_iou)
        self.maps = MapAgreement(config.map_threshold)
        self.sequences = SequenceAgreement()
        self.labels = LabelAgreement()
        self.top1 = [0, 0]  # same, rows

    def update(self, reference: Mapping[str, np.ndarray], test: Mapping[str, np.ndarray]) -> None:
        task, name = self.choice.task, self.choice.output
        if task == "detect":
            for ref, tst in zip(self._detections(reference), self._detections(test), strict=True):
                self.boxes.update(ref, tst)
        elif task == "segment" and name is not None:
            labels = labels_from_scores if self.choice.variant == "scores" else np.asarray
            self.labels.update(labels(reference[name]), labels(test[name]))
        elif task == "text-detect" and name is not None:
            self.maps.update(reference[name], test[name])
        elif task == "ctc" and name is not None:
            layout, blank = self.choice.variant, self.config.blank
            self.sequences.update(decode_batch(reference[name], layout, blank), decode_batch(test[name], layout, blank))
        elif task == "classify" and name is not None:
            self.top1[0] += int((reference[name].argmax(axis=1) == test[name].argmax(axis=1)).sum())
            self.top1[1] += len(reference[name])

    def _detections(self, outputs: Mapping[str, np.ndarray]) -> list[Detections]:
        if self.choice.variant == "decoder" and self.config.decoder is not None:
            return _call_decoder(self.config.decoder, self.config.decoder_name, outputs)
        if self.choice.variant == "decoded" and self.choice.output is not None:  # above the score threshold
            names = (self.choice.output, *self.choice.others)
            try:
                found = Detections.of(*(outputs[n] for n in names))
            except ValueError as exc:  # the lengths matched on the first batch: the outputs are something else
                raise TrtoptError(
                    f"Cannot read outputs {', '.join(map(repr, names))} as one image's detections: {exc}.",
                    fix="Pick the task with --task and --task-output, or pass --decoder file.py:function.",
                ) from None
            kept = found.scores >= self.config.decode.score_threshold
            return [Detections(found.boxes[kept], found.scores[kept], found.classes[kept])]
        assert self.choice.output is not None and self.input_hw is not None  # set by choose_task
        try:
            return decode(outputs[self.choice.output], self.choice.variant, self.input_hw, self.config.decode)
        except ValueError as exc:
            raise TrtoptError(
                f"Cannot decode output {self.choice.output!r} as {self.choice.variant}: {exc}.",
                fix="Pick another --box-format, or pass --decoder file.py:function.",
            ) from None

    def headline(self) -> tuple[str, float | None]:
        """The task's one number (higher is better): F1, mean or map IoU, exact-match rate or top-1 agreement."""
        task = self.choice.task
        if task == "detect":
            return "box F1", self.boxes.f1
        if task == "segment":
            return "mean IoU", self.labels.mean_iou
        if task == "text-detect":
            return "map IoU", self.maps.iou
        if task == "ctc":
            return "exact match", self.sequences.exact_rate
        if task == "classify":
            return "top-1 agreement", self.top1[0] / self.top1[1] if self.top1[1] else None
        return "", None

    def to_dict(self) -> dict[str, object]:
        metrics: dict[str, object] = {}
        if self.choice.task == "detect":
            metrics = self.boxes.to_dict() | {"score_threshold": self.config.decode.score_threshold,
                                              "nms_iou": self.config.decode.nms_iou}  # fmt: skip
        elif self.choice.task == "segment":
            metrics = self.labels.to_dict()
        elif self.choice.task == "text-detect":
            metrics = self.maps.to_dict()
        elif self.choice.task == "ctc":
            metrics = self.sequences.to_dict() | {"blank": self.config.blank}
        elif self.choice.task == "classify":
            metrics = {"top1_agreement": self.headline()[1], "samples": self.top1[1]}
        return {"task": self.choice.task, "output": self.choice.output, "variant": self.choice.variant,
                "reason": self.choice.reason, "metrics": metrics}  # fmt: skip


def _call_decoder(decoder: Decoder, name: str, outputs: Mapping[str, np.ndarray]) -> list[Detections]:
    try:
        result = [Detections.of(*image) for image in decoder(dict(outputs))]
    except Exception as exc:  # the user's code: any failure becomes one clear message
        raise TrtoptError(
            f"The decoder {name} failed: {type(exc).__name__}: {exc}",
            fix="It receives one batch's outputs as {name: array} and must return, per image, a tuple "
            "(boxes [K, 4] as x1 y1 x2 y2, scores [K], classes [K]).",
        ) from None
    batch = len(next(iter(outputs.values())))
    if len(result) != batch:
        raise TrtoptError(f"The decoder {name} returned {len(result)} images for a batch of {batch}.",
                          fix="Return one (boxes, scores, classes) tuple per image of the batch.")  # fmt: skip
    return result


__all__ = ["BOX_FORMATS", "TASKS", "TaskChoice", "TaskConfig", "TaskEvaluator", "choose_task"]
