"""Automatic exclusion by measured sensitivity (trtopt.search.sensitivity; issue #16 part 3)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from auto_models import heavy_tail_conv, heavy_tail_data

from trtopt.build import BuildConfig, build_plan
from trtopt.calib.config import CalibConfig as StageCalibConfig
from trtopt.data.config import DataConfig
from trtopt.engine import Engine
from trtopt.execution import OrtSession
from trtopt.quant import QuantConfig as StageQuantConfig
from trtopt.search.sensitivity import (
    CANDIDATES,
    LATER,
    MIN_COSINE,
    MIN_GAIN,
    ROUNDS,
    find_sensitive_layers,
    rank_by_added_error,
)

MANY = CANDIDATES + 24  # more layers than the search tries alone


def _measure(costs: dict[str, float], calls: list[tuple[str, ...]]):  # type: ignore[no-untyped-def]
    """A plan whose cosine is 1 minus the summed cost of its INT8 layers."""

    def measure(exclude: Sequence[str]) -> float:
        calls.append(tuple(exclude))
        return 1.0 - sum(cost for layer, cost in costs.items() if layer not in exclude)

    return measure


def test_a_plan_that_is_close_enough_is_left_alone() -> None:
    calls: list[tuple[str, ...]] = []
    found = find_sensitive_layers(_measure({"a": 0.001, "b": 0.002}, calls), ["a", "b"])
    assert found.layers == {} and found.before == found.after == 0.997 and calls == [()]


def test_greedy_keeps_the_fewest_most_sensitive_layers_float() -> None:
    costs = {f"l{i}": 0.0005 for i in range(10)} | {"big": 0.02, "mid": 0.012}
    found = find_sensitive_layers(_measure(costs, []), list(costs))
    assert list(found.layers) == ["big", "mid"]  # 0.963 -> 0.983 after one, 0.995 after two
    assert found.before < MIN_COSINE <= found.after
    assert "sensitivity" in found.layers["big"]


def test_layers_that_do_not_help_are_not_kept_float_and_the_share_is_capped() -> None:
    costs = {f"l{i}": 0.004 for i in range(8)}  # eight equal culprits: the cap (a quarter) stops at two
    found = find_sensitive_layers(_measure(costs, []), list(costs))
    assert len(found.layers) == 2 and found.after < MIN_COSINE
    useless = find_sensitive_layers(lambda exclude: 0.5, ["a", "b"])
    assert useless.layers == {} and useless.after == 0.5


def test_layers_that_gain_less_than_the_minimum_are_neither_kept_nor_tried_together() -> None:
    """More layers than CANDIDATES, each costing a little under MIN_GAIN (a detector far from the aim, as
    ddddocr-det): each alone helps, none enough to pay for a float layer; no greedy trial is run after the
    alone ones."""
    costs = {f"l{i:02d}": MIN_GAIN * 0.9 for i in range(MANY)}
    calls: list[tuple[str, ...]] = []
    found = find_sensitive_layers(_measure(costs, calls), list(costs), rank=lambda: sorted(costs))
    assert found.layers == {} and found.after == found.before < MIN_COSINE
    assert calls[1] == tuple(sorted(costs)[:CANDIDATES])  # every candidate float at once: 0.978, not hopeless
    assert found.trials == len(calls) == 2 + CANDIDATES and all(len(c) <= 1 for c in calls[2:])


def test_the_greedy_stage_stops_at_the_first_candidate_below_the_minimum_gain() -> None:
    """One layer that matters, the rest costing half MIN_GAIN: it alone is kept, in one greedy trial
    (its own alone trial); the next round tries the other first LATER candidates once on top of it, keeps
    none, and the search ends there (no further round: the plan did not change)."""
    costs = {f"l{i:02d}": MIN_GAIN / 2 for i in range(MANY)} | {"big": 0.05}
    calls: list[tuple[str, ...]] = []
    ranked = [f"l{i:02d}" for i in range(MANY)]
    ranked.insert(3, "big")
    found = find_sensitive_layers(_measure(costs, calls), list(costs), rank=lambda: ranked)
    assert list(found.layers) == ["big"] and found.after < MIN_COSINE
    on_top = [c for c in calls[2:] if len(c) > 1]  # after the plan and its ceiling (trtopt.search._ceiling)
    assert LATER < CANDIDATES and found.trials == len(calls) == 2 + CANDIDATES + LATER - 1
    assert sorted(c[1] for c in on_top) == sorted(set(ranked[:LATER]) - {"big"})
    assert {c[0] for c in on_top} == {"big"}


def _outputs(fixes: dict[str, str], errors: dict[str, float], calls: list[tuple[str, ...]]):  # type: ignore[no-untyped-def]
    """A plan with several outputs, each of whose error one layer (`fixes`: layer -> output) removes; its
    worst cosine is the lowest over the outputs."""

    def measure(exclude: Sequence[str]) -> float:
        calls.append(tuple(exclude))
        return min(1.0 - (0.0 if any(fixes.get(layer) == out for layer in exclude) else e) for out, e in errors.items())

    return measure


def test_a_later_round_keeps_a_layer_that_gained_nothing_alone_because_another_output_was_worst() -> None:
    """Output A is worst: only "a" gains alone. With "a" float, output B is worst, and the next round, each
    candidate tried on top of "a", finds "b", which alone had gained nothing."""
    calls: list[tuple[str, ...]] = []
    measure = _outputs({"a": "A", "b": "B"}, {"A": 0.03, "B": 0.02, "C": 0.004}, calls)
    layers = ["a", "b", *(f"l{i}" for i in range(10))]
    found = find_sensitive_layers(measure, layers)
    assert list(found.layers) == ["a", "b"] and found.before == pytest.approx(0.97)
    assert found.after == pytest.approx(0.996) and found.after >= MIN_COSINE
    assert found.trials == len(calls) == 1 + len(layers) + len(layers) - 1  # no further round: the aim is reached
    assert "alone it lifts" in found.layers["a"] and "beside the 1 kept float before it" in found.layers["b"]


def test_the_rounds_are_bounded() -> None:
    """Each output fixed by its own layer, one per round: ROUNDS rounds keep ROUNDS layers, then it stops
    short of the aim; every trial is counted."""
    errors = {f"O{i}": 0.03 - 0.002 * i for i in range(ROUNDS + 2)}
    calls: list[tuple[str, ...]] = []
    layers = [f"x{i}" for i in range(len(errors))] + [f"l{i}" for i in range(20)]
    found = find_sensitive_layers(_outputs({f"x{i}": f"O{i}" for i in range(len(errors))}, errors, calls), layers)
    assert list(found.layers) == [f"x{i}" for i in range(ROUNDS)] and found.after < MIN_COSINE
    assert found.trials == len(calls) == 1 + sum(len(layers) - r for r in range(ROUNDS))


def test_a_layer_joined_to_the_chosen_ones_must_still_gain_the_minimum() -> None:
    """Two layers whose errors overlap (keeping either float removes most of the shared error): the second
    gains too little beside the first, so only one is kept."""

    def measure(exclude: Sequence[str]) -> float:
        shared = 0.0 if {"a", "b"} & set(exclude) else 0.03  # beside 0.05 no layer removes
        return 0.95 - shared - (0.0 if "a" in exclude else MIN_GAIN / 2) - (0.0 if "b" in exclude else MIN_GAIN / 3)

    found = find_sensitive_layers(measure, list("abcdefgh"))  # the cap: two greedy steps
    assert list(found.layers) == ["a"]
    assert found.trials == 1 + 8 + 1 + 6  # the next round tries the 6 others on top of "a" ("b" was: not again)


def test_a_layer_that_reaches_the_aim_alone_ends_the_search() -> None:
    costs = {f"l{i:02d}": 0.0001 for i in range(MANY)} | {"big": 0.02}
    calls: list[tuple[str, ...]] = []
    ranked = [f"l{i:02d}" for i in range(MANY)]
    ranked.insert(2, "big")  # the third candidate alone lifts the plan past MIN_COSINE
    found = find_sensitive_layers(_measure(costs, calls), list(costs), rank=lambda: ranked)
    assert list(found.layers) == ["big"] and found.after >= MIN_COSINE
    assert calls == [(), tuple(ranked[:CANDIDATES]), ("l00",), ("l01",), ("big",)] and found.trials == 5


def test_build_keeps_the_heavy_tail_conv_float_when_entropy_ruins_it(tmp_path: Path) -> None:
    """Forced entropy on the PP-OCR miniature: cosine 0.85; the analysis keeps its one conv float."""
    onnx.save_model(heavy_tail_conv(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=heavy_tail_data(96, 0))
    held = {"x": heavy_tail_data(16, 2)}
    expected = OrtSession(heavy_tail_conv()).run(held)["y"].ravel()
    results = {}
    for auto_exclude in (True, False):
        config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                             calib=StageCalibConfig(method="entropy"),
                             quant=StageQuantConfig(auto_exclude=auto_exclude))  # fmt: skip
        result = build_plan(tmp_path / "m.onnx", config)
        with Engine(result.plan) as engine:
            got = engine.infer(held)["y"].ravel()
        results[auto_exclude] = (float(got @ expected / np.linalg.norm(got) / np.linalg.norm(expected)), result)
    kept, plain = results[True], results[False]
    assert kept[0] > 0.999 and plain[0] < 0.95
    sensitivity = kept[1].plan.metadata["sensitivity"]
    assert list(sensitivity["layers"]) == list(kept[1].qdq.float_layers) and sensitivity["after"] > MIN_COSINE
    assert "sensitivity" not in plain[1].plan.metadata


def test_a_search_on_fewer_samples_than_it_is_made_for_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With 16 calibration samples the search measures on 8 and confirms on 8 (table-cls on 16 pages kept 1 layer
    and scored 0.9826 held out, on 32 pages 4 layers and 0.9909: docs/zoo.md); the build says so and how many
    it wants. With enough samples, or when the search does not run, nothing is said."""
    onnx.save_model(heavy_tail_conv(), tmp_path / "m.onnx")
    for count, searched in ((16, True), (40, False)):
        np.savez(tmp_path / "calib.npz", x=heavy_tail_data(count, 0))
        config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                             calib=StageCalibConfig(method="entropy"))  # fmt: skip
        caplog.clear()
        with caplog.at_level("WARNING", logger="trtopt.search.sensitivity"):
            result = build_plan(tmp_path / "m.onnx", config)
        assert result.plan.metadata["sensitivity"]["trials"] > 0  # the search ran both times
        said = "had 16 calibration samples: it searched on 8 and confirmed on 8; with 24 or more it searches on 16"
        assert (said in caplog.text) == searched, caplog.text


def test_only_the_ranked_candidates_are_tried_alone_and_the_cap_counts_every_layer() -> None:
    costs = {f"l{i:02d}": 0.0001 for i in range(MANY)} | {"big": 0.02, "mid": 0.012}
    calls: list[tuple[str, ...]] = []
    ranked = ["big", "mid", *(f"l{i:02d}" for i in range(MANY))]
    found = find_sensitive_layers(_measure(costs, calls), list(costs), rank=lambda: ranked)
    assert list(found.layers) == ["big", "mid"]
    alone = {c[0] for c in calls if len(c) == 1}
    assert alone == set(ranked[:CANDIDATES]) and found.trials == 2 + CANDIDATES + 1


def test_each_trial_is_reported_and_the_report_ends_full() -> None:
    costs = {f"l{i:02d}": 0.0001 for i in range(MANY)} | {"big": 0.02, "mid": 0.012}
    calls: list[tuple[str, ...]] = []
    reports: list[tuple[int, int]] = []
    ranked = ["big", "mid", *(f"l{i:02d}" for i in range(MANY))]
    found = find_sensitive_layers(_measure(costs, calls), list(costs), rank=lambda: ranked,
                                  on_trial=lambda done, most: reports.append((done, most)))  # fmt: skip
    most = reports[0][1]
    assert all(m == most for _, m in reports[:-1]) and most >= found.trials
    counts = [done for done, _ in reports]
    assert counts[:-1] == list(range(1, len(calls) + 1))  # one per measurement
    assert reports[-1] == (len(calls), len(calls)) < (most, most)  # then full at the trials run, not at the bound
    quiet: list[tuple[int, int]] = []
    find_sensitive_layers(_measure({"a": 0.001}, []), ["a"], on_trial=lambda d, m: quiet.append((d, m)))
    assert quiet == []  # close enough at once: no search, no bar


def test_the_build_reports_its_sensitivity_trials_to_the_progress_callback(tmp_path: Path) -> None:
    from trtopt.calib.collect import CalibProgress
    from trtopt.search.sensitivity import SENSITIVITY_PHASE

    onnx.save_model(heavy_tail_conv(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=heavy_tail_data(64, 0))
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                         calib=StageCalibConfig(method="entropy"))  # fmt: skip
    reports: list[CalibProgress] = []
    build_plan(tmp_path / "m.onnx", config, progress=reports.append)
    trials = [r for r in reports if r.phase == SENSITIVITY_PHASE]
    assert trials and trials[-1].samples == trials[-1].total_samples
    seconds = [r.seconds for r in trials]  # how long the search has run: the log lines say it
    assert seconds == sorted(seconds) and seconds[-1] > 0


def _chain(weights: list[np.ndarray]) -> onnx.ModelProto:
    """x -> conv0 -> Relu -> conv1 -> Relu -> conv2 -> y, 8 channels, 3x3 same padding."""
    nodes, inits, prev = [], [], "x"
    for i, w in enumerate(weights):
        inits.append(onnx.numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == len(weights) - 1 else f"c{i}"
        nodes.append(onnx.helper.make_node("Conv", [prev, f"w{i}"], [out], name=f"conv{i}", pads=[1, 1, 1, 1]))
        if out != "y":
            nodes.append(onnx.helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
    graph = onnx.helper.make_graph(
        nodes, "chain", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 12, 12])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])


def test_ranking_puts_the_layer_that_adds_the_error_first_not_the_ones_after_it() -> None:
    import onnx_graphsurgeon as gs

    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32) for _ in range(3)]
    noisy = [w.copy() for w in weights]
    noisy[1] += rng.normal(0, 0.1, noisy[1].shape).astype(np.float32)  # conv1 "quantised" badly
    noisy[2] += rng.normal(0, 0.003, noisy[2].shape).astype(np.float32)  # conv2 only a little
    batches = [({"x": rng.normal(0, 1, (1, 8, 12, 12)).astype(np.float32)}, 1) for _ in range(3)]
    order = rank_by_added_error(gs.import_onnx(_chain(weights)), _chain(noisy), batches, ["conv0", "conv1", "conv2"])
    assert order[0] == "conv1" and order[-1] == "conv0"  # conv2 receives conv1's error but adds little


def _branchy() -> onnx.ModelProto:
    """Branches of unlike ranges joined by a Concat (which the build floats), a residual Add reading an
    upstream branch beside a downstream one, and two outputs, one early: what a cut trial must get right."""
    from auto_models import unlike_branches

    from trtopt.zoo.builder import GraphBuilder

    g = GraphBuilder("branchy", seed=11, opset=13)
    small, joined = unlike_branches(g)
    head = g.relu(g.conv(joined, 32, 16, 1))
    mixed = g.add(head, g.conv(small, 16, 16, 3))  # reads a branch upstream of the Concat
    early = g.conv(small, 16, 4, 1, out="early")
    out = g.conv(g.relu(g.conv(mixed, 16, 16, 3)), 16, 8, 1, out="out")
    return g.build([out, early])


def _captured_build(tmp_path: Path, monkeypatch: Any) -> dict[str, Any]:
    """The arguments `trtopt.build` gives the sensitivity search for `_branchy` (entropy, bias correction on)."""
    from auto_models import image_like

    import trtopt.quantize

    onnx.save_model(_branchy(), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=image_like(24, (3, 12, 12), 0))
    seen: dict[str, Any] = {}

    def capture(graph, quant, plan, calibration, data, batch, progress=None, lower=None):  # type: ignore[no-untyped-def]
        seen.update(graph=graph.copy(), quant=quant, plan=plan, calibration=calibration, data=data, batch=batch,
                    lower=lower)
        return plan, None

    monkeypatch.setattr(trtopt.quantize, "float_sensitive_layers", capture)
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(tmp_path / "calib.npz"),)),
                         calib=StageCalibConfig(method="entropy"))  # fmt: skip
    build_plan(tmp_path / "m.onnx", config)
    return seen


def test_a_cut_trial_measures_the_cosine_of_the_whole_trial_graph(tmp_path: Path, monkeypatch: Any) -> None:
    """Every layer kept float alone, and pairs of them, measured by the downstream-only run (with the whole
    cache and with none kept, so every boundary is recomputed) and by the full Q/DQ rebuild run whole."""
    from trtopt.data.dataset import sample_batches
    from trtopt.execution import OrtSession
    from trtopt.frontend import onnx_from_graph
    from trtopt.search._trials import DownstreamTrials, output_figures, worst_cosine
    from trtopt.search.sensitivity import SAMPLES, quantized_model
    from trtopt.verify import collect

    seen = _captured_build(tmp_path, monkeypatch)
    graph, quant, calibration = seen["graph"], seen["quant"], seen["calibration"]
    layers = list(seen["plan"].quantized_layers)
    batches = sample_batches(seen["data"], 8, SAMPLES)
    expected = collect(OrtSession(onnx_from_graph(graph)).run, batches)
    base = quantized_model(graph, quant, calibration, True)
    cached, bare = DownstreamTrials(base, batches, layers), DownstreamTrials(base, batches, layers, budget=0)
    assert cached.kept_bytes > bare.kept_bytes
    trials = [(layer,) for layer in layers] + [(a, b) for a, b in zip(layers, layers[1:], strict=False)]
    cosines = set()
    for exclude in trials:
        model = quantized_model(graph, quant, calibration, True, exclude)
        whole = worst_cosine(model, batches, expected)
        for trial in (cached, bare):
            assert abs(output_figures(trial.run(model), batches, expected).min() - whole) < 1e-9, exclude
        cosines.add(round(whole, 6))
    assert len(cosines) > len(trials) // 2  # the trials differ: the comparison is not of one plan with itself
    cached.nodes_run = 0
    cached.run(quantized_model(graph, quant, calibration, True, (layers[-1],)))
    assert 0 < cached.nodes_run < len(base.graph.node) // 2  # the last layer's trial runs a small part


def test_the_confirmation_samples_refuse_a_layer_that_helps_on_the_search_samples_alone() -> None:
    """ "lucky" lifts the search samples most but nothing else; "real" helps on both: only it is kept, and
    the search goes on past the search samples' aim while the confirmation samples fall short."""
    search = {"lucky": 0.02, "real": 0.006, "more": 0.004}  # each layer's gain when kept float
    confirm = {"lucky": 0.0, "real": 0.006, "more": 0.004}

    def measured(gains: dict[str, float], start: float):  # type: ignore[no-untyped-def]
        return lambda exclude: start + sum(gains.get(layer, 0.0) for layer in exclude)

    layers = [*search, *(f"l{i}" for i in range(9))]
    found = find_sensitive_layers(measured(search, 0.975), layers, confirm=measured(confirm, 0.97))
    assert list(found.layers) == ["real", "more"] and "lucky" in found.refused
    assert found.confirmed == pytest.approx((0.97, 0.98))
    unguarded = find_sensitive_layers(measured(search, 0.975), layers)
    assert list(unguarded.layers) == ["lucky"]  # 0.995 on the search samples: it stops there
    assert found.to_dict()["confirmed"]["after"] == pytest.approx(0.98) and "refused" not in unguarded.to_dict()


def test_per_sample_confirmation_refuses_a_layer_only_on_evidence_beyond_the_noise() -> None:
    """Per-sample confirmation cosines: "flat" gains nothing on any confirmation sample (refused); "spread"
    gains nothing on average but its samples move both ways by far more than `MIN_GAIN`, which 8 samples
    cannot tell from a real gain (kept); "small" gains a little on every sample, below `MIN_GAIN` (refused)."""
    search = {"flat": 0.02, "spread": 0.008, "small": 0.004}
    moves = {"flat": np.zeros(8), "spread": np.resize([0.03, -0.03], 8), "small": np.full(8, MIN_GAIN / 2)}

    def confirm(exclude: Sequence[str]) -> np.ndarray:
        return np.full(8, 0.97) + sum((moves.get(layer, np.zeros(8)) for layer in exclude), np.zeros(8))

    layers = [*search, *(f"l{i}" for i in range(9))]
    measure = lambda ex: 0.975 + sum(search.get(layer, 0.0) for layer in ex)  # noqa: E731
    found = find_sensitive_layers(measure, layers, confirm=confirm)
    assert list(found.layers) == ["spread"] and set(found.refused) == {"flat", "small"}
    assert found.confirmed == pytest.approx((0.97, 0.97))


def test_a_plan_the_search_samples_pass_but_the_confirmation_samples_do_not_is_searched() -> None:
    """0.992 on the search samples, 0.975 on the confirmation ones: the search runs (it used to stop at the
    first figure) and keeps the layer that lifts both past the aim."""
    gains = {"real": 0.02}
    layers = ["real", *(f"l{i}" for i in range(7))]
    measure = lambda ex: 0.992 + 0.005 * ("real" in ex)  # noqa: E731
    confirm = lambda ex: 0.975 + sum(gains.get(layer, 0.0) for layer in ex)  # noqa: E731
    found = find_sensitive_layers(measure, layers, confirm=confirm)
    assert list(found.layers) == ["real"] and found.confirmed == pytest.approx((0.975, 0.995))
    assert find_sensitive_layers(measure, layers, confirm=lambda ex: 0.991).layers == {}  # both pass: left alone


def test_the_search_figure_is_the_lower_of_the_per_sample_and_all_element_cosines() -> None:
    """Two logits per sample whose signs INT8 keeps but whose sizes it does not: each sample's cosine is
    near 1, the all-element cosine (what `trtopt compare` and the zoo benchmark report) is not; the
    search's figure is the lower one, and a perfect plan scores 1."""
    from trtopt.metrics.agreement import agreement
    from trtopt.search._trials import cosine_figure

    want = {"logits": np.array([[4.0, -4.0], [0.5, -0.5], [3.0, -3.1], [0.4, -0.6]])}
    got = {"logits": want["logits"] * np.array([[0.5], [4.0], [0.5], [4.0]])}  # per-sample cosine exactly 1
    whole = float(got["logits"].ravel() @ want["logits"].ravel()) / np.linalg.norm(got["logits"]) / np.linalg.norm(
        want["logits"])  # fmt: skip
    assert agreement(got, want).cosine == pytest.approx(1.0) and whole < 0.8
    assert cosine_figure(got, want) == pytest.approx(whole)
    assert cosine_figure(want, want) == pytest.approx(1.0)
    assert cosine_figure({"logits": want["logits"] * np.nan}, want) == -1.0


@pytest.mark.parametrize(("total", "search", "confirm"), [(6, 6, 0), (12, 12, 0), (16, 8, 8), (24, 16, 8), (40, 16, 8)])
def test_search_and_confirmation_samples_are_disjoint_and_in_order(
    tmp_path: Path, total: int, search: int, confirm: int
) -> None:
    from trtopt.data import load_dataset
    from trtopt.data.inputs import InputInfo
    from trtopt.search.sensitivity import search_samples

    values = np.arange(total, dtype=np.float32).reshape(total, 1) * np.ones((1, 4), np.float32)
    np.savez(tmp_path / "d.npz", x=values)
    dataset = load_dataset(str(tmp_path / "d.npz"), [InputInfo("x", (-1, 4), np.float32)], None)
    first, then = search_samples(dataset, 8)
    rows = [[int(r[0]) for feeds, n in part for r in feeds["x"][:n]] for part in (first, then)]
    assert rows == [list(range(search)), list(range(search, search + confirm))]


def _if_reading_outer(weight: float) -> onnx.ModelProto:
    """y = If(c) then x + w else x, the branch reading the outer initializer w by name."""
    from onnx import TensorProto, helper

    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])  # fmt: skip
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph(
        [node], "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(np.array([weight, weight], np.float32), "w")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_graph_whose_subgraphs_read_outer_tensors_runs_whole() -> None:
    """The If node's own fingerprint cannot see the outer weight its branch reads: the trial must not
    take the plan's output for it."""
    from trtopt.search._trials import DownstreamTrials

    batches = [({"x": np.array([1.0, 2.0], np.float32), "c": np.array(True)}, 2)]
    trials = DownstreamTrials(_if_reading_outer(1.0), batches, [])
    assert trials.run(_if_reading_outer(5.0))[0]["y"].tolist() == [6.0, 7.0]


def test_the_build_summary_says_what_the_search_kept_and_whether_the_plan_is_still_short() -> None:
    """The summary row of the search: nothing when the plan met the aim at once; the layers kept and the
    figures when it reached the aim; the advice (--calib, --exclude) when the plan is still short, on the
    search samples or on the confirmation samples alone, or when no layer helped."""
    from trtopt.cli.summaries import sensitivity_row

    assert sensitivity_row(None) is None
    assert sensitivity_row({"before": 0.995, "after": 0.995, "layers": {}, "trials": 0}) is None
    met = sensitivity_row({"before": 0.95, "after": 0.993, "layers": {"Conv_1": "why"}, "trials": 12,
                           "confirmed": {"before": 0.96, "after": 0.991}})  # fmt: skip
    assert met is not None and met[0] == "kept float by sensitivity"
    assert "Conv_1" in met[1] and "0.9500 -> 0.9930" in met[1] and "0.9910 on the confirmation" in met[1]
    assert "short" not in met[1]
    short = sensitivity_row({"before": 0.95, "after": 0.993, "layers": {"Conv_1": "why"}, "trials": 12,
                             "confirmed": {"before": 0.96, "after": 0.985}})  # fmt: skip
    assert short is not None and "still short of the 0.99 aim" in short[1] and "--exclude" in short[1]
    none = sensitivity_row({"before": 0.97, "after": 0.97, "layers": {}, "trials": 48})
    assert none is not None and none[0] == "sensitivity analysis" and "no layer kept float" in none[1]
    assert "--calib" in none[1] and "48 trial builds" in none[1]


def test_the_build_summary_counts_the_searchs_float_layers_as_one_reason() -> None:
    """Each layer the search keeps has its own reason (its figures): the float-layers row counts them under
    one, beside the other reasons, and the search's row gives the figures."""
    from trtopt.cli.summaries import float_reasons

    floats = {"a": "fewer than 16 channels", "b": "fewer than 16 channels",
              "c": "kept float by sensitivity analysis (alone it lifts the worst output score 0.9 -> 0.95)",
              "d": "kept float by sensitivity analysis (beside the 1 kept float before it, it lifts ...)"}  # fmt: skip
    assert float_reasons(floats) == "2 (fewer than 16 channels), 2 (kept float by sensitivity analysis)"


def _tied(fixes: dict[str, tuple[str, float]], errors: dict[str, float], calls: list[tuple[str, ...]]):  # type: ignore[no-untyped-def]
    """Each output's cosine (1 minus its error), where a layer kept float (`fixes`: layer -> (output, cut))
    cuts one output's error."""

    def measure(exclude: Sequence[str]) -> np.ndarray:
        calls.append(tuple(exclude))
        cuts = {out: sum(cut for layer, (o, cut) in fixes.items() if o == out and layer in exclude) for out in errors}
        return np.array([1.0 - max(0.0, e - cuts[out]) for out, e in errors.items()])

    return measure


def test_outputs_whose_worst_cosines_tie_are_lifted_one_layer_each_by_the_summed_shortfall() -> None:
    """Three outputs tie at 0.985 and one layer each lifts one of them: kept float alone, none lifts the
    worst output, so a search on the worst output keeps nothing; the summed shortfall below the aim falls
    by 0.01 with each, and the three reach the aim."""
    errors = {"A": 0.015, "B": 0.015, "C": 0.015, "D": 0.002}
    fixes = {"a": ("A", 0.015), "b": ("B", 0.014), "c": ("C", 0.013), "d": ("D", 0.002)}
    layers = [*fixes, *(f"l{i}" for i in range(10))]
    calls: list[tuple[str, ...]] = []
    found = find_sensitive_layers(_tied(fixes, errors, calls), layers)
    assert list(found.layers) == ["a", "b", "c"]  # the largest cut first; "d" cuts no shortfall: left INT8
    assert found.before == pytest.approx(0.985) and found.after == pytest.approx(0.998)
    assert "summed shortfall below 0.99 0.0100 -> 0.0050" in found.layers["b"]
    assert found.trials == len(calls) == 1 + len(layers) + 2  # the alone trials, then one each beside
    worst_only = find_sensitive_layers(lambda exclude: float(_tied(fixes, errors, [])(exclude).min()), layers)
    assert worst_only.layers == {} and worst_only.after == pytest.approx(0.985)  # what the search did before


def test_the_confirmation_weighs_tied_outputs_by_their_summed_per_sample_gain() -> None:
    """Two outputs tie on both sample sets. "lucky" lifts output A on the search samples alone (refused);
    "a" and "b" lift A and B on the confirmation samples too, though the worst confirmation output does not
    move with either alone: both are kept, and the plan reaches the aim on both sets."""
    errors = {"A": 0.015, "B": 0.015}
    fixes = {"lucky": ("A", 0.016), "a": ("A", 0.015), "b": ("B", 0.014)}
    layers = [*fixes, *(f"l{i}" for i in range(9))]
    wobble = np.resize([0.004, -0.004], 8)  # per-sample spread on the confirmation samples

    def confirm(exclude: Sequence[str]) -> np.ndarray:
        lifted = {out: any(fixes[layer] == (out, cut) for layer in exclude if layer != "lucky")
                  for out, cut in (("A", 0.015), ("B", 0.014))}  # fmt: skip
        return np.array([0.985 + wobble + (0.012 if lifted[out] else 0.0) for out in errors])

    found = find_sensitive_layers(_tied(fixes, errors, []), layers, confirm=confirm)
    assert list(found.layers) == ["a", "b"] and set(found.refused) == {"lucky"}
    assert found.after >= MIN_COSINE and found.confirmed == pytest.approx((0.985, 0.997))


@pytest.mark.parametrize("case", ["greedy", "overlap", "later", "rounds", "confirmed"])
def test_one_output_as_an_array_is_searched_as_one_figure(case: str) -> None:
    """A plan of one output searches the same whether its figure comes as a float or as one output's array:
    same layers, same trials, same figures (the summed shortfall of one output never outweighs its rise)."""
    costs = {f"l{i:02d}": MIN_GAIN / 2 for i in range(MANY)} | {"big": 0.05, "mid": 0.0008, "near": 0.004}
    ranked = [f"l{i:02d}" for i in range(MANY)]
    ranked[3:3] = ["big", "mid", "near"]

    def overlap(exclude: Sequence[str]) -> float:  # keeping "a" or "b" float removes their shared error
        shared = 0.0 if {"a", "b"} & set(exclude) else 0.007
        return 0.992 - shared - 0.0004 * ("a" not in exclude) - 0.0006 * ("b" not in exclude)

    plans: dict[str, tuple[Any, list[str], dict[str, Any]]] = {
        "greedy": (_measure(costs, []), list(costs), {"rank": lambda: ranked}),
        "overlap": (overlap, list("abcdefgh"), {}),
        "later": (_outputs({"a": "A", "b": "B"}, {"A": 0.03, "B": 0.02, "C": 0.004}, []), ["a", "b", "x", "y"], {}),
        "rounds": (_outputs({"x0": "O0", "x1": "O1", "x2": "O2"}, {"O0": 0.03, "O1": 0.012, "O2": 0.0109}, []),
                   ["x0", "x1", "x2", *(f"l{i}" for i in range(9))], {}),
        "confirmed": (_measure(costs, []), list(costs),
                      {"rank": lambda: ranked, "confirm": lambda ex: np.full(8, 0.96) + 0.001 * len(ex)}),
    }  # fmt: skip
    measure, layers, options = plans[case]
    as_float = find_sensitive_layers(measure, layers, **options)
    as_array = find_sensitive_layers(lambda exclude: np.array([measure(exclude)]), layers, **options)
    assert as_array == as_float and as_float.trials > 1


def test_the_last_step_to_the_aim_is_kept_though_it_gains_less_than_the_minimum() -> None:
    """Two outputs: "a" lifts the worst to 0.9896; then "b" lifts it past the aim by MIN_GAIN / 2 (kept:
    it reaches the aim), while "c", as small a gain short of the aim, is not."""
    errors = {"A": 0.03, "B": 0.0104}
    fixes = {"a": ("A", 0.03), "c": ("B", MIN_GAIN / 3), "b": ("B", MIN_GAIN / 2 + 0.0004)}
    layers = [*fixes, *(f"l{i}" for i in range(9))]
    found = find_sensitive_layers(_tied(fixes, errors, []), layers)
    assert list(found.layers) == ["a", "b"] and found.after == pytest.approx(0.9905)
    short = find_sensitive_layers(_tied({"a": fixes["a"], "c": fixes["c"]}, errors, []), layers)
    assert list(short.layers) == ["a"] and short.after == pytest.approx(0.9896)


def test_with_split_figures_the_search_aims_at_the_agreement_and_gains_in_cosine() -> None:
    """A recogniser's figures in two rows (trtopt.search._objective): the top-class agreement keeps the plan
    short of the aim, so the search runs; "flip" turns a few positions back but lowers the cosine (what one
    lucky time step looks like), "conv" and "tail" lift the cosine. Only the latter two are kept, and the
    reasons say both figures; read from the aim row, "flip" would have been kept first."""
    lifts = {"flip": (0.01, -0.0005), "conv": (0.005, 0.004), "tail": (0.003, 0.0015)}
    layers = [*lifts, *(f"l{i}" for i in range(12))]

    def measure(exclude: Sequence[str]) -> np.ndarray:
        aim = 0.97 + sum(lifts[layer][0] for layer in exclude if layer in lifts)
        steady = 0.994 + sum(lifts[layer][1] for layer in exclude if layer in lifts)
        return np.array([[aim], [steady]])

    found = find_sensitive_layers(measure, layers)
    assert list(found.layers) == ["conv", "tail"] and found.after == pytest.approx(0.978)
    assert "0.9700 -> 0.9750; its worst cosine 0.9940 -> 0.9980" in found.layers["conv"]
    as_one_row = find_sensitive_layers(lambda exclude: measure(exclude)[0], layers)
    assert list(as_one_row.layers)[0] == "flip"
