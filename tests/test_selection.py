"""End-to-end detectors: outputs picked by TopK / NonMaxSuppression are judged by what they pick from
(trtopt.verify.selection), in the build's verification and in the sensitivity search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtopt.build import BuildConfig, build_plan
from trtopt.data import DataConfig
from trtopt.execution import run_model
from trtopt.metrics.agreement import agreement
from trtopt.verify.selection import find_selection, judged_graph, judged_model

_N = helper.make_node


def _detector(head: str) -> onnx.ModelProto:
    """A small conv detector with its own post-processing: `head` "topk" (the 10 best scores and their boxes,
    as RT-DETR / YOLOv10 exports end) or "nms" (NonMaxSuppression's boxes, as many as it keeps)."""
    rng = np.random.default_rng(0)
    weights = {"w1": (16, 3, 3, 3), "w2": (32, 16, 3, 3), "ws": (1, 32, 1, 1), "wb": (4, 32, 1, 1)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32), n)
             for n, s in weights.items()]  # fmt: skip
    ints = {"flat": [1, -1], "box_shape": [1, 4, -1], "k": [10], "zero": [0], "two": [2], "col": [2]}
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ints.items()]
    inits += [numpy_helper.from_array(np.array([v], np.float32), n) for n, v in (("iou", 0.5), ("thr", 0.5))]
    inits += [numpy_helper.from_array(np.array([20], np.int64), "most")]
    nodes = [
        _N("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]), _N("Relu", ["c1"], ["r1"]),
        _N("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]), _N("Relu", ["c2"], ["r2"]),
        _N("Conv", ["r2", "ws"], ["logits"]), _N("Sigmoid", ["logits"], ["prob"]),
        _N("Reshape", ["prob", "flat"], ["scores"]),
        _N("Conv", ["r2", "wb"], ["raw_boxes"]), _N("Reshape", ["raw_boxes", "box_shape"], ["b4"]),
        _N("Transpose", ["b4"], ["boxes"], perm=[0, 2, 1]),
    ]  # fmt: skip
    if head == "peaks":  # CenterNet's NMS by max-pooling: the heat map where it is its own 3x3 maximum
        nodes += [_N("MaxPool", ["prob"], ["pooled"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  _N("Equal", ["prob", "pooled"], ["is_peak"]), _N("Cast", ["is_peak"], ["keep"], to=TensorProto.FLOAT),
                  _N("Mul", ["prob", "keep"], ["peaks"])]  # fmt: skip
        outputs = [("peaks", [1, 1, 8, 8])]
    elif head == "topk":
        nodes += [_N("TopK", ["scores", "k"], ["top", "index"], axis=1), _N("Squeeze", ["index", "zero"], ["i0"]),
                  _N("Gather", ["boxes", "i0"], ["picked"], axis=1)]  # fmt: skip
        outputs = [("top", [1, 10]), ("picked", [1, 10, 4])]
    else:
        nodes += [_N("Unsqueeze", ["scores", "zero"], ["s3"]),
                  _N("NonMaxSuppression", ["boxes", "s3", "most", "iou", "thr"], ["kept"]),
                  _N("Gather", ["kept", "col"], ["which"], axis=1), _N("Squeeze", ["boxes", "zero"], ["b2"]),
                  _N("Gather", ["b2", "which"], ["picked"], axis=0)]  # fmt: skip
        outputs = [("picked", ["kept", 4])]
    graph = helper.make_graph(
        nodes, head, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("head", ["topk", "nms"])
def test_selected_outputs_are_judged_by_the_scores_and_boxes_they_pick_from(head: str) -> None:
    model = _detector(head)
    found = find_selection(model)
    assert found is not None
    assert found.selected == (("top", "picked") if head == "topk" else ("picked",))
    assert set(found.judged) == {"prob", "raw_boxes"}, "the scores and boxes, before any reshape"
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    judged = run_model(judged_model(model, found), feeds)
    assert set(judged) == {*found.selected, "prob", "raw_boxes"} and judged["prob"].shape == (1, 1, 8, 8)


def test_a_peak_mask_is_judged_by_the_map_it_masks() -> None:
    """A rounding difference moves a peak of `Equal(x, MaxPool(x))` by a pixel and the masked map by whole peaks
    (afis's LEADER, round 13's hunt); a comparison of anything else is no selection."""
    selection = find_selection(_detector("peaks"))
    assert selection is not None and selection.selected == ("peaks",)
    assert set(selection.judged) == {"prob", "pooled"} and "peak mask" in selection.describe()
    other = _detector("peaks")
    for node in other.graph.node:
        if node.op_type == "Equal":
            node.input[1] = "prob"  # Equal(prob, prob): no max-pool, no peak
    assert find_selection(other) is None


def test_a_model_without_selection_is_judged_as_it_is() -> None:
    model = _detector("topk")
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 64]))
    assert find_selection(model) is None


def test_the_search_measures_the_graph_without_the_selection() -> None:
    from trtopt.frontend import graph_from_onnx

    graph = graph_from_onnx(_detector("topk"))
    convs = [n.name for n in graph.nodes if n.op == "Conv"]
    searched, layers = judged_graph(graph, [*convs, "TopK_10"])
    assert {t.name for t in searched.outputs} == {"prob", "raw_boxes"}
    assert not any(n.op in ("TopK", "Gather") for n in searched.nodes)
    assert {t.name for t in graph.outputs} == {"top", "picked"}, "the build's own graph is left as it was"
    assert len(convs) == 4 and layers == convs, "every conv feeds the judged tensors; the cut TopK is no layer"


def test_outputs_of_different_lengths_compare_without_a_traceback() -> None:
    """NMS keeps 30 boxes in one run and 32 in the other: the missing rows compare with zeros."""
    rng = np.random.default_rng(0)
    want = rng.random((32, 4)).astype(np.float32)
    found = agreement({"boxes": want[:30]}, {"boxes": want})
    assert 0.9 < found.cosine < 1.0 and found.top1 is not None


@pytest.mark.parametrize("head", ["topk", "nms", "peaks"])
def test_an_end_to_end_detector_builds_and_records_what_it_judged(tmp_path: Path, head: str) -> None:
    model_path = tmp_path / f"{head}.onnx"
    onnx.save(_detector(head), model_path)
    samples = np.random.default_rng(0).standard_normal((24, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "calib.npy", samples)
    result = build_plan(model_path, BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npy"),))))
    verification = result.verification
    assert verification is not None and verification.ok
    assert verification.judged is not None and "prob" in verification.judged
    assert head == "peaks" or "raw_boxes" in verification.judged
    assert verification.reference_vs_fp32.cosine > 0.98, "the scores and boxes before the selection"
    names = {"topk": ["top", "picked"], "nms": ["picked"], "peaks": ["peaks"]}[head]
    assert [o.name for o in result.plan.outputs] == names


def test_compare_names_the_selected_outputs_and_picks_no_task_from_them(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """TopK's sorted scores look like a classifier's [N, C] output, and their top-1 agreement is 100% in any run."""
    from trtopt.cli.main import main

    onnx.save(_detector("topk"), tmp_path / "topk.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((24, 3, 32, 32)).astype(np.float32))
    common = [str(tmp_path / "topk.onnx")]
    assert main(["build", *common, "--int8", "--calib", str(tmp_path / "x.npy"), "-o", str(tmp_path / "p.engine")]) == 0
    capsys.readouterr()
    assert main(["compare", *common, str(tmp_path / "p.engine"), "--data", str(tmp_path / "x.npy")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "top, picked come after TopK" in said and "(raw_boxes, prob)" in said
    assert "task: classify" not in said and "task: raw" in said


def test_a_selection_of_token_positions_before_the_network_is_no_selected_output() -> None:
    """A transformer export that picks positions with NonZero of its input mask selects before any layer has
    run: its outputs are the network's own, judged as they are."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [_N("MatMul", ["x", "w"], ["h"]), _N("NonZero", ["mask"], ["where"]), _N("Transpose", ["where"], ["at"]),
             _N("GatherND", ["h", "at"], ["picked"]), _N("MatMul", ["picked", "w"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "tokens",
        [helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 5]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w],
    )  # fmt: skip
    assert find_selection(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])) is None


def test_a_backend_that_runs_an_engine_is_verified_on_the_outputs_it_computes(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A TensorRT engine computes its graph outputs only, not the judged tensors: its kernels are compared on
    the outputs no selection computes (here none), the reference on the judged tensors, and nothing fails."""
    from trtopt.backend import get_backend

    monkeypatch.setattr(type(get_backend("cpu")), "runner_section", "engine")  # as TensorRT's: the ONNX is not run
    onnx.save(_detector("nms"), tmp_path / "nms.onnx")
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).standard_normal((24, 3, 32, 32)).astype(np.float32))
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npy"),)))
    verification = build_plan(tmp_path / "nms.onnx", config).verification
    assert verification is not None and verification.ok and verification.judged is not None
    assert verification.reference_vs_fp32.cosine > 0.98


def test_a_long_selection_is_named_shortly_and_listed_whole_in_json(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """torchvision's SSDlite export selects its boxes from 90 Gather outputs: the note names four and counts the rest,
    `--json` lists every one."""
    from trtopt.cli.main import main
    from trtopt.verify.selection import short_list

    assert short_list([f"t{i}" for i in range(90)]) == "t0, t1, t2, t3 (+86 more)"
    assert short_list(("a", "b")) == "a, b"
    onnx.save(_detector("topk"), tmp_path / "topk.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((24, 3, 32, 32)).astype(np.float32))
    common = [str(tmp_path / "topk.onnx")]
    assert main(["build", *common, "--int8", "--calib", str(tmp_path / "x.npy"), "-o", str(tmp_path / "p.engine")]) == 0
    capsys.readouterr()
    assert main(["compare", *common, str(tmp_path / "p.engine"), "--data", str(tmp_path / "x.npy"), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["selected"] == ["top", "picked"] and sorted(found["judged"]) == ["prob", "raw_boxes"]
