"""The task metrics of tools/bench_autocalib.py and the data of tools/text_lines.py, on hand-made cases."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import bench_autocalib as bench  # noqa: E402
import text_lines  # noqa: E402


def _one_hot(ids: list[list[int]], classes: int = 5) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[np.array(ids)]


def test_ctc_collapses_repeats_and_drops_blanks_in_both_layouts() -> None:
    batch_major = _one_hot([[0, 1, 1, 0, 1, 2, 2], [3, 3, 0, 0, 4, 0, 4]])  # [N, T, C]
    assert bench.ctc_strings(batch_major) == [(1, 1, 2), (3, 4, 4)]
    time_major = batch_major.transpose(1, 0, 2)  # [T, N, C], as ddddocr writes it
    assert bench.ctc_strings(time_major, time_major=True) == [(1, 1, 2), (3, 4, 4)]


def test_box_f1_matches_at_iou_one_half() -> None:
    ref = np.array([[0, 0, 10, 10, 0.9], [20, 20, 30, 30, 0.8]])
    assert bench.box_f1(ref, ref) == (2, 2, 2)
    shifted = ref + np.array([6, 0, 6, 0, 0])  # IoU 4/16 with the first: no match
    assert bench.box_f1(ref, shifted[:1]) == (0, 2, 1)
    assert bench.box_f1(ref, np.zeros((0, 5))) == (0, 2, 0)


def test_yolox_decoding_finds_one_confident_box_and_suppresses_its_neighbour() -> None:
    pred = np.zeros((sum((416 // s) ** 2 for s in (8, 16, 32)), 6), np.float32)
    pred[:, 4] = 0.01
    pred[10, 4:] = [0.9, 0.9]  # grid cell (10, 0) at stride 8, wh = exp(0) * 8
    pred[11, :] = [-1.0, 0.0, 0.0, 0.0, 0.8, 0.9]  # cell (11, 0) shifted back onto the same box
    boxes = bench.yolox_boxes(pred)
    assert boxes.shape == (1, 5) and boxes[0, :4] == pytest.approx([76.0, -4.0, 84.0, 4.0])


def test_task_metric_reads_each_task() -> None:
    case = bench.Case("c", Path("m.onnx"), "classify", "photos")
    ref = {"y": np.array([[0.0, 1.0], [1.0, 0.0]])}
    assert bench.task_metric(case, ref, {"y": np.array([[0.0, 1.0], [0.0, 1.0]])}) == "top-1 50.0%"
    det = bench.Case("d", Path("m.onnx"), "text-detect", "ppocr-det")
    maps = {"y": np.array([0.1, 0.5, 0.9, 0.2])}
    assert bench.task_metric(det, maps, {"y": np.array([0.1, 0.5, 0.1, 0.6])}) == "IoU 0.333"


@pytest.mark.parametrize(
    ("kind", "shape"),
    [("ppocr-rec", (3, 48, 320)), ("ppocr-cls", (3, 48, 192)), ("ppocr-det", (3, 320, 320)),
     ("dddd-rec", (1, 64, 160)), ("dddd-det", (3, 416, 416))],
)  # fmt: skip
def test_text_data_has_the_models_shapes_and_is_reproducible(kind: str, shape: tuple[int, ...]) -> None:
    first = text_lines.samples(kind, 2, seed=4)
    assert first.shape == (2, *shape) and first.dtype == np.float32
    assert np.array_equal(first, text_lines.samples(kind, 2, seed=4))
    assert not np.array_equal(first, text_lines.samples(kind, 2, seed=5))


def test_rendered_lines_have_dark_ink_on_light_paper_mostly() -> None:
    rng = random.Random(0)
    medians = [np.median(np.asarray(text_lines.render_line(rng).convert("L"))) for _ in range(20)]
    assert sum(m > 128 for m in medians) >= 15

