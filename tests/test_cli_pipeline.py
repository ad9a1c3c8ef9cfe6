"""The user's main job through the CLI: build -> run -> compare -> export, calibrate, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

from trtopt.cli.main import main
from trtopt.zoo import build_model


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    onnx.save_model(build_model("tiny_cnn", seed=2), root / "tiny.onnx")
    (root / "images").mkdir()
    rng = np.random.default_rng(1)
    for i in range(6):
        small = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
        Image.fromarray(small).resize((40, 36), Image.BILINEAR).save(root / "images" / f"im{i}.jpg")
    (root / "images" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    code = main(_build_args(root, "tiny.engine"))
    assert code == 0
    return root


def _build_args(root: Path, plan: str) -> list[str]:
    """`trtopt build` of the tiny model on the test images, every layer INT8, summary as JSON."""
    return [
        "build", str(root / "tiny.onnx"), "--int8", "--calib", str(root / "images"), "--backend", "cpu",
        "--preset", "imagenet", "--min-channels", "1", "-o", str(root / plan), "--json",
    ]  # fmt: skip


def _json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out)


def test_build_summary_json(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(_build_args(work, "again.engine"))
    summary = _json(capsys)
    assert summary["backend"] == "cpu" and summary["precision"] == "int8"
    assert summary["onnxruntime_kernels"]["float_convs"] == 0 and summary["int8_layers"] >= 10
    stages = {"load", "optimize", "graph check", "calibrate", "quantize", "build", "speed check"}
    assert set(summary["stage_seconds"]) == stages
    assert summary["graph_check"]["max_relative_error"] < 1e-4  # the demo model, folded, against its file
    assert summary["speed"]["fp32_ms"] > 0 and summary["speed"]["plan_ms"] > 0
    assert summary["file_bytes"] == (work / "again.engine").stat().st_size


def test_run_prints_top5_and_skips_unreadable_images(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(work / "tiny.engine"), str(work / "images"), "--json", "--top", "3"]) == 0
    result = _json(capsys)
    assert len(result["predictions"]) == 6
    first = result["predictions"][0]
    assert len(first["top"]) == 3 and first["top"][0]["label"].startswith("class ")
    assert sum(p["probability"] for p in first["top"]) <= 1.0 + 1e-6
    assert [Path(s["path"]).name for s in result["summary"]["skipped"]] == ["broken.jpg"]
    assert result["summary"]["images_per_second"] > 0


def test_run_table_output(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(work / "tiny.engine"), str(work / "images" / "im0.jpg")]) == 0
    captured = capsys.readouterr()
    assert "im0.jpg" in captured.out and "%" in captured.out and "img/s" in captured.err


def test_compare_per_output_and_per_layer(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "compare",
            str(work / "tiny.onnx"),
            str(work / "tiny.engine"),
            "--data",
            str(work / "images"),
            "--per-layer",
            "--json",
        ]
    )
    assert code == 0
    result = _json(capsys)
    (logits,) = result["outputs"]
    assert logits["name"] == "logits" and logits["samples"] == 6
    assert 0.9 < logits["cosine"] <= 1.0 + 1e-9 and logits["top1_agreement"] is not None
    assert len(result["layers"]) > 5 and all(0 < r["cosine"] <= 1 + 1e-9 for r in result["layers"])


def test_calibrate_then_build_from_each_cache_format(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for fmt, name in (("trtopt", "c.json"), ("tensorrt", "c.cache")):
        code = main(
            [
                "calibrate",
                str(work / "tiny.onnx"),
                "--calib",
                str(work / "images"),
                "--preset",
                "imagenet",
                "--format",
                fmt,
                "--workers",
                "2",
                "-o",
                str(work / name),
                "--json",
            ]
        )
        assert code == 0
        assert _json(capsys)["tensors"] > 5
        code = main(
            [
                "build",
                str(work / "tiny.onnx"),
                "--int8",
                "--calib-cache",
                str(work / name),
                "--backend",
                "cpu",
                "--min-channels",
                "1",
                "-o",
                str(work / f"{fmt}.engine"),
                "--json",
            ]
        )
        assert code == 0, capsys.readouterr().err
        capsys.readouterr()
    assert (work / "c.cache").read_text().startswith("TRT-")


def test_export_sections(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(work / "tiny.engine"), "--section", "onnx", "-o", str(work / "q.onnx")]) == 0
    onnx.checker.check_model(onnx.load(work / "q.onnx"))
    assert main(["export", str(work / "tiny.engine"), "--info"]) == 0
    assert _json(capsys)["backend"] == "cpu"
    assert main(["export", str(work / "tiny.engine"), "-o", str(work / "x.plan"), "--section", "engine"]) == 2
    assert "no 'engine' section" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["build", "{m}", "--int8", "-o", "{d}/x.engine"], "needs calibration data"),
        (["build", "{m}", "--calib", "{d}/images", "-o", "{d}/x.engine"], "without --int8"),
        (["build", "{m}", "--int8", "--calib", "{d}/nothing", "-o", "{d}/x.engine"], "does not exist"),
        (
            ["build", "{m}", "--int8", "--calib", "{d}/images", "--method", "magic", "-o", "{d}/x.engine"],
            "Unknown calibration method",
        ),
        (["build", "{m}", "--backend", "fpga", "-o", "{d}/x.engine"], "Unknown backend"),
        (["build", "{m}", "--int8", "--calib", "{d}/images", "--workers", "0", "-o", "{d}/x.engine"], "--workers is 0"),
        (["calibrate", "{m}", "--calib", "{d}/images", "--workers", "-1", "-o", "{d}/x.json"], "--workers is -1"),
        (["build", "{m}", "--fp16", "--backend", "cpu", "-o", "{d}/x.engine"], "--fp16 is for the TensorRT"),
        (["build", "{m}", "--backend", "tensorrt", "-o", "{d}/x.engine"], "not available here"),
        (["run", "{d}/tiny.onnx", "{d}/images"], "not a trtopt plan"),
        (["run", "{d}/missing.engine", "{d}/images"], "does not exist"),
        (["compare", "{m}", "{d}/tiny.engine", "--data", "{d}/empty"], "is empty"),
    ],
)
def test_bad_input_is_a_clean_error(
    work: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (work / "empty").mkdir(exist_ok=True)
    args = [a.format(m=work / "tiny.onnx", d=work) for a in argv]
    assert main(args) in (2, 3)
    captured = capsys.readouterr()
    assert "error:" in captured.err and message.lower() in captured.err.lower(), captured.err
    assert "Traceback" not in captured.err
    assert not (work / "x.engine").exists()


def test_no_traceback_from_a_real_process(work: Path) -> None:
    (work / "garbage.engine").write_bytes(b"TRTOPLAN" + b"\x00" * 100)
    proc = subprocess.run(
        [sys.executable, "-m", "trtopt.cli.main", "run", str(work / "garbage.engine"), str(work / "images")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "error:" in proc.stderr


def test_calibration_progress_shows_images_per_second_and_the_bounding_stage(monkeypatch) -> None:
    import io

    from rich.console import Console

    from trtopt.calib import CalibProgress
    from trtopt.cli import console

    screen = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=screen, force_terminal=True, width=120))
    with console.phase_progress("calibration") as update:
        update(CalibProgress("histogram", 2, 16, 32, 4.0, {"decode": 0.5, "inference": 2.5, "counting": 0.7}))
        update(CalibProgress("auto scoring", 3, 3, 40, 6.0))
    shown = screen.getvalue()
    assert "calibration: histogram pass" in shown and "4.0 img/s, bound by inference" in shown
    assert "auto thresholds, tensors scored" in shown and "0.5 img/s" not in shown


def test_calibration_progress_without_a_terminal_prints_a_line_per_phase(monkeypatch) -> None:
    """Redirected to a log (CI, `> build.log 2>&1`), a long build says which phase runs instead of nothing."""
    import io

    from rich.console import Console

    from trtopt.calib import CalibProgress
    from trtopt.cli import console

    screen = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=screen, force_terminal=False, width=120))
    with console.phase_progress("calibration") as update:
        for done in (8, 16, 24, 32):
            update(CalibProgress("histogram", done // 8, done, 32, done / 4.0))
        update(CalibProgress("auto scoring", 0, 0, 40, 0.5))  # tensors, not images: no rate on a bar
        update(CalibProgress("auto scoring", 40, 40, 40, 9.5))
        update(CalibProgress("sensitivity", 1, 1, 10, 3.0))
        update(CalibProgress("sensitivity", 5, 5, 10, 300.0))  # the trials' total is an upper bound
        update(CalibProgress("sensitivity", 10, 10, 10, 330.0))
        update(CalibProgress("verify", 4, 4, 4))  # a report without seconds: no "in 0.0s"
    lines = screen.getvalue().splitlines()
    assert lines == ["calibration: histogram pass: 8 of 32 done",  # 2 and 4 s: under QUIET_SECONDS
                     "calibration: histogram pass: 24 of 32 done after 6.0s, about 2s left",
                     "calibration: histogram pass: 32 done in 8.0s",
                     "calibration: auto thresholds, tensors scored: started (40 to do)",
                     "calibration: auto thresholds, tensors scored: 40 done in 9.5s",
                     "calibration: sensitivity analysis, trials: 1 of 10 done",
                     "calibration: sensitivity analysis, trials: 5 of 10 done after 300.0s, at most about 5 min left",
                     "calibration: sensitivity analysis, trials: 10 done in 330.0s",
                     "calibration: verify pass: 4 done"]  # fmt: skip  (all done at its first report: one line)
    screen.truncate(0)
    with console.phase_progress("calibration", disable=True) as update:  # --json: stderr stays quiet too
        update(CalibProgress("histogram", 1, 8, 32, 1.0))
    assert screen.getvalue() == ""


def test_build_stages_print_a_line_as_they_start_and_end(monkeypatch, tmp_path: Path) -> None:
    """The stages after calibration (placement and search, the backend's build and verification, the speed check)
    ran minutes on a segmentation model with nothing on the screen: each now says when it starts, and when it
    ends where it ran long."""
    import io

    from rich.console import Console

    from trtopt.build import BuildConfig, build_plan
    from trtopt.calib import CalibProgress
    from trtopt.calib.collect import BUILD_STAGE
    from trtopt.cli import console
    from trtopt.data import DataConfig

    screen = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=screen, force_terminal=False, width=120))
    with console.phase_progress("calibration") as update:
        update(CalibProgress(BUILD_STAGE + "timing the cpu plan", 0, 0, 1))
        update(CalibProgress(BUILD_STAGE + "timing the cpu plan", 1, 1, 1, 12.34))
        update(CalibProgress(BUILD_STAGE + "checking the graph", 0, 0, 1))
        update(CalibProgress(BUILD_STAGE + "checking the graph", 1, 1, 1, 0.8))  # short: its start line says enough
    assert screen.getvalue().splitlines() == ["timing the cpu plan ...", "timing the cpu plan: done in 12.3s",
                                              "checking the graph ..."]

    from model_files import tiny_model_with_images

    tiny_model_with_images(tmp_path, 24)
    reports: list[CalibProgress] = []
    build_plan(tmp_path / "tiny.onnx", BuildConfig(backend="cpu", int8=True,
                                                   data=DataConfig(sources=(str(tmp_path / "images"),))),
               progress=reports.append)  # fmt: skip
    stages = [(r.phase.removeprefix(BUILD_STAGE), r.samples) for r in reports if r.phase.startswith(BUILD_STAGE)]
    building = "building the cpu plan and verifying it on held-back samples"
    assert (building, 0) in stages and stages.index((building, 0)) + 1 == stages.index((building, 1))
    assert stages[0] == ("checking the optimised graph against the model file", 0)


def test_run_on_a_sequence_output_describes_it_instead_of_naming_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CTC recogniser's [N, T, C] output is not top-k'd as if it were T*C classes (hold-out check,
    PP-OCRv3's recogniser printed 'class 106000 (0.0%)')."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 1, 1)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 4, 64], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Reshape", ["c", "shape"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph(nodes, "seq", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 64])],
                              [w, shape])  # fmt: skip
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)]), tmp_path / "s.onnx")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    plan = str(tmp_path / "s.engine")
    assert main(["build", str(tmp_path / "s.onnx"), "--backend", "cpu", "--preset", "imagenet", "-o", plan]) == 0
    capsys.readouterr()
    assert main(["run", plan, str(tmp_path / "a.png"), "--json"]) == 0
    (prediction,) = _json(capsys)["predictions"]
    assert "top" not in prediction and prediction["described"]["shape"] == [4, 64]
    assert prediction["described"]["min"] <= prediction["described"]["mean"] <= prediction["described"]["max"]
    assert main(["run", plan, str(tmp_path / "a.png")]) == 0
    shown = capsys.readouterr().out
    assert "[4x64]" in shown and "class " not in shown


@pytest.mark.parametrize(
    ("shape", "scores"),
    [((2, 1000), True), ((2, 1000, 1, 1), True), ((1, 1, 5), True), ((2, 40, 6625), False), ((2, 1, 8, 8), False),
     ((2,), False), ((2, 1), False), ((2, 1, 1, 1), False)],
)  # fmt: skip
def test_run_top_ks_one_score_vector_per_sample_unit_axes_included(shape: tuple[int, ...], scores: bool) -> None:
    """A classifier ending in a 1x1 conv and global pooling gives [N, classes, 1, 1]: still top-k'd."""
    from trtopt.cli.run_cmd import _class_scores

    assert _class_scores(np.zeros(shape)) is scores


def test_run_reads_a_time_major_output_along_its_batch_axis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CRNN's CTC logits come time-major, [T, N, C] (PyTorch's layout; captcha-whisperer's [20, N, 37] in the
    hunt of round 12): each image's line describes its own [T, C] slice, not time step i of every image.

        x [N,3,8,8] -> Conv 1x1 (5 ch) -> Reshape [N,5,64] -> Transpose (2,0,1) -> y [64, N, 5]
    """
    from onnx import TensorProto, helper, numpy_helper

    from trtopt.cli.run_cmd import sample_axis

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(5, 3, 1, 1)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([0, 5, 64], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[2, 0, 1])]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, "N", 5])
    graph = helper.make_graph(nodes, "tnc", [x], [y], [w, shape])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)]), tmp_path / "t.onnx")
    for name, level in (("dark.png", 10), ("light.png", 240), ("mid.png", 128)):
        Image.fromarray(np.full((8, 8, 3), level, np.uint8)).save(tmp_path / name)
    plan = str(tmp_path / "t.engine")
    assert main(["build", str(tmp_path / "t.onnx"), "--backend", "cpu", "--preset", "imagenet", "-o", plan]) == 0
    capsys.readouterr()
    images = [str(tmp_path / n) for n in ("dark.png", "light.png", "mid.png")]
    assert main(["run", plan, *images, "--batch", "2", "--json"]) == 0
    predictions = _json(capsys)["predictions"]
    assert [p["described"]["shape"] for p in predictions] == [[64, 5]] * 3
    means = {Path(p["input"]).name: p["described"]["mean"] for p in predictions}
    assert len(set(means.values())) == 3  # each image's own values (time step i of all would repeat a pattern)
    assert sample_axis((64, -1, 5), (64, 1, 5), 1) == 1 and sample_axis((64, 1, 5), (64, 1, 5), 1) == 1
    assert sample_axis((-1, 1000), (1, 1000), 1) == 0 and sample_axis((1, 10), (1, 10), 1) == 0
    assert sample_axis((20, -1, 37), (20, 20, 37), 20) == 1


def test_run_describes_a_whole_output_without_a_batch_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model fixed at one sample whose output has no batch axis (attacut's [seq_len] logits for its [1, seq_len]
    ids, round 13's hunt) printed element 0 of the output as the sample's result; all of it is the sample's.

        x [1, 6] -> Reshape [6] -> y [6]
    """
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([6], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "flat",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])], [shape])  # fmt: skip
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)]), tmp_path / "f.onnx")
    samples = np.arange(18, dtype=np.float32).reshape(3, 6)  # three samples of [6], stacked
    np.savez(tmp_path / "x.npz", x=samples)
    plan = str(tmp_path / "f.engine")
    assert main(["build", str(tmp_path / "f.onnx"), "--backend", "cpu", "-o", plan]) == 0
    capsys.readouterr()
    assert main(["run", plan, str(tmp_path / "x.npz"), "--json"]) == 0
    described = [p["described"] for p in _json(capsys)["predictions"]]
    assert [(d["shape"], d["min"], d["max"]) for d in described] == [([6], s.min(), s.max()) for s in samples]


def test_run_shows_the_output_of_class_probabilities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run` showed a multi-output model's first output, box offsets, as softmaxed "classes" (MTCNN's ONet, round
    13's hunt); a later output of probabilities is what it shows now, and it says so.

        x [N,3,8,8] -> GlobalAveragePool -> Flatten -> f [N,3] -> Gemm -> boxes [N,4]
                                                          └─────> Softmax -> probs [N,3]
    """
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["boxes"], transB=1), helper.make_node("Softmax", ["f"], ["probs"])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4]),
                               helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3])], [w])  # fmt: skip
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)]), tmp_path / "m.onnx")
    Image.fromarray(np.full((8, 8, 3), (200, 30, 90), np.uint8)).save(tmp_path / "a.png")
    plan = str(tmp_path / "m.engine")
    assert main(["build", str(tmp_path / "m.onnx"), "--backend", "cpu", "--preset", "imagenet", "-o", plan]) == 0
    capsys.readouterr()
    assert main(["run", plan, str(tmp_path / "a.png")]) == 0
    said = capsys.readouterr()
    assert "showing output 'probs'" in said.err and "'boxes' comes first" in said.err
    assert main(["run", plan, str(tmp_path / "a.png"), "--json"]) == 0
    (prediction,) = _json(capsys)["predictions"]
    assert len(prediction["top"]) == 3  # the 3 classes of probs, not 4 of boxes


def test_run_names_the_batch_a_fixed_batch_plan_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model exported at a fixed batch runs that many samples per call whatever --batch says; the closing line
    named --batch ("batch 8") for a batch-4 ResNet-18 export (second robustness sweep). A dynamic batch runs
    --batch.

        x [B,3,8,8] -> GlobalAveragePool -> Flatten -> y [B,3]      (B = 1, or N)
    """
    from onnx import TensorProto, helper

    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    Image.fromarray(np.full((8, 8, 3), (200, 30, 90), np.uint8)).save(tmp_path / "a.png")
    images = [str(tmp_path / "a.png")] * 3
    for batch, said in ((1, "(batch 1, fixed by the plan)"), ("N", "(batch 2)")):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
        graph = helper.make_graph(nodes, "gap", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)])
        onnx.save_model(model, tmp_path / "m.onnx")
        plan = str(tmp_path / "m.engine")
        assert main(["build", str(tmp_path / "m.onnx"), "--backend", "cpu", "--preset", "imagenet", "-o", plan]) == 0
        capsys.readouterr()
        assert main(["run", plan, *images, "--batch", "2"]) == 0
        assert said in capsys.readouterr().err.replace("\n", " ")
