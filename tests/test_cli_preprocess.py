"""The preprocessing flags (--resize --crop --scale --mean --std --color --layout --interpolation) on
build / calibrate / run / compare: stored in the plan, applied by `run`, validated with errors that name
the flag, and layered flag > sidecar > preset.

The model is a grey 28x28 input flattened to its 784 pixels, so what the plan feeds it is what comes out:

    input [1, 1, 28, 28] ─ Flatten ─ pixels [1, 784]
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

from trtopt.cli import preprocess_args
from trtopt.cli.datasets import dataset_for_plan
from trtopt.cli.main import main
from trtopt.data import preprocess as preprocess_module
from trtopt.plan import read_plan
from trtopt.zoo.builder import GraphBuilder

MNIST_FLAGS = ["--resize", "28", "--crop", "28", "--scale", "255", "--mean", "0", "--std", "1"]


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    b = GraphBuilder("grey28", seed=0)
    x = b.input("input", [1, 1, 28, 28])
    onnx.save(b.build([b.node("Flatten", [x], out="pixels", axis=1)]), tmp_path / "grey.onnx")
    pixels = np.random.default_rng(0).integers(0, 256, (28, 40), dtype=np.uint8)  # wider than tall
    Image.fromarray(pixels, "L").save(tmp_path / "wide.png")
    return tmp_path


def build(work: Path, *flags: str, plan: str = "grey.engine") -> Path:
    assert main(["build", str(work / "grey.onnx"), "--backend", "cpu", "-o", str(work / plan), "--json", *flags]) == 0
    return work / plan


def stored(plan: Path) -> dict:
    spec = read_plan(plan).preprocess
    assert spec is not None
    return spec


def wide_pixels(work: Path) -> np.ndarray:
    return np.asarray(Image.open(work / "wide.png"), dtype=np.float64)


def test_mnist_recipe_is_stored_and_run_applies_it(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = build(work, *MNIST_FLAGS)
    capsys.readouterr()
    assert stored(plan) == {
        "crop": [28, 28], "resize": 28, "interpolation": "bilinear", "color": "L", "scale": 255.0,
        "mean": [0.0], "std": [1.0], "layout": "NCHW", "dtype": "float32",
    }  # fmt: skip
    # By hand: the 40x28 image keeps its size (shorter side already 28); the centre crop takes columns 6..33.
    expected = (wide_pixels(work)[:, 6:34] / 255.0).astype(np.float32)
    feeds = next(dataset_for_plan(read_plan(plan), [str(work / "wide.png")]).batches(1)).feeds
    np.testing.assert_array_equal(feeds["input"][0, 0], expected)
    # `run` feeds the same tensor: its top-5 "classes" are the 5 brightest pixels, with their softmax.
    assert main(["run", str(plan), str(work / "wide.png"), "--json", "--top", "5"]) == 0
    top = json.loads(capsys.readouterr().out)["predictions"][0]["top"]
    flat = expected.ravel().astype(np.float64)
    softmax = np.exp(flat - flat.max()) / np.exp(flat - flat.max()).sum()
    assert [p["probability"] for p in top] == pytest.approx(np.sort(softmax)[::-1][:5].tolist(), rel=1e-5)


def test_run_flags_override_the_plans_spec(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = build(work, *MNIST_FLAGS)
    overrides = preprocess_args.overrides_from_args(_parse("run", str(plan), "x.png", "--mean", "0.5", "--std", "0.25"))
    feeds = next(dataset_for_plan(read_plan(plan), [str(work / "wide.png")], overrides=overrides).batches(1)).feeds
    expected = ((wide_pixels(work)[:, 6:34] / 255.0 - 0.5) / 0.25).astype(np.float32)
    np.testing.assert_allclose(feeds["input"][0, 0], expected, rtol=1e-6)
    assert main(["run", str(plan), str(work / "wide.png"), "--std", "0", "--json"]) == 2
    assert "--std [0.0] is not accepted" in capsys.readouterr().err


def test_a_grey_model_builds_without_flags_and_the_grey_error_is_true(
    work: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """ImageNet's per-channel mean cannot feed a grey input. An FP32 build without data needs no recipe: it
    stores none and says so; `run` on an image then asks for a grey mean and std, and its advice is a real
    command line, on `run` and on `build`."""
    plan = build(work)
    assert read_plan(plan).preprocess is None
    assert "the plan stores none" in caplog.text
    capsys.readouterr()
    assert main(["run", str(plan), str(work / "wide.png")]) == 2
    err = capsys.readouterr().err
    assert "(e.g. --mean 0.5 --std 0.5)" in err
    advised = re.search(r"e\.g\. (--mean [\d.]+ --std [\d.]+)", err)
    assert advised is not None
    assert main(["run", str(plan), str(work / "wide.png"), "--crop", "28", "--resize", "28",
                 *advised.group(1).split(), "--json"]) == 0  # fmt: skip
    spec = stored(build(work, *advised.group(1).split()))
    assert (spec["resize"], spec["mean"], spec["std"], spec["scale"]) == (None, [0.5], [0.5], 255.0)


def test_precedence_flag_over_sidecar_over_preset(work: Path) -> None:
    sidecar = {"preprocess": {"crop": 28, "resize": 30, "color": "L", "scale": 1.0, "mean": [127.0], "std": [64.0],
                              "interpolation": "bicubic"}}  # fmt: skip
    (work / "grey.json").write_text(json.dumps(sidecar))
    spec = stored(build(work, "--std", "128", "--interpolation", "NEAREST"))
    assert (spec["resize"], spec["scale"], spec["mean"]) == (30, 1.0, [127.0]), "sidecar over the preset"
    assert (spec["std"], spec["interpolation"]) == ([128.0], "nearest"), "flags over the sidecar"
    spec = stored(build(work, "--preset", "tf", "--resize", "28"))
    assert (spec["scale"], spec["mean"], spec["std"], spec["resize"]) == (255.0, [0.5], [0.5], 28), (
        "an explicit --preset replaces the sidecar; flags still go over it"
    )


def test_calibrate_takes_the_flags(work: Path) -> None:
    """input [1, 1, 28, 28] ─ Conv 1x1 (16) ─ Relu: the input's max threshold is the largest fed pixel."""
    b = GraphBuilder("grey_conv", seed=0)
    onnx.save(b.build([b.relu(b.conv(b.input("input", [1, 1, 28, 28]), 1, 16, 1))]), work / "conv.onnx")
    images = work / "images"
    images.mkdir()
    for i in range(3):
        Image.fromarray(np.full((28, 28), 60 * i, np.uint8), "L").save(images / f"{i}.png")
    cache = work / "cache.json"
    argv = ["calibrate", str(work / "conv.onnx"), "--calib", str(images), "--method", "max", "-o", str(cache)]
    assert main([*argv, "--json", *MNIST_FLAGS]) == 0
    assert json.loads(cache.read_text())["thresholds"]["input"] == pytest.approx(120 / 255, rel=1e-6)


def test_arrays_feed_a_grey_model_as_they_are(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """input [1, 1, 28, 28] ─ Conv 3x3 (16) ─ Relu ─ Conv 3x3 (16): ready-made .npy / .npz inputs need no
    preprocessing, so ImageNet's RGB mean (the default) is neither applied nor refused; images still are."""
    b = GraphBuilder("grey_convs", seed=0)
    y = b.conv(b.relu(b.conv(b.input("input", [1, 1, 28, 28]), 1, 16, 3)), 16, 16, 3)
    onnx.save(b.build([y]), work / "convs.onnx")
    arrays = np.random.default_rng(0).random((12, 1, 28, 28)).astype(np.float32)
    np.save(work / "x.npy", arrays)
    np.savez(work / "x.npz", input=arrays)
    for data in ("x.npy", "x.npz"):
        plan = work / f"{data}.engine"
        argv = ["build", str(work / "convs.onnx"), "--int8", "--calib", str(work / data), "-o", str(plan)]
        assert main([*argv, "--backend", "cpu", "--json"]) == 0, capsys.readouterr().err
        summary = json.loads(capsys.readouterr().out)
        assert summary["int8_layers"] >= 1 and summary["verification"]["reference_vs_fp32"]["cosine"] > 0.99
        assert read_plan(plan).preprocess is None  # nothing stored that images would need
    assert main(["run", str(plan), str(work / "x.npy"), "--json"]) == 0
    capsys.readouterr()
    assert main(["run", str(plan), str(work / "x.npy")]) == 0
    assert "12 samples on cpu" in capsys.readouterr().err  # arrays are samples, not images
    assert main(["compare", str(work / "convs.onnx"), str(plan), "--data", str(work / "x.npz"), "--json"]) == 0
    capsys.readouterr()
    cache = work / "cache.json"
    assert main(["calibrate", str(work / "convs.onnx"), "--calib", str(work / "x.npy"), "-o", str(cache)]) == 0
    assert json.loads(cache.read_text())["thresholds"]["input"] == pytest.approx(float(arrays.max()), rel=0.05)
    capsys.readouterr()
    assert main(["build", str(work / "convs.onnx"), "--int8", "--calib", str(work / "wide.png"), "-o",
                 str(work / "img.engine")]) == 2  # fmt: skip
    assert "1 (grey) channel" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--std", "0"], r"--std \[0\.0\] is not accepted: it takes positive numbers"),
        (["--std", "1", "-1"], r"--std \[1\.0, -1\.0\] is not accepted"),
        (["--mean", "nan"], r"--mean \[nan\] is not accepted: it takes finite numbers"),
        (["--scale", "0"], r"--scale 0\.0 is not accepted: it takes a positive number"),
        (["--resize", "-5"], r"--resize -5 is not accepted"),
        (["--crop", "2x"], r"--crop '2x' is not accepted: it takes a positive size in pixels, N \(a square\) or HxW"),
        (["--mean", "1", "2", "--std", "1"], r"--mean has 2 values .*input 'input' has 1 \(grey\) channel; --mean "
         r"takes 1 value"),
        (["--crop", "24", "--mean", "0", "--std", "1"], r"--crop 24 does not fit input 'input', which takes 28x28"),
        (["--resize", "20", "--crop", "28"], r"--resize 20 is smaller than --crop 28"),
        (["--resize", "20", "--mean", "0", "--std", "1"], r"--resize 20 is smaller than the crop 28"),
        (["--color", "RGB"], r"--color RGB asks for 3 channels, but input 'input' has 1"),
        (["--layout", "NHWC", "--mean", "0", "--std", "1"], r"Layout NHWC puts the channels .*Check --layout"),
        (["--preset", "mnist"], r"Unknown preprocessing preset 'mnist'.*Valid preprocessing presets: caffe"),
    ],
)
def test_bad_values_are_one_paragraph_naming_the_flag(
    work: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["build", str(work / "grey.onnx"), "-o", str(work / "x.engine"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "\nfix: " in err and "Traceback" not in err
    assert re.search(message, err.replace("\n", " ")), err
    assert not (work / "x.engine").exists()


@pytest.mark.parametrize("flag", ["--color", "--layout", "--interpolation"])
def test_unknown_names_are_refused_by_argparse_with_the_choices(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["build", "m.onnx", "-o", "p.engine", flag, "sepia"])
    assert info.value.code == 2
    assert f"argument {flag}: invalid choice" in capsys.readouterr().err


def test_flag_choices_match_the_spec() -> None:
    parser = _parser("build")
    choices = {a.dest: tuple(a.choices) for a in parser._actions if a.choices}
    assert set(choices["color"]) == set(preprocess_module.COLORS)
    assert set(choices["layout"]) == set(preprocess_module.LAYOUTS)
    assert set(choices["interpolation"]) == set(preprocess_module.INTERPOLATIONS)
    presets = {p.strip() for p in preprocess_args.PRESET_NAMES.split(",")}
    assert presets == set(preprocess_module.PRESETS.names())


@pytest.mark.parametrize("command", ["build", "calibrate", "run", "compare"])
def test_every_image_command_has_the_flags_with_teaching_help(command: str) -> None:
    text = _parser(command).format_help()
    for flag in ("--resize", "--crop", "--interpolation", "--color", "--scale", "--mean", "--std", "--layout"):
        assert flag in text, (command, flag)
    assert "default:" in text.lower() and "one per channel" in text
    assert ("--preset" in text) == (command in ("build", "calibrate"))


def _parser(command: str):  # type: ignore[no-untyped-def]
    from trtopt.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command]  # type: ignore[attr-defined]


def _parse(command: str, *argv: str):  # type: ignore[no-untyped-def]
    return _parser(command).parse_args(list(argv))

