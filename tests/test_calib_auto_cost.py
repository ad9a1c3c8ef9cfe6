"""What `--method auto` runs to score its candidates (issue #21: about one extra forward pass per candidate
over a few samples): counted in sessions and rows, never timed."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import pytest
from auto_models import image_like

from trtopt.calib import CalibConfig, calibrate, histogram_from_values
from trtopt.calib import auto as auto_module
from trtopt.calib.auto import choose_thresholds, distinct_candidates
from trtopt.calib.stage import bounded_at_max, calibrate_graph
from trtopt.calib.thresholds import AUTO_CANDIDATES, candidate_thresholds
from trtopt.data.config import DataConfig
from trtopt.frontend.loader import graph_from_onnx
from trtopt.zoo.builder import GraphBuilder


def _relu6_net() -> onnx.ModelProto:
    """x -> Conv -> Clip(0, 6) -> Conv -> Relu -> Conv 1x1 -> y: one bounded tensor (the Clip's output)."""
    g = GraphBuilder("relu6_net", seed=11, opset=13)
    x = g.input("x", [-1, 3, 16, 16])
    six = g.clip(g.conv(x, 3, 8, 3), 0.0, 6.0, out="six")
    hidden = g.relu(g.conv(six, 8, 8, 3), out="hidden")
    y = g.conv(hidden, 8, 4, 1, out="y")
    return g.build([y])


class _Counting:
    """Counts, per node, the single-node sessions auto builds and the rows they run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built: Counter[str] = Counter()
        self.rows: Counter[str] = Counter()
        build, errors = auto_module._NodeRunner._build, auto_module._NodeRunner.errors
        counting = self

        def counted_build(runner: Any, node: onnx.NodeProto, feeds: Any) -> object:
            counting.built[node.name] += 1
            return build(runner, node, feeds)

        def counted_errors(runner: Any, node: onnx.NodeProto, name: str, stacked: np.ndarray, *rest: Any) -> Any:
            counting.rows[node.name] += stacked.shape[0]
            return errors(runner, node, name, stacked, *rest)

        monkeypatch.setattr(auto_module._NodeRunner, "_build", counted_build)
        monkeypatch.setattr(auto_module._NodeRunner, "errors", counted_errors)


def _batches(count: int, seed: int, size: int = 8) -> list[dict[str, np.ndarray]]:
    data = image_like(count, (3, 16, 16), seed) * 3.0
    return [{"x": data[i : i + size]} for i in range(0, count, size)]


def _consumer_of(model: onnx.ModelProto, tensor: str) -> str:
    return next(n.name for n in model.graph.node if tensor in n.input)


def test_bounded_tensors_are_not_scored_and_end_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage gives a bounded tensor its maximum whatever auto chose: auto no longer scores it, and the
    thresholds and recorded methods are those of scoring it and overriding the choice afterwards."""
    model = _relu6_net()
    graph = graph_from_onnx(model)
    tensors = ["x", "six", "hidden"]
    calib, scoring = _batches(48, 0), [(b, 8) for b in _batches(8, 1)]
    counting = _Counting(monkeypatch)
    skipped = calibrate(model, calib, tensors, CalibConfig(method="auto"), score_batches=scoring, at_max={"six"})
    assert skipped.choices is not None and skipped.choices["six"] == "max"
    assert skipped.amax["six"] == skipped.histograms["six"].amax  # type: ignore[index]
    assert counting.built[_consumer_of(model, "six")] == 0 and counting.built[_consumer_of(model, "x")] == 1
    scored = calibrate(model, calib, tensors, CalibConfig(method="auto"), score_batches=scoring)
    assert counting.built[_consumer_of(model, "six")] == 1  # without at_max it is scored
    assert bounded_at_max(graph, skipped).amax == bounded_at_max(graph, scored).amax
    assert bounded_at_max(graph, skipped).choices == bounded_at_max(graph, scored).choices


def test_the_stage_passes_its_bounded_tensors(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    model = _relu6_net()
    graph = graph_from_onnx(model)
    np.savez(tmp_path / "calib.npz", x=np.concatenate([b["x"] for b in _batches(48, 2)]))
    from trtopt.data.samples import load_samples

    data = DataConfig(sources=(str(tmp_path / "calib.npz"),))
    counting = _Counting(monkeypatch)
    found = calibrate_graph(graph, model, ["x", "six", "hidden"], CalibConfig(),
                            dataset=load_samples(graph, None, data), data=data)  # fmt: skip
    assert found.choices is not None and found.choices["six"] == "max"
    assert counting.built[_consumer_of(model, "six")] == 0
    unbounded = calibrate_graph(graph, model, ["x", "six", "hidden"], CalibConfig(bounded_max=False),
                                dataset=load_samples(graph, None, data), data=data)  # fmt: skip
    assert counting.built[_consumer_of(model, "six")] == 1  # --no-bounded-max: auto chooses for it
    assert unbounded.amax["six"] <= found.amax["six"]


@pytest.mark.parametrize("method", ["auto", "entropy"])
def test_the_stage_finds_the_bounded_tensors_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, method: str) -> None:
    """One graph walk for the bounded set, shared by auto (which skips them) and the max rule (which sets them)."""
    from trtopt.calib import ranges
    from trtopt.data.samples import load_samples

    model = _relu6_net()
    graph = graph_from_onnx(model)
    np.savez(tmp_path / "calib.npz", x=np.concatenate([b["x"] for b in _batches(48, 4)]))
    data = DataConfig(sources=(str(tmp_path / "calib.npz"),))
    walks: list[set[str]] = []
    find = ranges.bounded_tensors
    monkeypatch.setattr(ranges, "bounded_tensors", lambda g: walks.append(find(g)) or walks[-1])
    found = calibrate_graph(graph, model, ["x", "six", "hidden"], CalibConfig(method=method),
                            dataset=load_samples(graph, None, data), data=data)  # fmt: skip
    assert walks == [{"six"}]
    assert found.amax["six"] == found.histograms["six"].amax  # type: ignore[index]


def test_each_consumer_runs_once_on_at_most_one_copy_per_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost model of issue #21: per scored tensor, each node reading it is built once and run on the
    scoring rows once per distinct candidate, never more (its float output comes from the FP32 run)."""
    model = _relu6_net()
    tensors = ["x", "six", "hidden"]
    hists = {n: histogram_from_values(v, name=n) for n, v in _activations(model, tensors).items()}
    options = {n: candidate_thresholds(h, CalibConfig()) for n, h in hists.items()}
    counting = _Counting(monkeypatch)
    rows = 8
    choices = choose_thresholds(model, options, [(b, 8) for b in _batches(rows, 3)])
    for name in tensors:
        node = _consumer_of(model, name)
        copies = len(distinct_candidates(options[name]))
        assert counting.built[node] == 1
        assert counting.rows[node] == copies * rows <= len(AUTO_CANDIDATES) * rows
        assert set(choices[name].scores) == set(distinct_candidates(options[name]))


def _activations(model: onnx.ModelProto, names: list[str]) -> dict[str, np.ndarray]:
    from trtopt.execution import OrtSession

    session = OrtSession(model, expose=[n for n in names if n != "x"])
    feeds = {"x": np.concatenate([b["x"] for b in _batches(32, 4)])}
    return {**feeds, **session.run(feeds, outputs=[n for n in names if n != "x"])}


def test_equal_candidates_are_scored_once_under_the_first_name() -> None:
    found = distinct_candidates({"entropy": 1.0, "mse": 2.0, "percentile": 1.0 + 1e-9, "max": 2.0})
    assert found == {"entropy": 1.0, "mse": 2.0}
