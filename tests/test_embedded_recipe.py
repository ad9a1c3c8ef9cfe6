"""Preprocessing read from the exporter's metadata in the model file (`trtopt.data.embedded_recipe`): Ultralytics'
exports say their task and image size; a YOLO detector is fed letterboxed pixels / 255, not ImageNet's mean and
std. A sidecar, --preset and flags still come first, as the precedence tests of test_cli_preprocess say."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

from trtopt.cli.main import main
from trtopt.data.config import PreprocessConfig
from trtopt.data.embedded_recipe import embedded_recipe
from trtopt.data.overrides import PreprocessOverrides
from trtopt.data.samples import preprocess_source, preprocess_spec_for
from trtopt.frontend import graph_from_onnx
from trtopt.plan import read_plan
from trtopt.zoo.builder import GraphBuilder


def colour_model(path: Path, props: dict[str, str], shape: tuple[int | str, ...] = (1, 3, 64, 48)) -> Path:
    """A 3-channel image input averaged to one value per channel, with `props` as its metadata_props."""
    b = GraphBuilder("colour", seed=0)
    x = b.input("images", list(shape))
    model = b.build([b.node("GlobalAveragePool", [x], out="means")])
    onnx.helper.set_model_props(model, props)
    onnx.save(model, path)
    return path


def spec_of(path: Path, config: PreprocessConfig | None = None) -> dict:
    graph = graph_from_onnx(onnx.load(path))
    spec = preprocess_spec_for(path, graph, config or PreprocessConfig())
    assert spec is not None
    return vars(spec)


YOLO = {"author": "Ultralytics", "task": "detect", "imgsz": "[640, 640]", "stride": "32"}


def test_an_ultralytics_detector_is_letterboxed_and_divided_by_255(tmp_path: Path) -> None:
    spec = spec_of(colour_model(tmp_path / "yolo.onnx", YOLO))
    assert spec["resize_mode"] == "letterbox" and spec["pad_value"] == 114.0 and spec["pad_align"] == "center"
    assert (spec["scale"], spec["mean"], spec["std"], spec["color"]) == (255.0, (0.0,), (1.0,), "RGB")
    assert spec["crop"] == (64, 48), "the input's static height and width win over imgsz"
    assert "Ultralytics metadata (task detect" in preprocess_source(tmp_path / "yolo.onnx", PreprocessConfig())


def test_an_ultralytics_classifier_is_resized_and_centre_cropped(tmp_path: Path) -> None:
    path = colour_model(tmp_path / "cls.onnx", {**YOLO, "task": "classify", "imgsz": "[224, 224]"},
                        ("N", 3, "H", "W"))  # fmt: skip
    fields, where = embedded_recipe(path, ("N", 3, "H", "W")) or ({}, "")
    assert fields["resize_mode"] == "shorter" and fields["crop"] == [224, 224] and fields["resize"] == 224
    assert fields["mean"] == [0.0] and "task classify" in where


@pytest.mark.parametrize("props", [{}, {"author": "someone", "task": "detect", "imgsz": "640"},
                                   {**YOLO, "task": "regress"}])  # fmt: skip
def test_other_metadata_keeps_the_default_guess(tmp_path: Path, props: dict[str, str]) -> None:
    spec = spec_of(colour_model(tmp_path / "m.onnx", props))
    assert spec["resize_mode"] == "shorter" and spec["mean"] != (0.0,), "ImageNet's default"
    assert "a guess" in preprocess_source(tmp_path / "m.onnx", PreprocessConfig())


def test_an_unreadable_imgsz_on_a_dynamic_input_keeps_the_default(tmp_path: Path) -> None:
    path = colour_model(tmp_path / "m.onnx", {**YOLO, "imgsz": "not a size"}, ("N", 3, "H", "W"))
    assert embedded_recipe(path, ("N", 3, "H", "W")) is None
    fields, _ = embedded_recipe(colour_model(tmp_path / "n.onnx", {**YOLO, "imgsz": "320"}, ("N", 3, "H", "W")),
                                ("N", 3, "H", "W")) or ({}, "")  # fmt: skip
    assert fields["crop"] == [320, 320]


def test_sidecar_preset_and_flags_come_before_the_metadata(tmp_path: Path) -> None:
    path = colour_model(tmp_path / "yolo.onnx", YOLO)
    assert spec_of(path, PreprocessConfig(preset="imagenet"))["resize_mode"] == "shorter"
    flags = spec_of(path, PreprocessConfig(overrides=PreprocessOverrides(pad_value=0.0)))
    assert flags["pad_value"] == 0.0 and flags["resize_mode"] == "letterbox", "a flag goes over the metadata's recipe"
    (tmp_path / "yolo.json").write_text(json.dumps({"preprocess": {"crop": 64, "scale": 1.0}}))
    assert spec_of(path)["resize_mode"] == "shorter", "the sidecar replaces it"


def test_a_build_stores_the_metadata_recipe_in_the_plan(tmp_path: Path) -> None:
    path = colour_model(tmp_path / "yolo.onnx", YOLO)
    image = np.full((30, 60, 3), 200, np.uint8)  # wider than the 64x48 input is tall: padded top and bottom
    Image.fromarray(image).save(tmp_path / "wide.png")
    assert main(["build", str(path), "-o", str(tmp_path / "p.engine"), "--backend", "cpu"]) == 0
    preprocess = read_plan(tmp_path / "p.engine").metadata.preprocess
    assert preprocess["resize_mode"] == "letterbox" and preprocess["scale"] == 255.0
    assert main(["run", str(tmp_path / "p.engine"), str(tmp_path / "wide.png"), "--json"]) == 0


NAMES = [("{0: 'person', 1: 'bicycle'}", ["person", "bicycle"]), ("{1: 'a', 2: 'b'}", None), ("not a dict", None),
         ("", None), ("{0: 'a', 'x': 'b'}", None), ("{[]: 'a'}", None)]


@pytest.mark.parametrize(("names", "expected"), NAMES)
def test_ultralytics_names_become_labels_in_index_order(tmp_path: Path, names: str, expected: list | None) -> None:
    from trtopt.data.embedded_recipe import embedded_labels

    assert embedded_labels(colour_model(tmp_path / "m.onnx", {**YOLO, "names": names})) == expected
    assert embedded_labels(colour_model(tmp_path / "n.onnx", {"names": "{0: 'x'}"})) is None, "not Ultralytics"
