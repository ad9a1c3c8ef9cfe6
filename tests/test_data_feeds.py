"""Multi-input models whose inputs share no batch dimension (silero-vad's audio [1, 576] and LSTM state
[2, 1, 128]) take .npz data as whole feeds; the model is called once per feed, and builds verify on them.

    audio [1, 4] ─ ReduceSum(keepdims) ─┐
                                        Add ── out [2, 1, 3]
    state [2, 1, 3] ────────────────────┘
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtopt.cli.main import main
from trtopt.data import InputInfo, load_dataset
from trtopt.data.arrays import has_batch_axis
from trtopt.errors import DataError

INPUTS = [InputInfo("audio", [1, 4], np.float32), InputInfo("state", [2, 1, 3], np.float32)]


def test_batch_axis_is_shared_or_not() -> None:
    assert not has_batch_axis(INPUTS)
    assert has_batch_axis([InputInfo("a", [None, 4], np.float32), InputInfo("b", ["N", 3], np.float32)])
    assert has_batch_axis([InputInfo("a", [1, 4], np.float32), InputInfo("b", [1, 2, 3], np.float32)])


def test_stacks_and_single_feeds_give_one_feed_per_call(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    audio, state = rng.standard_normal((3, 1, 4)), rng.standard_normal((3, 2, 1, 3)).astype(np.float32)
    np.savez(tmp_path / "a_stack.npz", audio=audio, state=state)
    np.savez(tmp_path / "b_one.npz", audio=audio[0], state=state[0])
    data = load_dataset(tmp_path, INPUTS)
    assert len(data) == 4 and data.fixed_batch == 1
    batches = list(data.batches(8))
    assert [b.feeds["state"].shape for b in batches] == [(2, 1, 3)] * 4
    assert [b.feeds["audio"].shape for b in batches] == [(1, 4)] * 4
    assert batches[0].feeds["audio"].dtype == np.float32 and batches[0].rows is None
    np.testing.assert_array_equal(batches[2].feeds["state"], state[2])
    assert [Path(b.sources[0]).name for b in batches] == ["a_stack.npz[0]", "a_stack.npz[1]", "a_stack.npz[2]",
                                                          "b_one.npz"]


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"audio": np.ones((1, 4))},
         r"input\(s\) \['state'\] are not among them.*np.savez\(file, audio=..., state=...\)"),
        ({"audio": np.ones((1, 4)), "state": np.ones((1, 2, 3))},
         r"'state' has shape \[1, 2, 3\], but input 'state' expects one feed \[2, 1, 3\] or a stack of feeds "
         r"\[N, 2, 1, 3\]"),
        ({"audio": np.ones((2, 1, 4)), "state": np.ones((3, 2, 1, 3))}, "different numbers of samples"),
    ],
)
def test_feeds_that_do_not_fit_are_clear_errors(tmp_path: Path, arrays: dict, match: str) -> None:
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(DataError, match=match):
        load_dataset(tmp_path, INPUTS)


def test_images_for_a_multi_input_model_say_how_to_save_npz(tmp_path: Path) -> None:
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    with pytest.raises(DataError, match=r"images can only feed a single-input model.*np.savez\(file, audio=..., "):
        load_dataset(tmp_path, INPUTS)


def test_build_calibrates_and_verifies_on_whole_feeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """audio [1, 64] ─ MatMul(W [64, 32]) ─ Add(state [2, 1, 32]) ─ out [2, 1, 32]"""
    rng = np.random.default_rng(1)
    weight = helper.make_tensor("W", TensorProto.FLOAT, [64, 32], rng.standard_normal(64 * 32).tolist())
    nodes = [helper.make_node("MatMul", ["audio", "W"], ["mixed"]),
             helper.make_node("Add", ["state", "mixed"], ["out"])]
    inputs = [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 64]),
              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 32])]
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 1, 32])
    graph = helper.make_graph(nodes, "feeds", inputs, [output], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    np.savez(tmp_path / "feeds.npz", audio=rng.standard_normal((12, 1, 64)).astype(np.float32),
             state=rng.standard_normal((12, 2, 1, 32)).astype(np.float32))  # fmt: skip
    argv = ["build", str(tmp_path / "m.onnx"), "--int8", "--backend", "cpu", "--calib", str(tmp_path / "feeds.npz")]
    assert main([*argv, "-o", str(tmp_path / "m.engine"), "--json"]) == 0, capsys.readouterr().err
    verification = json.loads(capsys.readouterr().out)["verification"]
    # 12 feeds, too few to hold 8 back: all 12 shared with verification (up to SHARED_CHECKS x 8)
    assert verification["samples"] == 12 and verification["reference_vs_fp32"]["cosine"] > 0.99
    assert main([*argv, "-o", str(tmp_path / "x.engine"), "--mean", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "Preprocessing flags (--preset, --resize, --mean, ...) turn images into one input" in err
    assert "np.savez(file, audio=..., state=...)" in err and not (tmp_path / "x.engine").exists()


def _silero_like(path: Path) -> None:
    """silero-vad's interface (a 16 kHz export, silero-vad 6.2.3): audio [batch, sequence], LSTM-like state
    [2, batch, 8] with the batch in the middle, and the sample rate as an int64 scalar that an `If` reads::

        audio ─ Unsqueeze ─ Conv1d(1->16) ─ Relu ─ Conv1d(16->16) ─ Relu ─┬─ ReduceMean ─ MatMul ─ Add(state[0])
                                                                          │    ─ Sigmoid ─ out [batch, 8]
                                                                          └─ If(sr == 16000: x, else: 2x)
                                                                               ─ ReduceMax ─ Add(state) ─ stateN
    """
    rng = np.random.default_rng(3)

    def weight(name: str, shape: list[int]) -> onnx.TensorProto:
        values = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        return onnx.numpy_helper.from_array(values.astype(np.float32), name)

    double = helper.make_graph([helper.make_node("Mul", ["r2", "two"], ["doubled"])], "else", [],
                               [helper.make_tensor_value_info("doubled", TensorProto.FLOAT, None)])  # fmt: skip
    same = helper.make_graph([helper.make_node("Identity", ["r2"], ["kept"])], "then", [],
                             [helper.make_tensor_value_info("kept", TensorProto.FLOAT, None)])  # fmt: skip
    nodes = [
        helper.make_node("Unsqueeze", ["audio", "axis1"], ["x"]),
        helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2]), helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1]), helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("ReduceMean", ["r2", "axis2"], ["pooled"], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w3"], ["mixed"]),
        helper.make_node("Gather", ["state", "zero"], ["h"], axis=0),
        helper.make_node("Add", ["mixed", "h"], ["pre"]), helper.make_node("Sigmoid", ["pre"], ["out"]),
        helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["scaled"], then_branch=same, else_branch=double),
        helper.make_node("ReduceMax", ["scaled", "axis2"], ["peak"], keepdims=0),
        helper.make_node("Slice", ["peak", "zero1", "eight", "one1"], ["peak8"]),
        helper.make_node("Add", ["state", "peak8"], ["stateN"]),
    ]  # fmt: skip
    inits = [weight("w1", [16, 1, 8]), weight("w2", [16, 16, 3]), weight("w3", [16, 8]),
             *(onnx.numpy_helper.from_array(np.array(v, dtype=t), n) for n, v, t in [
                 ("axis1", [1], np.int64), ("axis2", [2], np.int64), ("zero", 0, np.int64), ("rate", 16000, np.int64),
                 ("two", [2.0], np.float32), ("zero1", [0], np.int64), ("eight", [8], np.int64),
                 ("one1", [1], np.int64)])]  # fmt: skip
    inputs = [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "sequence"]),
              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 8]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, [])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 8]),
               helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 8])]  # fmt: skip
    graph = helper.make_graph(nodes, "silero_like", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def test_a_silero_like_model_builds_from_stacks_of_whole_feeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stacks of feeds for dynamic inputs with the batch in the middle and a scalar input: the sizes come from
    the arrays (a batch of 2 here), each scalar stays an array (a bare numpy int64 was no feed), the INT8 conv
    whose output an If body also reads gets pairs only on its top-level consumers, the summary counts feeds,
    not audio rows, and `trtopt run` describes each feed's whole output."""
    _silero_like(tmp_path / "m.onnx")
    rng = np.random.default_rng(4)
    n = 24
    np.savez(tmp_path / "feeds.npz", audio=rng.standard_normal((n, 2, 64)).astype(np.float32),
             state=np.zeros((n, 2, 2, 8), np.float32), sr=np.where(np.arange(n) % 2, 16000, 8000))  # fmt: skip
    argv = ["build", str(tmp_path / "m.onnx"), "--int8", "--backend", "cpu", "--calib", str(tmp_path / "feeds.npz")]
    assert main([*argv, "-o", str(tmp_path / "m.engine"), "--json"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["int8_layers"] >= 1 and summary["calibration"]["samples"] in (n, n - 8)  # auto scores on 8
    assert summary["verification"]["samples"] == n and summary["verification"]["reference_vs_fp32"]["cosine"] > 0.99
    assert main(["run", str(tmp_path / "m.engine"), str(tmp_path / "feeds.npz"), "--count", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all("output 'out' [2x8]" in line for line in lines), lines


def test_dynamic_inputs_are_named_at_once_and_a_named_size_is_set_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _silero_like(tmp_path / "m.onnx")
    argv = ["build", str(tmp_path / "m.onnx"), "--backend", "cpu", "-o", str(tmp_path / "m.engine")]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'audio' has dynamic dimension(s) [1]" in err and "'state' has dynamic dimension(s) [1]" in err
    assert "--shapes audio:1x224,state:2x1x8" in err and not (tmp_path / "m.engine").exists()
    assert main([*argv, "--shapes", "audio:2x64,state:2x3x8"]) == 2  # `batch` twice, two sizes
    err = " ".join(capsys.readouterr().err.split())
    assert "names 'batch' to 2 in input 'audio' and to 3 in input 'state'" in err
    assert main([*argv, "--shapes", "audio:1x64", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["verification"]["kernels_vs_reference"]["cosine"] > 0.9999


def test_placeholder_size_names_are_no_shared_size() -> None:
    """paddle2onnx names every dynamic size '?' (PP-OCR's classifier: [?, 3, ?, ?]): setting H and W to 48 and 192
    is no contradiction, and nothing is copied to another input from such a name."""
    import onnx_graphsurgeon as gs

    from trtopt.frontend.shapes import apply_shapes

    x = gs.Variable("x", np.float32, ["?", 3, "?", "?"])
    y = gs.Variable("y", np.float32, ["?", 8])
    graph = gs.Graph(inputs=[x, y], outputs=[])
    apply_shapes(graph, {"x": (1, 3, 48, 192)})
    assert x.shape == [1, 3, 48, 192] and y.shape == ["?", 8]
    z = gs.Variable("z", np.float32, ["n", "t", "t"])  # one input repeating a name with two sizes: no shared size
    apply_shapes(gs.Graph(inputs=[z], outputs=[]), {"z": (1, 4, 5)})
    assert z.shape == [1, 4, 5]
