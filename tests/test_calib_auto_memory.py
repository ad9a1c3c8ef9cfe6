"""`--method auto`'s cache lets go of what no later scoring reads, and copies the exposed tensors out of ONNX
Runtime one at a time: the same values, less held at once (trtopt.calib.auto)."""

from __future__ import annotations

import numpy as np
import pytest
from auto_models import heavy_tail_conv, unlike_concat
from onnx import helper

from trtopt.calib import CalibConfig, histogram_from_values
from trtopt.calib.auto import _released_run, choose_thresholds
from trtopt.calib.auto_cache import cache_groups, declared_sizes, reads, release_after
from trtopt.calib.thresholds import candidate_thresholds
from trtopt.execution import OrtSession, run_model


def _chain() -> tuple[list[str], dict[str, list]]:
    """a -> Conv(a, w) -> b -> Relu -> c; b and a both read by an Add -> d."""
    conv = helper.make_node("Conv", ["a", "w"], ["b"], name="conv")
    relu = helper.make_node("Relu", ["b"], ["c"], name="relu")
    add = helper.make_node("Add", ["a", "b"], ["d"], name="add")
    return ["a", "b"], {"a": [conv, add], "b": [relu, add]}


def test_a_cached_tensor_is_released_after_its_last_reader_and_only_once() -> None:
    scored, consumers = _chain()
    cached = ["a", "b", "c", "d", "x_unread"]
    released = release_after(scored, consumers, cached)
    assert len(released) == len(scored)
    flat = [name for names in released for name in names]
    assert sorted(flat) == sorted(cached)  # everything goes, once
    at = {name: index for index, names in enumerate(released) for name in names}
    for index, name in enumerate(scored):  # nothing goes before a scoring that reads it
        read = {name, *(t for node in consumers[name] for t in (*node.input, *node.output))}
        assert all(at[t] >= index for t in read if t in at)
    assert at["a"] == 1  # scoring b reads a (an input of the Add): a stays until then
    assert at["x_unread"] == 0


def test_nothing_to_score_releases_nothing() -> None:
    assert release_after([], {}, ["a"]) == []


def test_released_run_gives_session_runs_values_bit_for_bit() -> None:
    model = unlike_concat()
    hidden = [o for node in model.graph.node for o in node.output][:-1]
    session = OrtSession(model, expose=hidden, spin=False, arena=False)
    rng = np.random.default_rng(0)
    feeds = {model.graph.input[0].name: rng.standard_normal((2, 3, 12, 12)).astype(np.float32)}
    wanted = list(reversed(session.output_names))  # an order of its own: each name gets its own tensor
    got = _released_run(session, feeds, wanted)
    expected = session.run(feeds, outputs=wanted)
    assert list(got) == wanted
    for name in wanted:
        assert got[name].dtype == expected[name].dtype and np.array_equal(got[name], expected[name])
    assert len({got[name].shape for name in wanted}) > 1 or len(wanted) == 1


def test_groups_keep_their_reads_within_the_budget_and_the_order() -> None:
    scored, consumers = _chain()
    sizes = {"a": 10, "b": 10, "c": 10, "d": 10}
    assert cache_groups(scored, consumers, sizes, budget=40) == [["a", "b"]]  # a b c d: 40 bytes
    assert cache_groups(scored, consumers, sizes, budget=39) == [["a"], ["b"]]
    assert cache_groups(scored, consumers, sizes, budget=1) == [["a"], ["b"]]  # too large alone: alone
    assert reads("a", consumers) == ["a", "w", "b", "d"]


def test_declared_sizes_count_the_scoring_rows_and_skip_unknown_axes() -> None:
    model = heavy_tail_conv()  # x [-1, 64, 8, 8] -> y
    sizes = declared_sizes(model, rows=8)
    assert sizes["x"] == 8 * 64 * 8 * 8 * 4
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    assert "x" not in declared_sizes(model, rows=8)


def test_choices_are_the_same_whatever_the_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """One group (every read cached at once) or one tensor per group: the same thresholds and scores."""
    model = unlike_concat()
    data = np.random.default_rng(1).standard_normal((16, 3, 12, 12)).astype(np.float32)
    hidden = [o for node in model.graph.node for o in node.output]
    values = {"x": data, **run_model(model, {"x": data}, expose=hidden[:-1])}
    options = {name: candidate_thresholds(histogram_from_values(values[name], name=name), CalibConfig())
               for name in ("x", *hidden[:-1])}  # fmt: skip
    batches = [({"x": data[:8]}, 8)]
    whole = choose_thresholds(model, options, batches)
    monkeypatch.setattr("trtopt.calib.auto.cache_groups",
                        lambda scored, consumers, sizes, budget: cache_groups(scored, consumers, sizes, 0))  # fmt: skip
    apart = choose_thresholds(model, options, batches)
    assert sum(1 for c in whole.values() if c.scored_by == "consumers") >= 2
    assert apart == whole


def test_a_group_runs_only_the_nodes_it_depends_on_and_gets_the_same_values() -> None:
    """ONNX Runtime runs every node of a session whatever a run fetches: a group of early tensors runs the
    graph cut after them, and the tensors read from the cut are the whole graph's, bit for bit."""
    from trtopt.calib.auto_cache import prefix_model
    from trtopt.zoo import build_model

    model = build_model("inception_pool_net", batch=2)
    nodes = list(model.graph.node)
    early = next(n for n in nodes if n.op_type == "Concat").input[0]  # a branch of the first block
    cut = prefix_model(model, [early])
    assert cut is not None and 0 < len(cut.graph.node) < len(nodes) // 2
    kept = {n.name for n in cut.graph.node}
    made = {o: n for n in nodes for o in n.output}
    needed, stack = set(), [early]
    while stack:  # the ancestors of `early`, and nothing else
        node = made.get(stack.pop())
        if node is not None and node.name not in needed:
            needed.add(node.name)
            stack.extend(node.input)
    assert kept == needed
    boundary = {t for n in nodes if n.name not in kept for t in n.input} & {o for n in cut.graph.node for o in n.output}
    assert {o.name for o in cut.graph.output} == boundary  # what removed nodes read stays an output
    hidden = [o for n in cut.graph.node for o in n.output]
    feeds = {model.graph.input[0].name: np.random.default_rng(3).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)}  # fmt: skip
    whole = OrtSession(model, expose=hidden).run(feeds, outputs=hidden)
    part = OrtSession(cut, expose=hidden).run(feeds, outputs=hidden)
    assert all(np.array_equal(whole[t], part[t]) for t in hidden)
    assert prefix_model(model, [model.graph.output[0].name]) is None  # the whole graph: nothing to cut


def test_a_graph_with_subgraphs_is_not_cut() -> None:
    from trtopt.calib.auto_cache import prefix_model

    body = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "body", [],
                             [helper.make_tensor_value_info("y", 1, [1])])  # reads x from outside
    nodes = [helper.make_node("Relu", ["a"], ["x"]), helper.make_node("Relu", ["x"], ["early"]),
             helper.make_node("If", ["c"], ["z"], then_branch=body, else_branch=body)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", 1, [1]),
                                           helper.make_tensor_value_info("c", 9, [])],
                              [helper.make_tensor_value_info("z", 1, [1])])  # fmt: skip
    assert prefix_model(helper.make_model(graph), ["early"]) is None
