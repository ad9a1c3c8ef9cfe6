"""Label maps (integer class ids from a graph's own ArgMax) in the build's self-check (trtopt.metrics.agreement): the
mean IoU of the non-background classes and the share of unchanged pixels, computed exactly, recorded in the
plan, warned of below `LABEL_MIN_IOU`, and left out for outputs that are not label maps."""

from __future__ import annotations

import numpy as np
import pytest

from trtopt.cli.summaries import verification_text
from trtopt.metrics.agreement import LABEL_MIN_IOU, Agreement, agreement, label_warning
from trtopt.metrics.labels import label_map_outputs
from trtopt.plan.verification import Verification


def _maps() -> tuple[np.ndarray, np.ndarray]:
    """Two 1 x 10 x 10 maps: background 0, a row line (1) and a column line (2); the test map draws the row
    line one pixel short and the column line one pixel too long."""
    ref = np.zeros((1, 10, 10), np.int64)
    ref[0, 4, :] = 1  # 10 pixels
    ref[0, :4, 7] = 2  # 4 pixels
    test = ref.copy()
    test[0, 4, 0] = 0  # class 1: intersection 9, union 10
    test[0, 5, 7] = 2  # class 2: intersection 4, union 5
    return ref, test


def test_figures_are_the_per_class_counts() -> None:
    ref, test = _maps()
    scores = np.zeros((1, 3, 10, 10), np.float32)  # a float output beside it is not a label map
    found = agreement({"labels": test, "scores": scores}, {"labels": ref, "scores": scores}, {}, ["labels"])
    assert found.labels == pytest.approx((9 / 10 + 4 / 5) / 2) and found.labels_output == "labels"
    assert found.label_pixels == pytest.approx(98 / 100)
    assert "label map labels: mean IoU 85.00% (non-background classes), 98.00% of pixels unchanged" in found.describe()
    same = agreement({"labels": ref}, {"labels": ref}, {}, ["labels"])
    assert same.labels == 1.0 and same.label_pixels == 1.0
    assert agreement({"labels": test}, {"labels": ref}).labels is None  # not asked: no figure


def test_the_worst_label_map_is_reported() -> None:
    ref, test = _maps()
    found = agreement({"a": ref, "b": test}, {"a": ref, "b": ref}, {}, ["a", "b"])
    assert found.labels_output == "b" and found.labels == pytest.approx(0.85)


def test_which_outputs_are_label_maps() -> None:
    ref, _ = _maps()
    outputs = {"ids": ref, "scores": ref.astype(np.float32), "count": np.array([[3]], np.int64),
               "small": ref[:, :2, :2]}  # fmt: skip
    assert label_map_outputs(outputs, (32, 32)) == ["ids"]  # "small" is under a quarter of the input's side
    assert label_map_outputs({"big": ref + 300}, (32, 32)) == []  # ids past MOST_CLASSES: not class ids


def test_warning_below_the_level_names_the_fix() -> None:
    text = label_warning(0.85, 0.98, "labels", 0.97)
    assert text is not None and "85.0%" in text and "98.00%" in text and "labels" in text
    assert "--calib" in text and "--exclude" in text
    assert label_warning(LABEL_MIN_IOU, 0.999, "labels", 0.99) is None and label_warning(None, None, None, 1.0) is None


def _verification(labels: float | None) -> Verification:
    ref = Agreement(0.98, 0.1, None, labels=labels, label_pixels=0.999 if labels is not None else None,
                    labels_output="labels" if labels is not None else None)  # fmt: skip
    return Verification(samples=8, source="held back", isa="avx2", variant="u8u8", reference_vs_fp32=ref,
                        kernels_vs_reference=Agreement(0.9999, 0.01, None), tolerance=0.2)  # fmt: skip


def test_verification_record_warns_and_round_trips() -> None:
    lost = _verification(0.9)
    assert len(lost.warnings) == 1 and "label map labels" in lost.warnings[0]
    record = lost.to_dict()
    assert Verification.from_dict(record) == lost
    assert "mean IoU 90.00%" in verification_text(record)
    assert _verification(0.97).warnings == [] and _verification(None).warning is None
    assert "labels" not in _verification(None).to_dict()["reference_vs_fp32"]  # older readers see what they knew


def test_build_summary_shows_warnings_as_text_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """The summary's console reads no markup (file and tensor names carry brackets): a warning row is styled text,
    and a bracket in a row is shown as it is."""
    from trtopt.cli.summaries import print_build_summary

    lost = _verification(0.9)
    summary = {"plan": "seg.engine", "precision": "int8", "file_bytes": 2**20, "int8_layers": 3,
               "bias_corrected_layers": 3, "float_layers": {}, "equalization": "1 tensor rescaled [conv_1]",
               "verification": lost.to_dict(), "warnings": lost.warnings, "stage_seconds": {"build": 1.0}}  # fmt: skip
    print_build_summary(summary, "cpu")
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "WARNING the INT8 plan's label map labels keeps a mean IoU of only 90.0%" in text
    assert "[bold" not in text and "[/]" not in text and "rescaled [conv_1]" in text


def test_the_search_weighs_label_maps_by_their_mean_iou() -> None:
    """The sensitivity search's figures (trtopt.search._trials) for a label map: the mean IoU per sample and
    pooled, not the cosine of class ids; other outputs keep their cosine."""
    from trtopt.search._trials import cosine_figures, sample_cosines

    ref, test = _maps()
    refs, tests = np.concatenate([ref, ref]), np.concatenate([test, ref])  # two samples: one changed, one not
    scores = np.linspace(1, 2, 20, dtype=np.float32).reshape(2, 10)
    figures = cosine_figures({"labels": tests, "scores": scores}, {"labels": refs, "scores": scores})
    pooled = (19 / 20 + 8 / 9) / 2  # class 1: 19 of 20 pixels over both samples, class 2: 8 of 9
    assert figures[0] == pytest.approx(min((0.85 + 1.0) / 2, pooled)) and figures[1] == pytest.approx(1.0)
    rows = sample_cosines([{"labels": tests, "scores": scores}], [({}, 2)], {"labels": refs, "scores": scores})
    np.testing.assert_allclose(rows[0], [0.85, 1.0])
    np.testing.assert_allclose(rows[1], [1.0, 1.0])


def test_a_label_map_is_not_judged_far_from_fp32_by_its_cosine() -> None:
    """`far_from_fp32` reads the outputs that are not label maps; a label map has its own figure and warning."""
    from trtopt.metrics.agreement import unlabelled_cosine

    ref, test = _maps()
    scores = np.linspace(1, 2, 10, dtype=np.float32)[np.newaxis]
    moved = np.where(ref == 1, 2, np.where(ref == 2, 1, ref))  # the two line classes swapped: cosine 0.83
    assert agreement({"labels": moved}, {"labels": ref}).cosine < 0.95
    assert unlabelled_cosine({"labels": moved}, {"labels": ref}, ["labels"]) == 1.0  # nothing else to judge
    both = unlabelled_cosine({"labels": test, "s": -scores}, {"labels": ref, "s": scores}, ["labels"])
    assert both == pytest.approx(-1.0)  # the other output still counts
