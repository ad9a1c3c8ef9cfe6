"""`trtopt optimize` checks the model before writing it (trtopt.passes.check): ONNX Runtime must load it, and on a
random feed it must compute what the model does. A pass that breaks the graph is an error with nothing written."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

import trtopt.passes
from trtopt.cli.main import main
from trtopt.passes import OptimizeResult
from trtopt.zoo import build_model


def _optimize_then(monkeypatch: pytest.MonkeyPatch, damage) -> None:  # type: ignore[no-untyped-def]
    real = trtopt.passes.optimize

    def broken(graph, passes=None):  # type: ignore[no-untyped-def]
        result: OptimizeResult = real(graph, passes)
        damage(result.graph)
        return result

    monkeypatch.setattr(trtopt.passes, "optimize", broken)


def test_a_faithful_optimisation_is_written_with_its_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(build_model("tiny_cnn"), tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["check"]
    assert check["max_relative_error"] < 1e-5 and "equal the model's on 1 random feed" in check["note"]
    assert (tmp_path / "o.onnx").is_file()


def test_an_optimisation_that_changes_the_numbers_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def shift_a_bias(graph) -> None:  # type: ignore[no-untyped-def]
        conv = next(n for n in graph.nodes if n.op == "Conv" and len(n.inputs) == 3)
        conv.inputs[2].values = conv.inputs[2].values + np.float32(0.5)

    onnx.save(build_model("tiny_cnn"), tmp_path / "m.onnx")
    _optimize_then(monkeypatch, shift_a_bias)
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "computes something else" in err and "nothing written" in err and "trtopt bug" in err
    assert not (tmp_path / "o.onnx").exists()
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--no-check"]) == 0


def test_an_optimised_model_that_does_not_load_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def orphan_an_input(graph) -> None:  # type: ignore[no-untyped-def]
        node = graph.nodes[-1]
        node.inputs[0] = type(node.inputs[0])("produced_by_nothing", dtype=np.float32)

    onnx.save(build_model("tiny_cnn"), tmp_path / "m.onnx")
    _optimize_then(monkeypatch, orphan_an_input)
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "does not load in ONNX Runtime" in err and "produced_by_nothing" in err
    assert not (tmp_path / "o.onnx").exists()


def test_dynamic_sizes_are_loaded_but_not_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build_model("tiny_cnn")
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.Clear()
        dim.dim_param = "side"
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "checked: loads in ONNX Runtime; outputs not compared" in shown and "--shapes" in shown


def test_a_build_checks_its_graph_against_the_model_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trtopt build` compares the graph it quantises and verifies against (loaded and optimised) with the model
    file itself: a pass that changed the numbers would otherwise pass verification, which compares the plan
    with that same graph."""
    onnx.save(build_model("tiny_cnn"), tmp_path / "m.onnx")
    argv = ["build", str(tmp_path / "m.onnx"), "--backend", "cpu", "-o", str(tmp_path / "m.engine"), "--json"]
    assert main(argv) == 0
    check = json.loads(capsys.readouterr().out)["graph_check"]
    assert check["max_relative_error"] < 1e-5 and "equals the model file on 1 verification input(s)" in check["note"]

    def shift_a_bias(graph) -> None:  # type: ignore[no-untyped-def]
        conv = next(n for n in graph.nodes if n.op == "Conv" and len(n.inputs) == 3)
        conv.inputs[2].values = conv.inputs[2].values + np.float32(0.5)

    _optimize_then(monkeypatch, shift_a_bias)
    (tmp_path / "m.engine").unlink()
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "The graph trtopt builds from the model computes something else" in err
    assert not (tmp_path / "m.engine").exists()


def test_a_model_that_draws_random_numbers_is_not_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Two runs of RandomNormalLike differ whatever trtopt does (Piper's VITS voices draw noise so): the checks
    say they compared nothing, and the plan is built unverified with a warning."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("RandomNormalLike", ["x"], ["noise"], scale=0.1),
             helper.make_node("Add", ["x", "noise"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--json"]) == 0
    assert "draws random numbers (RandomNormalLike)" in json.loads(capsys.readouterr().out)["check"]["note"]
    argv = ["build", str(tmp_path / "m.onnx"), "--backend", "cpu", "-o", str(tmp_path / "m.engine"), "--json"]
    assert main(argv) == 0  # refused before: its verification compared two random runs
    shown = capsys.readouterr()
    summary = json.loads(shown.out)
    assert "verification" not in summary and "not compared: the model draws random" in summary["graph_check"]["note"]
    assert "the plan is not verified: the model draws random numbers (RandomNormalLike)" in caplog.text
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    compare = ["compare", str(tmp_path / "m.onnx"), str(tmp_path / "m.engine"), "--data", str(tmp_path / "x.npy")]
    assert main(compare) == 0
    assert "draws random numbers (RandomNormalLike)" in " ".join(capsys.readouterr().out.split())


def test_outputs_saturated_near_zero_are_measured_against_a_floor() -> None:
    """PP-OCRv4-det's sigmoid map on noise peaks at 5.9e-5 and differs by 1.5e-7 where ONNX Runtime flushes a
    value to 0: rounding, not a wrong rewrite. A difference of 1e-4 on the same map is one."""
    from trtopt.passes.check import RTOL, _relative_error

    want = np.zeros((1, 1, 8, 8), np.float32)
    want[0, 0, 3, 3] = 5.9e-5
    have = want.copy()
    have[0, 0, 2, 2] = 1.5e-7
    assert _relative_error(want, have) <= RTOL
    have[0, 0, 2, 2] = 1e-4
    assert _relative_error(want, have) > RTOL
    big = np.full(4, 10.0, np.float32)
    assert _relative_error(big, big + np.float32(0.02)) > RTOL  # 2e-3 of the largest value


def test_non_finite_values_follow_the_verification_rule() -> None:
    """The graph check and the verification (trtopt.metrics.agreement.comparable) judge NaN and inf alike: the same
    non-finite value in both is no difference and the finite values beside it are measured (float rounding
    there used to fail the whole output); a NaN or an infinity in one of them only, or of the other sign, fails."""
    from trtopt.passes.check import RTOL, _relative_error

    want = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0], np.float32)
    have = want.copy()
    have[3] += np.float32(1e-7)  # rounding beside the NaN
    assert _relative_error(want, have) <= RTOL
    for position, value in ((0, 1.0), (1, -np.inf), (3, np.nan), (4, np.inf)):
        broken = have.copy()
        broken[position] = value
        assert _relative_error(want, broken) == float("inf"), (position, value)


def test_a_model_that_runs_one_sample_per_call_is_built_and_run_one_sample_at_a_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A dynamic batch declared but a batch of 1 written into a Reshape (khmersm's torch export, docs/holdout.md
    round 8): the build says so and goes on one sample per call (before, it stopped in calibration at "ONNX
    Runtime rejected the inputs" with a fix about shapes and dtypes); the plan, called with a batch, runs it one
    sample at a time and says so once, giving what each sample alone gives."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    one = numpy_helper.from_array(np.array([1, 16], np.int64), "one_row")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "one_row"], ["r"]),
         helper.make_node("Relu", ["r"], ["y"])],
        "batch_of_one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [weights, one],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((24, 16)).astype(np.float32))
    argv = ["build", str(tmp_path / "m.onnx"), "--int8", "--calib", str(tmp_path / "calib.npz"), "--backend", "cpu",
            "-o", str(tmp_path / "m.engine")]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0 and (tmp_path / "m.engine").is_file()
    said = " ".join(caplog.text.split())
    assert "runs only one sample per call" in said and "fails on a batch of 8 (at Reshape" in said
    assert "one sample per call (as --calib-batch 1 does)" in said
    from trtopt.engine import Engine

    x = rng.standard_normal((4, 16)).astype(np.float32)
    caplog.clear()
    with Engine.load(tmp_path / "m.engine") as engine, caplog.at_level(logging.WARNING):
        alone = np.concatenate([engine({"x": x[i:i + 1]})["y"] for i in range(4)])
        np.testing.assert_array_equal(engine({"x": x})["y"], alone)
        np.testing.assert_array_equal(engine({"x": x[:3]})["y"], alone[:3])
    assert caplog.text.count("running batches one sample at a time") == 1
