"""`trtopt run` on a YOLO detector's plan prints each image's detections after NMS (`trtopt.cli.detections`), not the
head's value range. The model writes a fixed YOLOv8 head over a 64x64 input's stride 8 / 16 / 32 grid (84 anchor
points), so what the command decodes is known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from trtopt.cli.main import main

ANCHORS = 8 * 8 + 4 * 4 + 2 * 2


def yolov8_head() -> np.ndarray:
    """[1, 4 + 2 classes, 84]: one box of class 1 found twice (0.9 and 0.8: NMS keeps one) and one of class 0."""
    head = np.zeros((1, 6, ANCHORS), np.float32)
    head[0, :4, 0] = head[0, :4, 1] = [10, 12, 4, 6]  # cx, cy, w, h in input pixels
    head[0, 5, 0], head[0, 5, 1] = 0.9, 0.8
    head[0, :4, 2], head[0, 4, 2] = [40, 40, 10, 10], 0.5
    return head


def detector(path: Path) -> Path:
    """images [N, 3, 64, 64] -> output0 [N, 6, 84]: the fixed head, plus 0 x the image's mean (one per sample)."""
    nodes = [helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=1),
             helper.make_node("Reshape", ["mean", "shape"], ["per_sample"]),
             helper.make_node("Mul", ["per_sample", "zero"], ["nothing"]),
             helper.make_node("Add", ["head", "nothing"], ["output0"])]  # fmt: skip
    inits = [numpy_helper.from_array(yolov8_head(), "head"), numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
             numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "shape")]  # fmt: skip
    graph = helper.make_graph(nodes, "yolo", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                            ["N", 3, 64, 64])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 6, ANCHORS])],
                              inits)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_run_prints_a_yolo_plans_detections(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = detector(tmp_path / "yolo.onnx")
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(tmp_path / "a.png")
    assert main(["build", str(model), "-o", str(tmp_path / "p.engine"), "--backend", "cpu", "--json"]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "p.engine"), str(tmp_path / "a.png"), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["predictions"]
    found = [(d["class"], round(d["score"], 2), d["box"]) for d in row["detections"]]
    assert found == [(1, 0.9, [8.0, 9.0, 12.0, 15.0]), (0, 0.5, [35.0, 35.0, 45.0, 45.0])], "NMS kept one of two"
    assert main(["run", str(tmp_path / "p.engine"), str(tmp_path / "a.png")]) == 0
    text = capsys.readouterr().out
    assert "2 detections: class 1 0.90 [8, 9, 12, 15], class 0 0.50 [35, 35, 45, 45]" in text
    assert "yolov8 head" in text and "64x64 model input" in text


def test_a_yolo_plan_takes_one_label_per_class_and_the_exporters_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--labels was held to the head's last axis (a YOLOv8n: "2100 lines", for 80 classes); the class count of a
    YOLO head is its 4 + C axis. Without --labels, the names Ultralytics writes into the file are the plan's."""
    model = detector(tmp_path / "yolo.onnx")
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    assert main(["build", str(model), "-o", str(tmp_path / "p.engine"), "--backend", "cpu", "--labels",
                 str(tmp_path / "names.txt"), "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["run", str(tmp_path / "p.engine"), str(tmp_path / "a.png")]) == 0
    assert "2 detections: dog 0.90 [8, 9, 12, 15], cat 0.50" in capsys.readouterr().out

    proto = onnx.load(model)
    onnx.helper.set_model_props(proto, {"author": "Ultralytics", "task": "detect", "names": "{0: 'bird', 1: 'fish'}"})
    onnx.save(proto, tmp_path / "named.onnx")
    assert main(["build", str(tmp_path / "named.onnx"), "-o", str(tmp_path / "q.engine"), "--backend", "cpu",
                 "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["run", str(tmp_path / "q.engine"), str(tmp_path / "a.png")]) == 0
    assert "2 detections: fish 0.90 [8, 9, 12, 15], bird 0.50" in capsys.readouterr().out


def test_class_counts_of_a_yolo_head_a_classifier_and_a_sequence(tmp_path: Path) -> None:
    """A YOLO head's classes are its 4 + C axis; any other output's its last axis, also where another axis is
    dynamic (a CTC recogniser's [N, T, C]: its --labels are still held to C)."""
    from trtopt.build import _class_count
    from trtopt.frontend import graph_from_onnx

    assert _class_count(graph_from_onnx(onnx.load(detector(tmp_path / "yolo.onnx")))) == 2
    seq = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "ctc",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 37])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 37])])  # fmt: skip
    assert _class_count(graph_from_onnx(helper.make_model(seq, opset_imports=[helper.make_opsetid("", 17)]))) == 37
