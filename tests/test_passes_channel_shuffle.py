"""channel_shuffle: Reshape -> Transpose -> Reshape that permutes the elements of one axis becomes one Gather, the
values unchanged; rearrangements that move more than one axis (a window partition) are left alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from pass_helpers import assert_same_outputs, ops, run_pass

from trtopt.backend.cpu.backend import CpuBackend
from trtopt.cli.main import main
from trtopt.execution.ort_session import run_model
from trtopt.frontend import graph_from_onnx
from trtopt.passes import optimize
from trtopt.zoo import GraphBuilder


def shuffle_unit(*, groups: int = 2, channels: int = 8, axis: int = 1, batch: int | str = 2) -> onnx.ModelProto:
    """ShuffleNetV2's unit as PyTorch writes it (axis 1) or TensorFlow (axis 3, NHWC):
    input ─ Conv ─┬─ Concat ─ Reshape [N, g, C/g, ...] ─ Transpose (swap g, C/g) ─ Reshape [N, C, ...] ─ Relu
                  └──────┘"""
    b = GraphBuilder("shuffle", seed=0)
    half = channels // 2
    x = b.input("input", [2, half, 5, 6])
    y = b.conv(x, half, half, 3, pads=[1, 1, 1, 1])
    if axis == 3:
        y = b.node("Transpose", [y], perm=[0, 2, 3, 1])
    y = b.concat([y, b.relu(y)], axis=axis)
    n = batch if isinstance(batch, int) else -1  # a symbolic batch: Reshape reads it from the element count
    shape = [n, channels, 5, 6] if axis == 1 else [n, 5, 6, channels]
    parts = [*shape[:axis], groups, channels // groups, *shape[axis + 1:]]
    y = b.node("Reshape", [y, b.const("parts", np.array(parts, np.int64))])
    perm = list(range(len(parts)))
    perm[axis], perm[axis + 1] = axis + 1, axis
    y = b.node("Transpose", [y], perm=perm)
    y = b.node("Reshape", [y, b.const("merged", np.array(shape, np.int64))])
    model = b.build([b.relu(y, out="output")])
    if isinstance(batch, str):
        model.graph.input[0].CopyFrom(helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, half, 5, 6]))
        del model.graph.output[:]
        model.graph.output.append(helper.make_tensor_value_info("output", TensorProto.FLOAT, None))
    return model


def test_a_channel_shuffle_is_one_gather() -> None:
    model = shuffle_unit()
    graph, report = run_pass(model, "channel_shuffle")
    assert report.counts() == {"channel_shuffle": 1}
    assert "Transpose" not in ops(graph) and ops(graph).count("Gather") == 1
    gather = next(n for n in graph.nodes if n.op == "Gather")
    assert gather.attrs["axis"] == 1 and list(gather.inputs[1].values) == [0, 4, 1, 5, 2, 6, 3, 7]
    assert_same_outputs(model, graph)


@pytest.mark.parametrize("groups", [2, 4])
def test_tensorflow_shuffles_the_last_axis(groups: int) -> None:
    model = shuffle_unit(groups=groups, channels=8, axis=3)
    graph, report = run_pass(model, "channel_shuffle")
    assert report.counts() == {"channel_shuffle": 1}
    assert next(n for n in graph.nodes if n.op == "Gather").attrs["axis"] == 3
    assert_same_outputs(model, graph)


def test_a_symbolic_batch_is_kept() -> None:
    model = shuffle_unit(batch="N")
    graph, report = run_pass(model, "channel_shuffle")
    assert report.counts() == {"channel_shuffle": 1}
    feeds = {"input": np.random.default_rng(1).standard_normal((3, 4, 5, 6)).astype(np.float32)}
    before, after = run_model(model, feeds, opt_level="disable"), run_model(graph, feeds, opt_level="disable")
    np.testing.assert_array_equal(before["output"], after["output"])


def window_partition() -> onnx.ModelProto:
    """Swin's window partition: [N, H, W, C] -> [N, H/2, 2, W/2, 2, C] -> perm [0, 1, 3, 2, 4, 5] -> [N*H*W/4, 2,
    2, C]; the Transpose moves axes of two split dimensions, and the last Reshape does not restore the input."""
    b = GraphBuilder("windows", seed=0)
    x = b.input("input", [1, 4, 4, 3])
    y = b.node("Reshape", [x, b.const("parts", np.array([1, 2, 2, 2, 2, 3], np.int64))])
    y = b.node("Transpose", [y], perm=[0, 1, 3, 2, 4, 5])
    y = b.node("Reshape", [y, b.const("windows", np.array([4, 2, 2, 3], np.int64))])
    return b.build([b.node("Relu", [y], out="output")])


def test_a_window_partition_is_left_alone() -> None:
    graph, report = run_pass(window_partition(), "channel_shuffle")
    assert not report.changed and ops(graph).count("Transpose") == 1


def test_a_transpose_that_also_moves_another_axis_is_left_alone() -> None:
    b = GraphBuilder("other_axis", seed=0)
    x = b.input("input", [2, 8, 3, 3])
    y = b.node("Reshape", [x, b.const("parts", np.array([2, 2, 4, 3, 3], np.int64))])
    y = b.node("Transpose", [y], perm=[0, 2, 1, 4, 3])  # also swaps H and W
    y = b.node("Reshape", [y, b.const("merged", np.array([2, 8, 3, 3], np.int64))])
    graph, report = run_pass(b.build([b.node("Relu", [y], out="output")]), "channel_shuffle")
    assert not report.changed


@settings(max_examples=25, deadline=None)
@given(factors=st.lists(st.integers(1, 4), min_size=2, max_size=3), data=st.data())
def test_any_permutation_of_the_split_factors_is_exact(factors: list[int], data: st.DataObject) -> None:
    """Split axis 1 into 2-3 factors, permute them in any order, merge back: the Gather gives the same values."""
    order = data.draw(st.permutations(range(len(factors))))
    size = int(np.prod(factors))
    b = GraphBuilder("factors", seed=0)
    x = b.input("input", [2, size, 3])
    y = b.node("Reshape", [x, b.const("parts", np.array([2, *factors, 3], np.int64))])
    y = b.node("Transpose", [y], perm=[0, *(1 + o for o in order), 1 + len(factors)])
    y = b.node("Reshape", [y, b.const("merged", np.array([2, size, 3], np.int64))])
    model = b.build([b.node("Relu", [y], out="output")])
    graph, report = run_pass(model, "channel_shuffle")
    moved = not np.array_equal(np.arange(size).reshape(factors).transpose(order).reshape(-1), np.arange(size))
    assert report.changed == moved and ops(graph).count("Transpose") == (0 if moved else 1)
    feeds = {"input": np.random.default_rng(2).standard_normal((2, size, 3)).astype(np.float32)}
    np.testing.assert_array_equal(run_model(model, feeds, opt_level="disable")["output"],
                                  run_model(graph, feeds, opt_level="disable")["output"])


def test_the_cpu_backend_runs_it_and_the_default_order_does_not() -> None:
    model = shuffle_unit()
    assert "Transpose" not in ops(optimize(graph_from_onnx(model), CpuBackend().passes(None)).graph)
    assert "Transpose" in ops(optimize(graph_from_onnx(model)).graph)


def test_trtopt_optimize_runs_a_backends_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`trtopt optimize --backend cpu` writes the graph the CPU build quantises; an unknown name lists the known."""
    onnx.save(shuffle_unit(), tmp_path / "m.onnx")
    args = ["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--json"]
    assert main([*args, "--backend", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "channel_shuffle" in report["passes"] and "fuse_parallel_convs" not in report["passes"]
    assert "Transpose" not in [n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node]
    assert main([*args, "--backend", "gpu"]) == 2
    assert "cpu, openvino, tensorrt" in capsys.readouterr().err
