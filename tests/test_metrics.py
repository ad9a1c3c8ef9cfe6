"""The pure-numpy fidelity metrics (trtopt.metrics) on hand-made arrays with known answers: box IoU, NMS and
greedy matching, binarised-map IoU, greedy CTC decoding and edit distances."""

from __future__ import annotations

import numpy as np
import pytest

from trtopt.metrics import (
    BoxAgreement,
    Detections,
    MapAgreement,
    SequenceAgreement,
    binary_iou,
    box_iou,
    ctc_greedy,
    decode_batch,
    edit_distance,
    match_count,
    nms,
    normalized_edit_distance,
)
from trtopt.metrics.maps import cosine_rows


def dets(boxes: list[list[float]], scores: list[float], classes: list[int]) -> Detections:
    return Detections.of(boxes, scores, classes)


# --- boxes --------------------------------------------------------------------------------------------


def test_box_iou_known_values() -> None:
    a = np.array([[0, 0, 2, 2], [0, 0, 4, 4], [0, 0, 0, 3]], float)  # the last is degenerate (zero width)
    b = np.array([[1, 1, 3, 3], [0, 0, 2, 2], [10, 10, 11, 11]], float)
    iou = box_iou(a, b)
    assert iou.shape == (3, 3)
    # overlap 1x1 of two 2x2 boxes: 1 / (4 + 4 - 1); a 2x2 box inside a 4x4 one: 4 / 16; disjoint: 0
    assert iou[0] == pytest.approx([1 / 7, 1.0, 0.0])
    assert iou[1] == pytest.approx([4 / 16, 4 / 16, 0.0])
    assert iou[2] == pytest.approx([0.0, 0.0, 0.0])


def test_nms_keeps_the_best_of_overlapping_boxes_and_every_separate_one() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30], [0, 0, 10, 5]], float)
    scores = np.array([0.8, 0.9, 0.5, 0.7])
    # box 1 beats box 0 (IoU 90/110 = 0.82 > 0.45); box 3 overlaps box 1 by 45/105 = 0.43 <= 0.45: kept
    assert nms(boxes, scores, 0.45).tolist() == [1, 3, 2]
    assert nms(boxes, scores, 0.4).tolist() == [1, 2]


def test_matching_needs_the_same_class_and_iou_at_least_the_threshold() -> None:
    ref = dets([[0, 0, 2, 2]], [1.0], [0])
    assert match_count(ref, dets([[0, 0, 2, 1]], [0.9], [0])) == 1  # IoU exactly 0.5
    assert match_count(ref, dets([[0, 0, 2, 0.9]], [0.9], [0])) == 0  # IoU 0.45
    assert match_count(ref, dets([[0, 0, 2, 2]], [0.9], [1])) == 0  # right place, wrong class


def test_matching_is_greedy_by_test_score_and_one_to_one() -> None:
    ref = dets([[0, 0, 10, 10], [5, 0, 15, 10]], [1, 1], [0, 0])
    # the best-scoring test box overlaps both references and takes the one it overlaps most (IoU 0.67 vs 0.54)
    test = dets([[3, 0, 13, 10], [0, 0, 10, 10]], [0.9, 0.8], [0, 0])
    assert match_count(ref, test) == 2
    # greedy, not optimal: the high-scoring box takes A (IoU 0.67; B would do at 0.54), and the low-scoring
    # one, a near copy of A (0.9), overlaps B too little (0.27): one match where an assignment would find two
    ab = dets([[0, 0, 10, 10], [0, 5, 10, 15]], [1, 1], [0, 0])
    assert match_count(ab, dets([[0, 2, 10, 12], [0, 0, 10, 9]], [0.9, 0.5], [0, 0])) == 1
    assert match_count(ab, dets([[0, 2, 10, 12], [0, 0, 10, 9]], [0.5, 0.9], [0, 0])) == 2
    # duplicates of one reference box match it once
    ref1 = dets([[0, 0, 10, 10]], [1], [0])
    assert match_count(ref1, dets([[0, 0, 10, 10]] * 3, [0.9, 0.8, 0.7], [0, 0, 0])) == 1


def test_box_agreement_counts_recall_precision_and_f1_over_images() -> None:
    agreement = BoxAgreement(0.5)
    ref = dets([[0, 0, 2, 2], [5, 5, 7, 7], [10, 10, 12, 12]], [1, 1, 1], [0, 1, 0])
    test = dets([[0, 0, 2, 2], [5, 5, 7, 7]], [0.9, 0.8], [0, 0])  # second box: right place, wrong class
    agreement.update(ref, test)
    agreement.update(dets([[0, 0, 1, 1]], [1], [3]), Detections.empty())
    assert (agreement.reference_boxes, agreement.test_boxes, agreement.matched) == (4, 2, 1)
    assert agreement.recall == pytest.approx(1 / 4)
    assert agreement.precision == pytest.approx(1 / 2)
    assert agreement.f1 == pytest.approx(2 * 1 / (4 + 2))


def test_box_agreement_when_nobody_found_anything() -> None:
    agreement = BoxAgreement()
    assert agreement.f1 is None  # no image yet
    agreement.update(Detections.empty(), Detections.empty())
    assert agreement.recall is None and agreement.precision is None and agreement.f1 == 1.0


def test_detections_of_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        Detections.of([[0, 0, 1, 1]], [0.5, 0.6], [0])


# --- score maps ----------------------------------------------------------------------------------------


def test_binary_iou_known_value_and_strict_threshold() -> None:
    ref = np.array([[0.5, 0.1], [0.4, 0.2]])
    test = np.array([[0.6, 0.35], [0.1, 0.2]])
    assert binary_iou(ref, test, 0.3) == (1, 3)  # both: (0,0); either: (0,0), (0,1), (1,0)
    assert binary_iou(np.array([0.3]), np.array([0.3]), 0.3) == (0, 0)  # "above" the threshold, as DB binarises


def test_map_iou_pools_pixels_over_images_instead_of_averaging_ratios() -> None:
    agreement = MapAgreement(0.3)
    big_ref = np.zeros((1, 1, 10, 10))
    big_ref[..., :8, :] = 1.0  # 80 pixels
    big_test = big_ref.copy()
    big_test[..., 7, :] = 0.0  # 70 of them
    small_ref = np.zeros((1, 1, 10, 10))
    small_ref[..., 0, 0] = 1.0
    agreement.update(big_ref, big_test)
    agreement.update(small_ref, np.zeros_like(small_ref))  # the one text pixel missed
    assert agreement.iou == pytest.approx(70 / 81)  # mean of per-image ratios would be (70/80 + 0) / 2
    assert (agreement.reference_pixels, agreement.test_pixels) == (81, 70)
    assert agreement.text_cosines == pytest.approx([np.sqrt(70 / 80), 0.0])
    assert agreement.cosine == pytest.approx(70 / np.sqrt(81 * 70))  # all pixels as one vector
    blank = np.full((1, 1, 10, 10), 1e-6)  # no text: its per-image cosine is noise and is not kept
    agreement.update(blank, blank * np.random.default_rng(0).random(blank.shape))
    assert len(agreement.text_cosines) == 2 and agreement.images == 3 and agreement.min_text_cosine == 0.0


def test_cosine_rows_per_image() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    test = np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert cosine_rows(ref, test) == pytest.approx([np.sqrt(0.5), 1.0, 0.0])


# --- CTC -------------------------------------------------------------------------------------------------


def one_hot(indices: list[int], classes: int = 6) -> np.ndarray:
    scores = np.full((len(indices), classes), 0.01)
    scores[np.arange(len(indices)), indices] = 0.9
    return scores


def test_ctc_greedy_merges_repeats_then_drops_the_blank() -> None:
    path = [0, 3, 3, 0, 3, 5, 5, 0]
    assert ctc_greedy(one_hot(path)) == [3, 3, 5]  # the blank between the 3s keeps them apart
    assert ctc_greedy(np.array(path)) == [3, 3, 5]  # class indices work as well as scores
    assert ctc_greedy(one_hot(path), blank=5) == [0, 3, 0, 3, 0]
    assert ctc_greedy(np.zeros((0, 6))) == []


def test_decode_batch_reads_both_layouts_alike() -> None:
    batch = np.stack([one_hot([1, 1, 0, 2]), one_hot([0, 4, 4, 4])])  # [N=2, T=4, C=6]
    assert decode_batch(batch, "ntc") == [[1, 2], [4]]
    assert decode_batch(np.swapaxes(batch, 0, 1), "tnc") == [[1, 2], [4]]
    with pytest.raises(ValueError, match="unknown CTC layout"):
        decode_batch(batch, "nct")


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [("kitten", "sitting", 3), ("", "abc", 3), ("abc", "", 3), ("flaw", "lawn", 2), ("same", "same", 0)],
)
def test_edit_distance_known_values(a: str, b: str, distance: int) -> None:
    assert edit_distance([ord(c) for c in a], [ord(c) for c in b]) == distance


def test_sequence_agreement_exact_rate_and_normalised_distance() -> None:
    agreement = SequenceAgreement()
    agreement.update([[1, 2, 3], [4, 5], []], [[1, 2, 3], [4, 6, 7], []])
    assert agreement.exact_rate == pytest.approx(2 / 3)
    assert normalized_edit_distance([4, 5], [4, 6, 7]) == pytest.approx(2 / 3)
    assert agreement.mean_distance == pytest.approx((0 + 2 / 3 + 0) / 3)
    assert agreement.empty_reference == 1
