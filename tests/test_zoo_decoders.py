"""tools/zoo_decoders.py: PicoDet (GFL) box decoding on head outputs built by hand with known boxes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from zoo_decoders import PICODET_STRIDES, picodet_decoder  # noqa: E402

HW = (96, 64)  # grids 12x8, 6x4, 3x2, 2x1 (ceil)
CLASSES, BINS = 3, 8


def _outputs(boxes: list[tuple[int, int, int, int, tuple[int, int, int, int], float]]) -> dict[str, np.ndarray]:
    """Head outputs (1 image) with one box per entry: (stride index, row, col, class, bins l/t/r/b, score)."""
    out = {}
    for k, stride in enumerate(PICODET_STRIDES):
        cells = math.ceil(HW[0] / stride) * math.ceil(HW[1] / stride)
        out[f"score_{k}"] = np.full((1, cells, CLASSES), 0.01, np.float32)
        out[f"box_{k}"] = np.zeros((1, cells, 4 * BINS), np.float32)
    for k, row, col, cls, sides, score in boxes:
        cell = row * math.ceil(HW[1] / PICODET_STRIDES[k]) + col
        out[f"score_{k}"][0, cell, cls] = score
        for side, b in enumerate(sides):  # a sharp softmax on bin b: distance b x stride
            out[f"box_{k}"][0, cell, side * BINS + b] = 30.0
    return out


def test_decodes_known_boxes_per_stride_with_their_class_and_score() -> None:
    outputs = _outputs([(0, 2, 3, 1, (1, 2, 3, 4), 0.9), (1, 1, 1, 2, (1, 1, 1, 1), 0.6)])
    ((boxes, scores, classes),) = picodet_decoder(HW)(outputs)
    # stride 8, cell (row 2, col 3): centre (28, 20); l/t/r/b = 8, 16, 24, 32
    np.testing.assert_allclose(boxes[0], [20, 4, 52, 52], atol=1e-3)
    # stride 16, cell (1, 1): centre (24, 24); every side 16
    np.testing.assert_allclose(boxes[1], [8, 8, 40, 40], atol=1e-3)
    assert list(classes) == [1, 2] and scores[0] == pytest.approx(0.9) and scores[1] == pytest.approx(0.6)


def test_drops_low_scores_and_overlapping_boxes_of_a_class() -> None:
    near, low = (0, 2, 4, 1, (2, 2, 2, 2), 0.8), (0, 8, 1, 0, (1, 1, 1, 1), 0.1)
    outputs = _outputs([(0, 2, 3, 1, (2, 2, 2, 2), 0.9), near, low])
    ((boxes, scores, classes),) = picodet_decoder(HW)(outputs)
    assert len(boxes) == 1 and scores[0] == pytest.approx(0.9)  # the 0.8 box overlaps (IoU 0.6); 0.1 is below 0.25


def test_refuses_outputs_that_are_not_a_picodet_head() -> None:
    outputs = _outputs([])
    outputs.pop("box_3")
    with pytest.raises(ValueError, match="not a PicoDet head"):
        picodet_decoder(HW)(outputs)
