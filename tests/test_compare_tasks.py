"""`trtopt compare` end to end with task metrics, on small models built in code and real image files.

    (built in tests/task_models.py)
    detector:  input 1x3x64x96 ─┬─ Conv k8 s8 ─ Reshape ─┐          (boxes: 4 channels, scores: 3 channels,
                                ├─ Conv k16 s16 ─ Reshape ─ Concat ─ per stride; Sigmoid; boxes x 64)
                                └─ Conv k32 s32 ─ Reshape ─┘   ─► Concat(boxes, scores) ─► [1, 7, 126] (YOLOv8)
    text map:  input 1x3x32x32 ─ Conv 3x3 ─ Relu ─ Conv 3x3 (1 ch) ─ Sigmoid ─► [1, 1, 32, 32]
    CTC:       input 1x3x32x64 ─ Conv 3x3 ─ Relu ─ Conv 32x4 s4 ─ Reshape ─ Transpose ─ Softmax ─► [1, 16, 12]
    decoded:   input 1x3x64x96 ─ Conv ─ Relu ─ Conv k8 s8 heads ─► boxes [K, 4], scores [K], labels [K] (NonZero)

An FP32 plan must agree perfectly with its model under every task metric (so the metric plumbing cannot
invent disagreement); an INT8 plan's numbers must be consistent with the counts they come from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image
from task_models import decoded_detector, detector, recognizer, segmenter, text_map

from trtopt.cli.main import main

MODELS = {"detector": detector, "text_map": text_map, "recognizer": recognizer, "segmenter": segmenter,
          "decoded": decoded_detector}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compare_tasks")
    (root / "images").mkdir()
    rng = np.random.default_rng(7)
    for i in range(10):
        small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((160, 120), Image.BILINEAR).save(root / "images" / f"im{i}.png")
    for name, make in MODELS.items():
        onnx.save_model(make(), root / f"{name}.onnx")
        common = [str(root / f"{name}.onnx"), "--backend", "cpu", "--preset", "imagenet", "--json"]
        assert main(["build", *common, "-o", str(root / f"{name}_fp32.engine")]) == 0
        int8 = ["--int8", "--calib", str(root / "images"), "--min-channels", "1"]
        assert main(["build", *common, *int8, "-o", str(root / f"{name}_int8.engine")]) == 0
    return root


def compare(work: Path, name: str, precision: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    capsys.readouterr()
    args = [str(work / f"{name}.onnx"), str(work / f"{name}_{precision}.engine"), "--data", str(work / "images")]
    assert main(["compare", *args, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("name", "task", "variant"), [("detector", "detect", "yolov8"), ("text_map", "text-detect", ""),
                                  ("recognizer", "ctc", "ntc"), ("segmenter", "segment", "")]
)  # fmt: skip
def test_auto_picks_the_task_and_an_fp32_plan_agrees_perfectly(
    work: Path, capsys: pytest.CaptureFixture[str], name: str, task: str, variant: str
) -> None:
    result = compare(work, name, "fp32", capsys)
    chosen = result["task"]
    assert (chosen["task"], chosen["variant"]) == (task, variant) and chosen["reason"].startswith("chosen")
    (output,) = result["outputs"]
    assert output["cosine"] == pytest.approx(1.0, abs=1e-6) and output["rel_error"] < 1e-5
    m = chosen["metrics"]
    if task == "detect":
        assert m["reference_boxes"] > 0 and m["matched"] == m["reference_boxes"] == m["test_boxes"]
        assert m["f1"] == 1.0
    elif task == "text-detect":
        assert m["images"] == 10 and m["reference_pixels"] > 0 and m["binary_iou"] == 1.0
    elif task == "segment":
        assert m["images"] == 10 and len(m["reference_pixels"]) == 3 and m["pixel_agreement"] == 1.0
        assert m["mean_iou"] == 1.0 and set(m["class_iou"].values()) == {1.0}
    else:
        assert m["samples"] == 10 and m["exact_match"] == 1.0 and m["mean_normalized_edit_distance"] == 0.0


def test_detections_the_model_decodes_are_compared_as_boxes(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchvision's detection exports (boxes [K, 4], scores [K], labels [K], K data-dependent) were compared
    output by output, zero-padded to the longer K; they are a detector's boxes, matched."""
    chosen = compare(work, "decoded", "fp32", capsys)["task"]
    assert (chosen["task"], chosen["variant"]) == ("detect", "decoded")
    m = chosen["metrics"]
    assert m["reference_boxes"] > m["images"] == 10 and m["f1"] == 1.0
    m = compare(work, "decoded", "int8", capsys)["task"]["metrics"]
    assert m["reference_boxes"] > 0 and m["f1"] == pytest.approx(2 * m["matched"] / (m["reference_boxes"] +
                                                                                     m["test_boxes"]))


def test_int8_detector_numbers_follow_from_the_box_counts(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = compare(work, "detector", "int8", capsys, "--score-threshold", "0.3")["task"]["metrics"]
    assert m["score_threshold"] == 0.3 and m["images"] == 10
    ref, test, matched = m["reference_boxes"], m["test_boxes"], m["matched"]
    assert ref > 0 and test > 0 and 0 <= matched <= min(ref, test)
    assert m["recall"] == pytest.approx(matched / ref) and m["precision"] == pytest.approx(matched / test)
    assert m["f1"] == pytest.approx(2 * matched / (ref + test))


def test_int8_recognizer_and_map_report_their_agreement(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctc = compare(work, "recognizer", "int8", capsys, "--blank", "3")
    m = ctc["task"]["metrics"]
    assert m["blank"] == 3 and 0.0 <= m["exact_match"] <= 1.0 and 0.0 <= m["mean_normalized_edit_distance"] <= 1.0
    assert ctc["outputs"][0]["rel_error"] > 0, "INT8 moves the probabilities"
    maps = compare(work, "text_map", "int8", capsys, "--map-threshold", "0.5")["task"]["metrics"]
    assert maps["threshold"] == 0.5 and 0.0 <= maps["binary_iou"] <= 1.0 and maps["min_text_image_cosine"] <= 1.0
    args = [str(work / "text_map.onnx"), str(work / "text_map_int8.engine"), "--data", str(work / "images")]
    assert main(["compare", *args, "--map-threshold", "0.5"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # any probability map (a saliency map too): no "text" rows
    assert "with FP32 pixels > 0.5" in text and "worst cosine of an image with such pixels" in text


def test_an_int8_segmenter_reports_iou_per_class(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = compare(work, "segmenter", "int8", capsys)
    m = result["task"]["metrics"]
    assert result["task"]["task"] == "segment" and m["background"] in (0, 1, 2)
    ious = [v for c, v in m["class_iou"].items() if int(c) != m["background"]]
    assert ious and m["mean_iou"] == pytest.approx(sum(ious) / len(ious)) and 0 < m["pixel_agreement"] <= 1
    capsys.readouterr()
    args = [str(work / "segmenter.onnx"), str(work / "segmenter_int8.engine"), "--data", str(work / "images")]
    assert main(["compare", *args]) == 0
    assert "mean IoU, background left out" in capsys.readouterr().out


def test_forced_task_and_readable_tables(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = compare(work, "detector", "int8", capsys, "--task", "raw")["task"]
    assert raw["task"] == "raw" and raw["metrics"] == {}
    capsys.readouterr()
    args = [str(work / "detector.onnx"), str(work / "detector_int8.engine"), "--data", str(work / "images")]
    assert main(["compare", *args]) == 0
    text = capsys.readouterr().out
    for expected in ("per output", "cosine", "task: detect (yolov8)", "recall of FP32's boxes", "F1"):
        assert expected in text, expected


def test_task_errors_are_one_paragraph(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(work / "text_map.onnx"), str(work / "text_map_int8.engine"), "--data", str(work / "images")]
    assert main(["compare", *args, "--task", "ctc"]) == 2
    assert "no output of the model looks like one" in capsys.readouterr().err
    assert main(["compare", *args, "--score-threshold", "1.5"]) == 2
    assert "--score-threshold is 1.5" in capsys.readouterr().err


def test_recognizer_plans_record_and_compare_argmax_agreement(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtopt.plan import read_plan

    fp32 = compare(work, "recognizer", "fp32", capsys)["outputs"][0]
    assert fp32["argmax_agreement"] == 1.0 and 0 < fp32["argmax_positions"] <= 10 * 16
    int8 = compare(work, "recognizer", "int8", capsys)["outputs"][0]
    assert 0.0 <= int8["argmax_agreement"] <= 1.0 and int8["argmax_positions"] == fp32["argmax_positions"]
    assert compare(work, "detector", "int8", capsys)["outputs"][0]["argmax_agreement"] is None
    checked = read_plan(work / "recognizer_int8.engine").metadata.verification
    assert checked is not None and checked.reference_vs_fp32.argmax is not None
    assert checked.reference_vs_fp32.positions is not None and checked.reference_vs_fp32.positions > 0
    detector = read_plan(work / "detector_int8.engine").metadata.verification
    assert detector is not None and detector.reference_vs_fp32.argmax is None


def test_segmenter_plans_record_label_map_figures(work: Path) -> None:
    from trtopt.plan import read_plan

    fp32 = read_plan(work / "segmenter_fp32.engine").metadata.verification
    assert fp32 is not None and fp32.reference_vs_fp32.labels == 1.0 and fp32.reference_vs_fp32.label_pixels == 1.0
    checked = read_plan(work / "segmenter_int8.engine").metadata.verification
    assert checked is not None and checked.reference_vs_fp32.labels_output == "labels"
    assert checked.reference_vs_fp32.labels is not None and 0.0 <= checked.reference_vs_fp32.labels <= 1.0
    assert checked.kernels_vs_reference.labels is not None
    detector = read_plan(work / "detector_int8.engine").metadata.verification
    assert detector is not None and detector.reference_vs_fp32.labels is None
