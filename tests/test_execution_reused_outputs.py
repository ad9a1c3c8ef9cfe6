"""`ReusedOutputs`: runs that write into preallocated arrays give the plain runs' values, reuse the arrays
every `depth` runs and leave the previous run's arrays alone (calibration counts them meanwhile)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtopt.execution import OrtSession
from trtopt.execution.ort_session import ReusedOutputs


def conv_relu_model() -> onnx.ModelProto:
    """input [N,3,6,6] -> Conv(3->4, 3x3, pad 1) -> conv -> Relu -> output."""
    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w"], ["conv"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["output"]),
        ],
        "conv_relu",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4, 6, 6])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def nonzero_model() -> onnx.ModelProto:
    """x [4] -> NonZero -> nz [1, count]: an output whose shape depends on the values."""
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"])],
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("nz", TensorProto.INT64, [1, "count"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def batches(sizes: list[int]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"input": rng.standard_normal((n, 3, 6, 6)).astype(np.float32)} for n in sizes]


def test_reused_runs_give_the_plain_runs_values_for_every_batch_shape() -> None:
    session = OrtSession(conv_relu_model(), expose=["input", "conv"], threads=1)
    names = ["input", "conv", "output"]
    runner = ReusedOutputs(session, names)
    for feeds in batches([2, 2, 2, 3, 2, 3, 3, 1]):
        got = runner.run(feeds)
        expected = session.run(feeds, outputs=names)
        assert list(got) == names
        for name in names:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
        assert got["input"] is feeds["input"]  # a model input comes back as fed, not through ONNX Runtime


def test_arrays_are_reused_every_depth_runs_and_the_previous_run_is_left_alone() -> None:
    session = OrtSession(conv_relu_model(), expose=["conv"], threads=1)
    runner = ReusedOutputs(session, ["conv"], depth=2)
    runs = [runner.run(feeds) for feeds in batches([2] * 3)]
    kept = runs[2]["conv"].copy()
    runs.append(runner.run({"input": np.ones((2, 3, 6, 6), np.float32)}))
    np.testing.assert_array_equal(runs[2]["conv"], kept)  # run 3 wrote into run 1's arrays, not run 2's
    np.testing.assert_array_equal(runs[3]["conv"], session.run({"input": np.ones((2, 3, 6, 6), np.float32)})["conv"])
    assert runs[3]["conv"] is runs[1]["conv"] and runs[2]["conv"] is runs[0]["conv"]
    assert runs[3]["conv"] is not runs[2]["conv"]


def test_outputs_whose_shape_depends_on_the_values_fall_back_to_plain_runs() -> None:
    session = OrtSession(nonzero_model(), threads=1)
    runner = ReusedOutputs(session, ["nz"])
    for values in ([1, 0, 2, 0], [1, 1, 1, 0], [0, 0, 0, 5], [3, 0, 0, 1]):
        x = np.array(values, dtype=np.float32)
        np.testing.assert_array_equal(runner.run({"x": x})["nz"], np.array([np.nonzero(x)[0]]))
