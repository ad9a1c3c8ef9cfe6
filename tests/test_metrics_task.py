"""YOLO decoding round trips (boxes encoded by hand into each layout decode back), the task chooser's rule on
output shapes seen in real models, and the user decoder hook."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtopt.errors import TrtoptError
from trtopt.metrics import DecodeConfig, TaskConfig, TaskEvaluator, choose_task, decode
from trtopt.metrics.hook import load_decoder
from trtopt.metrics.yolo import grid_cells, is_raw_yolox, yolo_grid_match

HW = (64, 96)  # input height, width: strides 8/16/32 give 8x12 + 4x6 + 2x3 = 126 anchor points
ANCHORS = grid_cells(*HW, (8, 16, 32))
# Two objects (centre x, centre y, w, h in pixels; class; score) and a weaker near-duplicate of the first.
OBJECTS = [((20.0, 12.0, 16.0, 8.0), 2, 0.9), ((70.0, 40.0, 24.0, 30.0), 0, 0.8), ((21.0, 12.0, 16.0, 8.0), 2, 0.6)]
EXPECTED_XYXY = [[12.0, 8.0, 28.0, 16.0], [58.0, 25.0, 82.0, 55.0]]


def yolov8_output(classes: int = 3, seed: int = 0) -> np.ndarray:
    """[1, 4 + C, A]: background anchors score below the threshold; three anchors carry the objects."""
    rng = np.random.default_rng(seed)
    out = np.concatenate([rng.uniform(0, 60, (4, ANCHORS)), rng.uniform(0, 0.2, (classes, ANCHORS))])
    for anchor, (box, cls, score) in zip((5, 60, 100), OBJECTS, strict=True):
        out[:4, anchor] = box
        out[4 + cls, anchor] = score
    return out[None].astype(np.float32)


def test_yolov8_decoding_round_trip_with_threshold_and_nms() -> None:
    (found,) = decode(yolov8_output(), "yolov8", HW, DecodeConfig(score_threshold=0.25, nms_iou=0.45))
    assert found.boxes == pytest.approx(np.array(EXPECTED_XYXY))  # the near-duplicate lost to NMS
    assert found.classes.tolist() == [2, 0] and found.scores == pytest.approx([0.9, 0.8])
    (loose,) = decode(yolov8_output(), "yolov8", HW, DecodeConfig(score_threshold=0.25, nms_iou=0.95))
    assert len(loose) == 3
    (strict,) = decode(yolov8_output(), "yolov8", HW, DecodeConfig(score_threshold=0.85))
    assert strict.classes.tolist() == [2]


def test_yolov5_decoding_multiplies_objectness_and_class_probability() -> None:
    anchors = 3 * ANCHORS  # three anchors per cell
    out = np.zeros((1, anchors, 5 + 3), np.float32)
    out[0, :, :4] = 30.0
    out[0, :, 4] = 0.1
    (obj, box), cls = (0.9, EXPECTED_XYXY[0]), 1
    out[0, 7, :4] = (20.0, 12.0, 16.0, 8.0)
    out[0, 7, 4], out[0, 7, 5 + cls] = obj, 0.5  # score 0.45
    out[0, 8, 4], out[0, 8, 5 + cls] = 0.3, 0.9  # score 0.27
    (found,) = decode(out, "yolov5", HW, DecodeConfig(score_threshold=0.3))
    assert len(found) == 1 and found.boxes[0] == pytest.approx(box) and found.scores[0] == pytest.approx(0.45)


def yolox_raw_output(seed: int = 1) -> np.ndarray:
    """[1, A, 5 + C] before grid decoding: each object written into its cell as (offset, log size / stride)."""
    rng = np.random.default_rng(seed)
    out = np.concatenate([rng.normal(0, 1, (ANCHORS, 4)), np.full((ANCHORS, 4), 0.05)], axis=1)
    first16 = (HW[0] // 8) * (HW[1] // 8)  # stride-16 cells start after the stride-8 ones
    for (box, cls, score), stride in zip(OBJECTS[:2], (8, 16), strict=True):
        cx, cy, w, h = box
        gx, gy = int(cx // stride), int(cy // stride)
        index = (0 if stride == 8 else first16) + gy * (HW[1] // stride) + gx  # row-major within a stride
        out[index, :4] = (cx / stride - gx, cy / stride - gy, np.log(w / stride), np.log(h / stride))
        out[index, 4], out[index, 5 + cls] = 1.0, score
    return out[None].astype(np.float32)


def test_yolox_grid_decoding_round_trip() -> None:
    raw = yolox_raw_output()
    assert is_raw_yolox(raw[0], HW)
    (found,) = decode(raw, "yolox", HW)
    assert found.boxes == pytest.approx(np.array(EXPECTED_XYXY), abs=1e-4)
    assert found.classes.tolist() == [2, 0]
    with pytest.raises(ValueError, match="anchors"):
        decode(raw[:, :-1], "yolox", HW)


def test_grid_match_knows_anchor_free_and_anchor_based_heads() -> None:
    assert yolo_grid_match(8400, 640, 640) == ((8, 16, 32), 1)  # YOLOv8n at 640
    assert yolo_grid_match(25200, 640, 640) == ((8, 16, 32), 3)  # YOLOv5s at 640
    assert yolo_grid_match(3549, 416, 416) == ((8, 16, 32), 1)  # a YOLOX at 416
    assert yolo_grid_match(6625, 48, 320) is None  # PP-OCR's 6625-character CTC head


# --- choosing the task -------------------------------------------------------------------------------


def choose(outputs: dict[str, np.ndarray], hw: tuple[int, int] | None, batch: int = 2, **kw: object) -> tuple:
    choice = choose_task(outputs, hw, TaskConfig(**kw), batch)  # type: ignore[arg-type]
    return choice.task, choice.output, choice.variant


def test_a_classifier_is_read_from_its_probabilities_not_an_earlier_box_output() -> None:
    """MTCNN's ONet (round 13's hunt): [N, 4] box offsets, [N, 10] landmarks, then [N, 2] face probabilities; the
    first [N, C] output was taken for the classifier's."""
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((8, 2))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    outputs = {"boxes": rng.standard_normal((8, 4)), "marks": rng.standard_normal((8, 10)), "probs": probs}
    assert choose(outputs, (48, 48), 8) == ("classify", "probs", "")
    assert choose({"boxes": outputs["boxes"], "logits": logits}, (48, 48), 8)[1] == "boxes"  # nothing tells: the first


def test_auto_reads_real_models_output_shapes() -> None:
    rng = np.random.default_rng(0)
    assert choose({"o": yolov8_output()}, HW, 1) == ("detect", "o", "yolov8")
    assert choose({"o": yolox_raw_output()}, HW, 1) == ("detect", "o", "yolox")
    decoded = yolox_raw_output()
    decoded[..., 2:4] = np.abs(decoded[..., 2:4])  # sizes all positive: already decoded
    assert choose({"o": decoded}, HW, 1) == ("detect", "o", "yolov5")
    # PP-OCRv4 recognizer: [N, 40, 6625] softmax on a 48x320 crop is a CTC head, not a YOLOv8 one
    assert choose({"o": rng.random((2, 40, 6625))}, (48, 320)) == ("ctc", "o", "ntc")
    # ddddocr's recognizer writes [T, N, C] with N = 1
    assert choose({"o": rng.random((20, 1, 50))}, (64, 160), 1) == ("ctc", "o", "tnc")
    # PP-PicoDet (a layout detector, 800x608): 9,500 anchor points x 10 classes, off the YOLO grids. Not a
    # text line (more "time steps" than input columns): per-output numbers only, unless asked for CTC
    picodet = {"scores": rng.random((1, 9500, 10)), "boxes": rng.normal(size=(1, 9500, 32)),
               "scores_s32": rng.random((1, 475, 10))}  # stride 32: fewer anchors than input columns
    assert choose({"o": rng.random((2, 40, 97))}, (320, 320))[0] == "raw"  # a square input is not a text line
    assert choose(picodet, (800, 608), 1)[0] == "raw"
    assert choose(picodet, (800, 608), 1, task="ctc")[0] == "ctc"
    assert choose({"map": rng.random((2, 1, 64, 96))}, HW) == ("text-detect", "map", "")
    assert choose({"logits": rng.normal(size=(2, 10))}, HW) == ("classify", "logits", "")
    assert choose({"feat": rng.normal(size=(2, 1, 64, 96))}, HW)[0] == "raw"  # not a probability map
    assert choose({"emb": rng.normal(size=(2, 5, 4, 4, 4))}, HW)[0] == "raw"
    # a segmenter ending in its own ArgMax: class ids per pixel, whatever axes come first (wired-table-rec's
    # line segmenter writes [1, N, H, W]); ids 0/1 only would pass as a [0, 1] map: the integer type decides
    assert choose({"ids": rng.integers(0, 3, (1, 2, 64, 96))}, HW) == ("segment", "ids", "")
    assert choose({"ids": rng.integers(0, 2, (2, 1, 64, 96))}, HW) == ("segment", "ids", "")
    assert choose({"ids": rng.integers(0, 3, (2, 8, 8))}, HW)[0] == "raw"  # an eighth of the input: no map
    assert choose({"count": rng.integers(0, 5, (2, 64, 96)) + 1000}, HW)[0] == "raw"  # 1000+: not class ids


def test_a_detector_head_wins_over_other_outputs_and_task_output_picks_one() -> None:
    outs = {"logits": np.zeros((1, 5)), "boxes": yolov8_output()}
    assert choose(outs, HW, 1) == ("detect", "boxes", "yolov8")
    assert choose(outs, HW, 1, task="classify") == ("classify", "logits", "")
    assert choose(outs, HW, 1, output="logits") == ("classify", "logits", "")


def test_forced_task_without_a_fitting_output_is_a_user_error() -> None:
    with pytest.raises(TrtoptError, match="no output of the model looks like one"):
        choose_task({"logits": np.zeros((2, 10))}, HW, TaskConfig(task="detect"), 2)
    with pytest.raises(TrtoptError, match="is not an output"):
        choose_task({"logits": np.zeros((2, 10))}, HW, TaskConfig(output="nope"), 2)
    with pytest.raises(TrtoptError, match="is not a task"):
        choose_task({"logits": np.zeros((2, 10))}, HW, TaskConfig(task="pose"), 2)


def test_evaluator_compares_decoded_boxes_of_both_sides() -> None:
    ref = yolov8_output()
    test = ref.copy()
    test[0, 4 + 2, 5] = 0.1  # the plan lost the first object's score
    config = TaskConfig()
    evaluator = TaskEvaluator(choose_task({"o": ref}, HW, config, 1), config, HW)
    evaluator.update({"o": ref}, {"o": test})
    m = evaluator.to_dict()["metrics"]
    # FP32: the two objects (the duplicate is suppressed). Plan: its duplicate survives instead of the first
    # object (IoU 0.88 with it), so it still matches; the second object matches too.
    assert (m["reference_boxes"], m["test_boxes"], m["matched"]) == (2, 2, 2)  # type: ignore[index]
    test[0, 4 + 2, 100] = 0.1  # now the duplicate is gone as well
    evaluator.update({"o": ref}, {"o": test})
    assert evaluator.boxes.matched == 3 and evaluator.boxes.reference_boxes == 4 and evaluator.boxes.test_boxes == 3
    assert evaluator.headline() == ("box F1", pytest.approx(6 / 7))


def test_detections_the_model_decodes_itself_are_matched_as_they_are() -> None:
    """torchvision's detection exports: boxes [K, 4], scores [K], labels [K] (int64) of one image, K data-dependent.
    Matched above the score threshold; a plan that loses one box and finds another has F1 1/2."""
    ref = {"boxes": np.array([[12, 8, 28, 16], [58, 25, 82, 55], [0, 0, 5, 5]], np.float32),
           "scores": np.array([0.9, 0.8, 0.1], np.float32), "labels": np.array([2, 0, 1], np.int64)}
    test = {"boxes": np.array([[12.5, 8, 28, 16], [40, 40, 50, 50]], np.float32),
            "scores": np.array([0.85, 0.3], np.float32), "labels": np.array([2, 1], np.int64)}
    config = TaskConfig()
    choice = choose_task(ref, (64, 96), config, 1)
    assert (choice.task, choice.output, choice.variant, choice.others) == ("detect", "boxes", "decoded",
                                                                           ("scores", "labels"))
    evaluator = TaskEvaluator(choice, config, (64, 96))
    evaluator.update(ref, test)
    assert (evaluator.boxes.reference_boxes, evaluator.boxes.test_boxes, evaluator.boxes.matched) == (2, 2, 1)
    assert evaluator.headline() == ("box F1", pytest.approx(0.5))
    batched = {name: value[None] for name, value in ref.items()}  # a leading batch axis of one
    assert choose_task(batched, None, config, 1).variant == "decoded"
    no_labels = {"boxes": ref["boxes"], "scores": ref["scores"]}  # boxes and scores alone are not enough to match
    assert choose_task(no_labels, (64, 96), config, 1).task != "detect"
    # Lengths that matched on the first batch by chance (K = 2 beside a count of 2, say) and differ later: one
    # clear error, not a traceback.
    with pytest.raises(TrtoptError, match="as one image's detections"):
        evaluator.update(ref, {**test, "labels": np.array([2, 1, 0], np.int64)})


# --- the user's decoder -------------------------------------------------------------------------------


def write_decoder(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_decoder.py"
    path.write_text("import numpy as np\n\n" + body)
    return f"{path}:decode"


def test_user_decoder_feeds_box_matching(tmp_path: Path) -> None:
    spec = write_decoder(
        tmp_path,
        "def decode(outputs):\n"
        "    rows = outputs['boxes']  # [N, K, 6]: x1 y1 x2 y2 score class\n"
        "    return [(r[:, :4], r[:, 4], r[:, 5].astype(int)) for r in rows]\n",
    )
    decoder, name = load_decoder(spec)
    assert name == "my_decoder.py:decode"
    ref = np.array([[[0, 0, 10, 10, 0.9, 1], [20, 20, 30, 30, 0.8, 2]]], np.float32)
    test = ref.copy()
    test[0, 1, 5] = 3  # the second box changes class
    config = TaskConfig(decoder=decoder, decoder_name=name)
    evaluator = TaskEvaluator(choose_task({"boxes": ref}, None, config, 1), config, None)
    evaluator.update({"boxes": ref}, {"boxes": test})
    assert evaluator.choice.task == "detect" and evaluator.choice.variant == "decoder"
    assert (evaluator.boxes.matched, evaluator.boxes.recall) == (1, 0.5)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def decode(outputs):\n    return []\n", "returned 0 images for a batch of 1"),
        ("def decode(outputs):\n    raise KeyError('scores')\n", "failed: KeyError"),
        ("def decode(outputs):\n    return [([[0, 0, 1, 1]], [1, 2], [0])]\n", "differ in length"),
    ],
)
def test_a_failing_decoder_is_one_clear_error(tmp_path: Path, body: str, message: str) -> None:
    decoder, name = load_decoder(write_decoder(tmp_path, body))
    config = TaskConfig(decoder=decoder, decoder_name=name)
    evaluator = TaskEvaluator(choose_task({"o": np.zeros((1, 3))}, None, config, 1), config, None)
    with pytest.raises(TrtoptError, match=message):
        evaluator.update({"o": np.zeros((1, 3))}, {"o": np.zeros((1, 3))})


def test_decoder_spec_errors(tmp_path: Path) -> None:
    good = write_decoder(tmp_path, "def decode(outputs):\n    return []\n")
    with pytest.raises(TrtoptError, match="names no function"):
        load_decoder(good.rsplit(":", 1)[0])
    with pytest.raises(TrtoptError, match="no such file"):
        load_decoder(str(tmp_path / "missing.py") + ":decode")
    with pytest.raises(TrtoptError, match="has no function 'other'"):
        load_decoder(good.rsplit(":", 1)[0] + ":other")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(TrtoptError, match="importing .* failed: ModuleNotFoundError"):
        load_decoder(f"{broken}:decode")


def test_without_an_image_input_ctc_is_asked_for_not_guessed() -> None:
    """Per-step probabilities are no sign of CTC without a text-line image: a masked language model's softmax over
    its vocabulary (g2p-id) and an EEG model's per-frame states (brainmaze, [T, N, 4]) were decoded as CTC."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 50, 30))
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    # LORE's lore_process.onnx: [1, cells, 4] logical row/column coordinates from array inputs, not classes
    assert choose({"logic_axis": rng.uniform(0, 24, size=(1, 64, 4))}, None, 1)[0] == "raw"
    assert choose({"o": probs}, None)[0] == "raw"  # a speech recogniser's softmax, or a language model's
    assert choose({"o": np.log(probs)}, None)[0] == "raw"  # or log-softmax
    assert choose({"o": probs.transpose(1, 0, 2)}, None)[0] == "raw"  # per-frame states, time-major
    assert choose({"o": probs}, None, task="ctc") == ("ctc", "o", "ntc")  # asked for
    assert choose({"o": logits}, None, task="ctc") == ("ctc", "o", "ntc")


def test_label_maps_are_compared_class_by_class() -> None:
    from trtopt.metrics.labels import LabelAgreement

    reference = np.zeros((2, 4, 5), np.int64)  # class 0 background; class 1 in image 0, class 2 in image 1
    reference[0, 1, :] = 1
    reference[1, :, 2] = 2
    test = reference.copy()
    test[0, 1, 4] = 0  # one of class 1's five pixels lost
    test[1, 0, 0] = 2  # one background pixel taken by class 2
    found = LabelAgreement()
    found.update(reference[:1], test[:1])
    found.update(reference[1:], test[1:])
    assert found.images == 2 and found.background == 0
    assert found.class_iou() == {0: pytest.approx(30 / 32), 1: pytest.approx(4 / 5), 2: pytest.approx(4 / 5)}
    assert found.mean_iou == pytest.approx(0.8) and found.agreement == pytest.approx(38 / 40)
    assert found.to_dict()["reference_pixels"] == {"0": 31, "1": 5, "2": 4}
    same = LabelAgreement()
    same.update(np.zeros((1, 4, 4), np.int64), np.zeros((1, 4, 4), np.int64))
    assert same.mean_iou == 1.0 and same.agreement == 1.0  # all background on both sides
    evaluator = TaskEvaluator(choose_task({"ids": reference}, (4, 5), TaskConfig(), 2), TaskConfig(), (4, 5))
    evaluator.update({"ids": reference}, {"ids": test})
    assert evaluator.headline() == ("mean IoU", pytest.approx(0.8))
    assert evaluator.to_dict()["metrics"]["class_iou"]["1"] == pytest.approx(0.8)


def test_class_score_maps_are_segmenters_compared_by_their_argmax() -> None:
    """torchvision's segmentation exports (FCN, DeepLabV3, LR-ASPP) end in [N, 21, H, W] float scores at the
    input's size, no ArgMax: auto reads them as a segmenter from 5 classes at the input's size; --task segment
    from 2 classes at a quarter of it. An image-to-image output ([N, 3, H, W]) or a backbone's features (a
    fraction of the input's size) stay raw unless asked for."""
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(2, 21, 64, 96)).astype(np.float32)
    assert choose({"out": scores}, HW) == ("segment", "out", "scores")
    assert choose({"img": rng.normal(size=(2, 3, 64, 96)).astype(np.float32)}, HW)[0] == "raw"
    assert choose({"feat": rng.normal(size=(2, 64, 16, 24)).astype(np.float32)}, HW)[0] == "raw"
    assert choose({"two": rng.normal(size=(2, 2, 16, 24)).astype(np.float32)}, HW, task="segment") == (
        "segment", "two", "scores")  # fmt: skip
    with pytest.raises(TrtoptError, match="no output of the model looks like one"):
        choose_task({"tiny": np.zeros((2, 21, 8, 8), np.float32)}, HW, TaskConfig(task="segment"), 2)
    from trtopt.metrics.labels import LabelAgreement

    scores[0, 20, 0, 0] = -10.0  # FP32 labels the first pixel of image 0 anything but class 20
    test = scores.copy()
    test[0, 20, 0, 0] = 10.0  # the plan labels it class 20
    labels = scores.argmax(axis=1)
    expected = LabelAgreement()
    expected.update(labels, test.argmax(axis=1))
    evaluator = TaskEvaluator(choose_task({"out": scores}, HW, TaskConfig(), 2), TaskConfig(), HW)
    evaluator.update({"out": scores}, {"out": test})
    assert evaluator.to_dict()["metrics"]["pixel_agreement"] == pytest.approx(1 - 1 / labels.size)
    assert evaluator.headline() == ("mean IoU", pytest.approx(expected.mean_iou))
    assert evaluator.headline()[1] < 1.0
