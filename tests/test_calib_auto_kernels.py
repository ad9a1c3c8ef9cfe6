"""`--method auto`'s compiled scoring loops (trtopt/calib/auto_kernels.py) against numpy and ONNX Runtime, and
the scores of a small model with them against the scores of running every consumer in ONNX Runtime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from auto_models import image_like

from trtopt.calib import CalibConfig, histogram_from_values
from trtopt.calib import auto as auto_module
from trtopt.calib import auto_kernels as kernels
from trtopt.calib.auto import choose_thresholds, fake_quantize
from trtopt.calib.thresholds import candidate_thresholds
from trtopt.execution import OrtSession
from trtopt.zoo.builder import GraphBuilder

AMAXES = np.array([0.7, 1.9, 3.3, 7.5])


def _values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 2.5).astype(np.float32)


def test_quantize_stack_is_fake_quantize_bit_for_bit() -> None:
    values = _values((3, 5, 7, 9), 0)  # 945 values: not a multiple of any vector width
    stacked = kernels.quantize_stack(values, AMAXES)
    assert stacked.shape == (len(AMAXES), *values.shape) and stacked.dtype == np.float32
    for part, amax in zip(stacked, AMAXES, strict=True):
        assert np.array_equal(part, fake_quantize(values, float(amax)))
    assert np.abs(stacked[0]).max() == pytest.approx(0.7, rel=1e-6)  # the smallest threshold clips


def test_squared_errors_match_float64_sums() -> None:
    reference = _values((2, 3, 11, 13), 1)
    parts = kernels.quantize_stack(reference, AMAXES)
    errors, energy = kernels.squared_errors(parts, reference)
    diffs = (parts - reference).astype(np.float64).reshape(len(AMAXES), -1)
    np.testing.assert_allclose(errors, (diffs**2).sum(axis=1), rtol=1e-12)
    assert energy == pytest.approx(float((reference.astype(np.float64) ** 2).sum()), rel=1e-12)
    assert errors[0] > errors[-1] > 0  # clipping at 0.7 costs more than rounding at 7.5


def _node_outputs(op: str, stacked: np.ndarray, other: np.ndarray, scored_first: bool) -> np.ndarray:
    """`op` run by ONNX Runtime on every part of `stacked` with `other`."""
    g = GraphBuilder("elementwise", seed=0, opset=13)
    a = g.input("a", [-1, *stacked.shape[2:]])
    b = g.input("b", list(other.shape))
    out = g.node(op, [a, b] if scored_first else [b, a], out="y")
    session = OrtSession(g.build([out]))
    return np.stack([session.run({"a": part, "b": other})["y"] for part in stacked])


@pytest.mark.parametrize("op", sorted(kernels.ELEMENTWISE))
@pytest.mark.parametrize("scored_first", [True, False])
@pytest.mark.parametrize("other_shape", [(4, 6, 5, 5), (1, 6, 1, 1)])
def test_elementwise_errors_match_onnx_runtime(op: str, scored_first: bool, other_shape: tuple[int, ...]) -> None:
    values = _values((4, 6, 5, 5), 2)
    other = _values(other_shape, 3)
    stacked = kernels.quantize_stack(values, AMAXES)
    reference = _node_outputs(op, values[None], other, scored_first)[0]
    errors, energy = kernels.elementwise_errors(op, stacked, other, reference, scored_first=scored_first)
    outputs = _node_outputs(op, stacked, other, scored_first)
    expected = ((outputs - reference).astype(np.float64) ** 2).reshape(len(AMAXES), -1).sum(axis=1)
    np.testing.assert_allclose(errors, expected, rtol=1e-12)
    assert energy == pytest.approx(float((reference.astype(np.float64) ** 2).sum()), rel=1e-12)


def test_numpy_fallback_loops_agree_with_the_compiled_ones() -> None:
    values, other = _values((2, 3, 7, 7), 4), _values((2, 3, 7, 7), 5)
    flat = values.reshape(-1)
    scales = (AMAXES / 127).astype(np.float32)
    compiled, fallback = np.empty((4, flat.size), np.float32), np.empty((4, flat.size), np.float32)
    kernels._kernels()["quantize"](flat, scales, compiled)
    kernels._quantize_numpy(flat, scales, fallback)
    assert np.array_equal(compiled, fallback)
    for op, code in kernels.ELEMENTWISE.items():
        found = [np.zeros(4), np.zeros(1)], [np.zeros(4), np.zeros(1)]
        kernels._kernels()["elementwise"](compiled, other.reshape(-1), flat, code, True, *found[0])
        kernels._elementwise_numpy(compiled, other.reshape(-1), flat, code, True, *found[1])
        np.testing.assert_allclose(found[0][0], found[1][0], rtol=1e-12, err_msg=op)
        np.testing.assert_allclose(found[0][1], found[1][1], rtol=1e-12, err_msg=op)


def _residual_net() -> onnx.ModelProto:
    """x -> Conv -> Relu (r) -> Conv (c) -> Add(c, r) (s) -> Mul(s, per-channel const) (m) -> Sub(x2, m) -> y,
    where x2 = Conv(x), and Concat(s, x2, s) on the channels -> cat: Add, Mul, Sub and Concat each read scored
    tensors, with an input and a constant; the Concat reads one of them twice."""
    g = GraphBuilder("residual_net", seed=13, opset=13)
    x = g.input("x", [-1, 3, 12, 12])
    r = g.relu(g.conv(x, 3, 8, 3), out="r")
    c = g.conv(r, 8, 8, 3, out="c")
    s = g.node("Add", [c, r], out="s")
    scale = g.const("scale", np.linspace(0.2, 3.0, 8, dtype=np.float32).reshape(1, 8, 1, 1))
    m = g.node("Mul", [s, scale], out="m")
    x2 = g.conv(x, 3, 8, 3, out="x2")
    y = g.node("Sub", [x2, m], out="y")
    cat = g.node("Concat", [s, x2, s], axis=1, out="cat")
    return g.build([y, cat])


def _scores(model: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch, *, through_ort: bool) -> dict[str, Any]:
    names = ["x", "r", "c", "s", "m", "x2"]
    data = image_like(40, (3, 12, 12), 6) * 3.0
    session = OrtSession(model, expose=names[1:])
    values = {"x": data[:32], **session.run({"x": data[:32]}, outputs=names[1:])}
    options = {n: candidate_thresholds(histogram_from_values(values[n], name=n), CalibConfig()) for n in names}
    built: list[str] = []
    build = auto_module._NodeRunner._build

    def counted(runner: Any, node: onnx.NodeProto, feeds: Any) -> object:
        built.append(node.op_type)
        return build(runner, node, feeds)

    with monkeypatch.context() as patch:
        patch.setattr(auto_module._NodeRunner, "_build", counted)
        if through_ort:
            patch.setattr(auto_module._NodeRunner, "_elementwise", lambda *args: None)
            patch.setattr(auto_module._NodeRunner, "_concat", lambda *args: None)
        choices = choose_thresholds(model, options, [({"x": data[32:]}, 8)])
    return {"choices": choices, "built": built}


def test_scores_equal_those_of_running_every_consumer_in_onnx_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _residual_net()
    fast = _scores(model, monkeypatch, through_ort=False)
    slow = _scores(model, monkeypatch, through_ort=True)
    assert not {"Add", "Mul", "Sub", "Concat"} & set(fast["built"])  # computed without a session
    assert {"Add", "Mul", "Sub", "Concat"} <= set(slow["built"])
    for name, choice in slow["choices"].items():
        found = fast["choices"][name]
        assert (found.method, found.amax, found.scored_by) == (choice.method, choice.amax, choice.scored_by)
        assert found.scores.keys() == choice.scores.keys()
        for method, score in choice.scores.items():
            assert found.scores[method] == pytest.approx(score, rel=1e-9, abs=1e-15), (name, method)
    assert len({round(s, 12) for s in fast["choices"]["s"].scores.values()}) > 1  # the candidates differ


def _cache_names(model: onnx.ModelProto) -> list[str]:
    return sorted(
        {t for n in model.graph.node for t in (*n.input, *n.output)} - {i.name for i in model.graph.initializer}
    )


@pytest.mark.parametrize("sizes", [[1] * 5, [2, 2, 2], [1, 1, (2, 1)]])  # (size, rows): a padded last batch
def test_the_cache_written_in_place_equals_the_joined_batches(sizes: list[Any]) -> None:
    model = _residual_net()
    names = _cache_names(model)
    session = OrtSession(model, expose=[n for n in names if n != "x"], spin=False)
    data = image_like(8, (3, 12, 12), 7)
    batches, start = [], 0
    for item in sizes:
        size, rows = item if isinstance(item, tuple) else (item, item)
        batches.append(({"x": data[start : start + size]}, rows))
        start += rows
    fast, plain = auto_module._run(session, batches, names), auto_module._run_plain(session, batches, names)
    assert fast.keys() == plain.keys()
    for name in names:
        assert fast[name].shape[0] == start and np.array_equal(fast[name], plain[name]), name


def test_the_cache_falls_back_to_joining_when_a_batch_changes_shape() -> None:
    g = GraphBuilder("any_size", seed=2, opset=13)
    x = g.input("x", [-1, 3, -1, -1])
    y = g.conv(g.relu(g.conv(x, 3, 4, 3), out="r"), 4, 4, 1, out="y")
    model = g.build([y])
    session = OrtSession(model, expose=["r"], spin=False)
    batches = [({"x": image_like(1, (3, 8, 8), 8)}, 1), ({"x": image_like(1, (3, 12, 12), 9)}, 1)]
    fast, plain = (
        auto_module._run(session, batches, ["r", "x", "y"]),
        auto_module._run_plain(session, batches, ["r", "x", "y"]),
    )
    for name in ("r", "x", "y"):
        assert np.array_equal(fast[name], plain[name])
    assert fast["r"].shape[0] == 1  # unlike shapes: the first batch's, as joining always kept them


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_mse_search_agrees_with_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(30_000), rng.laplace(size=30_000), rng.exponential(size=30_000) ** 3][seed % 3]
    hist = histogram_from_values(np.abs(values) if seed == 3 else values, name="t")
    centres = (np.arange(hist.num_bins) + 0.5) * hist.bin_width
    weights = hist.counts.astype(np.float64)
    candidates = (np.arange(128, hist.used_bins) + 0.5) * hist.bin_width
    compiled, fallback = kernels.mse_errors(centres, weights, candidates), np.empty(candidates.size)
    kernels._mse_numpy(centres, weights, candidates, fallback)
    np.testing.assert_allclose(compiled, fallback, rtol=1e-12)
    assert int(np.argmin(compiled)) == int(np.argmin(fallback))
    assert 0 < np.argmin(compiled) < candidates.size - 1  # an interior minimum: clipping and rounding both count
