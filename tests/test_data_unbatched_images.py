"""Image inputs without a batch axis, [3, H, W] (torchvision's detection models exported from a list of images):
each image is one sample, run in a call of its own, from images or from .npy arrays of [3, H, W] (one image) or
[N, 3, H, W] (N images); `Engine` takes one image, or a batch as a list of results.

    image [3, 32, 32] ─ Unsqueeze(0) ─ Conv 3→16 ─ Relu ─ Conv 16→16 /2 ─ Relu ─ Conv 16→16 1x1 ─ Squeeze(0) ─
    features [16, 16, 16]
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtopt.calib.auto import scoring_split
from trtopt.cli.main import main
from trtopt.data import InputInfo, PreprocessSpec, load_dataset, spec_for_input
from trtopt.data.arrays import has_batch_axis, samples_in
from trtopt.data.dataset import sample_batches
from trtopt.data.inputs import image_dims, unbatched_image
from trtopt.data.preprocess import preprocess_file
from trtopt.errors import DataError, ShapeError, TrtoptError
from trtopt.execution import OrtSession
from trtopt.zoo.builder import GraphBuilder

INFO = InputInfo("image", [3, 32, 32], np.float32)


def _model(*, empty: bool = False) -> onnx.ModelProto:
    """The model above; `empty`: also an output that is always empty, sliced from the second conv's input
    (as a detector's boxes when no box passed its score threshold)."""
    g = GraphBuilder("chw", seed=3)
    axes = g.const("axes", np.array([0], np.int64))
    x = g.node("Unsqueeze", [g.input("image", [3, 32, 32]), axes])
    x = g.relu(g.conv(x, 3, 16, 3))
    ends = [g.const(n, np.array([v], np.int64)) for n, v in (("start", 0), ("end", 0), ("axis", 1))]
    nothing = [g.node("Slice", [x, *ends], out="nothing")] if empty else []
    x = g.relu(g.conv(x, 16, 16, 3, stride=2))
    return g.build([g.node("Squeeze", [g.conv(x, 16, 16, 1), axes], out="features"), *nothing])


def _images(folder: Path, count: int) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir()
    for i in range(count):
        small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        Image.fromarray(small).resize((48, 40), Image.BILINEAR).save(folder / f"img{i:02d}.png")
    return sorted(folder.iterdir())


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_three_channel_rank_3_input_has_no_batch_axis() -> None:
    assert unbatched_image([3, 32, 32]) and unbatched_image([3, "height", "width"]) and unbatched_image((3, -1, 64))
    assert not has_batch_axis([INFO]) and not has_batch_axis([InputInfo("x", [3, None, None], np.float32)])
    # a grey [1, H, W] stays a batch of one (as a [1, T, F] spectrogram), a batch of 3 tiny rows stays a batch
    for shape in ([1, 32, 32], [3, 2, 64], [3, 32], [1, 3, 32, 32], ["N", 32, 32], [3, 32, 32, 3]):
        assert not unbatched_image(shape), shape
    assert has_batch_axis([InputInfo("x", [1, 80, 300], np.float32)])
    assert image_dims([3, 32, 48]) == [1, 3, 32, 48] and image_dims([1, 3, 32, 48]) == [1, 3, 32, 48]


def test_the_spec_for_an_unbatched_input_makes_chw_images() -> None:
    spec = spec_for_input(INFO.shape, INFO.dtype, name="image")
    assert (spec.layout, spec.crop_hw, spec.sample_shape) == ("NCHW", (32, 32), (3, 32, 32))
    with pytest.raises(ShapeError, match=re.escape("(shape [3, h, w])")) as info:
        spec_for_input([3, "h", "w"], np.float32, name="image")
    assert "--shapes image:3x224x224" in (info.value.fix or "")
    with pytest.raises(ShapeError, match=re.escape("or one image without a batch axis, [3, H, W]")):
        spec_for_input([1, 32, 32], np.float32, name="grey")


def test_each_image_and_each_array_is_one_sample(tmp_path: Path) -> None:
    files = _images(tmp_path / "images", 3)
    rng = np.random.default_rng(1)
    stack = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "stack.npy", stack)
    np.save(tmp_path / "one.npy", stack[0].astype(np.float64))  # float64: cast
    spec = spec_for_input(INFO.shape, INFO.dtype, name="image")
    images = load_dataset(tmp_path / "images", [INFO], spec)
    assert len(images) == 3 and images.fixed_batch == 1 and images.unit == "images"
    batches = list(images.batches(8))
    assert [b.feeds["image"].shape for b in batches] == [(3, 32, 32)] * 3
    assert all(b.rows is None and b.whole and b.feed_rows == 3 and len(b) == 1 for b in batches)
    np.testing.assert_array_equal(batches[1].feeds["image"], preprocess_file(files[1], spec))
    # calibration's (feeds, rows) pairs: all 3 leading rows are real (rows 1 cut each feed to its red channel)
    _, scored = scoring_split(images, 8)
    assert [(feeds["image"].shape, rows) for feeds, rows in scored] == [((3, 32, 32), 3)] * 3
    assert [rows for _, rows in sample_batches(images, 8, 2)] == [3, 3]
    arrays = list(load_dataset([str(tmp_path / "stack.npy"), str(tmp_path / "one.npy")], [INFO]).batches(2))
    assert len(arrays) == 5 and all(b.feeds["image"].shape == (3, 32, 32) for b in arrays)
    np.testing.assert_array_equal(arrays[2].feeds["image"], stack[2])
    np.testing.assert_array_equal(arrays[4].feeds["image"], stack[0])
    assert [Path(b.sources[0]).name for b in arrays] == [*(f"stack.npy[{i}]" for i in range(4)), "one.npy"]
    np.save(tmp_path / "hw.npy", stack[0, 0])
    with pytest.raises(DataError, match=re.escape("expects one feed [3, 32, 32] or a stack of feeds [N, 3, 32, 32]")):
        load_dataset(tmp_path / "hw.npy", [INFO])
    wrong = PreprocessSpec(crop=24)
    with pytest.raises(DataError, match=re.escape("input 'image' takes [3, 32, 32] (float32) per sample")):
        load_dataset(tmp_path / "images", [INFO], wrong)


def test_samples_in_counts_one_per_whole_feed() -> None:
    image = np.zeros((3, 32, 32), np.float32)
    assert samples_in({"image": image}, _model()) == 1
    model = _model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 5  # [5, 32, 32]: a batch of 5
    assert samples_in({"image": np.zeros((5, 32, 32), np.float32)}, model) == 5


def test_build_run_compare_and_engine_on_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import trtopt

    onnx.save(_model(), tmp_path / "chw.onnx")
    files = _images(tmp_path / "images", 12)
    plan = tmp_path / "chw.engine"
    argv = ["build", str(tmp_path / "chw.onnx"), "--int8", "--backend", "cpu", "--calib", str(tmp_path / "images")]
    assert main([*argv, "--min-channels", "1", "-o", str(plan), "--json"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["calibration"]["samples"] == 12 and summary["verification"]["samples"] == 12
    assert summary["int8_layers"] >= 2 and summary["preprocess"]["crop"] == [32, 32]
    assert "on 1 verification input(s)" in summary["graph_check"]["note"]  # one image, not a batch of 3
    assert summary["speed"] is None or summary["speed"]["batch"] == 1

    assert main(["run", str(plan), str(tmp_path / "images"), "--json"]) == 0
    predictions = json.loads(capsys.readouterr().out)["predictions"]
    assert [Path(p["input"]).name for p in predictions] == [f.name for f in files]
    assert all(p["described"]["shape"] == [16, 16, 16] for p in predictions)

    assert main(["compare", str(tmp_path / "chw.onnx"), str(plan), "--data", str(tmp_path / "images"), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert compared["samples"] == 12 and compared["outputs"][0]["cosine"] > 0.99
    assert compared["outputs"][0]["worst_sample"] is not None  # per-image cosines: each image is one sample

    reference = OrtSession(_model())
    with trtopt.Engine.load(plan) as engine:
        batch = engine.preprocess([str(f) for f in files[:3]])
        assert batch.shape == (3, 3, 32, 32)
        results = engine(batch)  # one call per image, a list of results
        assert isinstance(results, list) and [r.shape for r in results] == [(16, 16, 16)] * 3
        for image, result in zip(batch, results, strict=True):
            np.testing.assert_array_equal(result, engine(image))
            assert _cosine(result, reference.run({"image": image})["features"]) > 0.99
        with pytest.raises(ShapeError, match="one image per call, no batch axis") as info:
            engine.infer({"image": batch})
        assert "engine(images)" in (info.value.fix or "")


def test_build_from_npy_runs_one_call_per_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtopt.cli.bench_cmd import random_inputs

    onnx.save(_model(), tmp_path / "chw.onnx")
    rng = np.random.default_rng(2)
    np.save(tmp_path / "stack.npy", rng.uniform(-2, 2, (10, 3, 32, 32)).astype(np.float32))
    plan = tmp_path / "chw.engine"
    argv = ["build", str(tmp_path / "chw.onnx"), "--int8", "--backend", "cpu", "--calib", str(tmp_path / "stack.npy")]
    assert main([*argv, "-o", str(plan), "--json"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["calibration"]["samples"] == 10 and summary["verification"]["samples"] == 10
    assert main(["run", str(plan), str(tmp_path / "stack.npy"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["images"] == 10 and len(out["predictions"]) == 10
    np.save(tmp_path / "flat.npy", np.zeros((3, 32), np.float32))
    assert main(["run", str(plan), str(tmp_path / "flat.npy")]) != 0
    assert "expects one feed [3, 32, 32] or a stack of feeds [N, 3, 32, 32]" in capsys.readouterr().err

    from trtopt.auto_backend import _timed_batch
    from trtopt.plan import read_plan

    assert _timed_batch(read_plan(plan), 8) == 1  # `--backend auto` times one image per call, says batch 1
    specs = read_plan(plan).inputs
    assert random_inputs(specs, 1)["image"].shape == (3, 32, 32)
    with pytest.raises(TrtoptError, match=re.escape("one image without a batch axis ([3, 32, 32])")):
        random_inputs(specs, 4)


def test_an_empty_output_does_not_stop_auto_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Untrained Faster R-CNN's build stopped in auto calibration (reshape of an empty node output): a node whose
    output is empty scores no candidate; the tensor's other consumers still do."""
    onnx.save(_model(empty=True), tmp_path / "chw.onnx")
    np.save(tmp_path / "stack.npy", np.random.default_rng(3).uniform(-2, 2, (6, 3, 32, 32)).astype(np.float32))
    argv = ["build", str(tmp_path / "chw.onnx"), "--int8", "--backend", "cpu", "--calib", str(tmp_path / "stack.npy")]
    assert main([*argv, "--min-channels", "1", "-o", str(tmp_path / "chw.engine"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["calibration"]["method"] == "auto" and summary["int8_layers"] >= 2


def test_run_describes_an_empty_output_without_infinities() -> None:
    from trtopt.cli.run_cmd import _described

    described = _described("boxes", np.zeros((0, 4), np.float32))  # no box passed the score threshold
    assert described["text"] == "output 'boxes' [0x4]: empty"
    assert described["described"]["min"] is None and described["described"]["max"] is None
    json.dumps(described, allow_nan=False)
