"""Per-layer attribution of quantisation error (`trtopt.metrics.compare.added_errors`) on graphs with branches.

    input ─► Conv a ─────────────┐
      └────► Conv b ─► Relu r ─► Concat cat ─► MaxPool p ─► Conv c

Compared tensors: a, b, cat, c (r and p are not compared: the walk goes through them).
"""

from __future__ import annotations

import io

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from trtopt.metrics.compare import added_errors


def branchy_graph() -> gs.Graph:
    x = gs.Variable("input", np.float32, (1, 2, 4, 4))
    w = gs.Constant("w", np.ones((2, 2, 1, 1), np.float32))
    a, b, r, cat, p, c = (gs.Variable(n, np.float32) for n in ("a", "b", "r", "cat", "p", "c"))
    nodes = [
        gs.Node("Conv", "conv_a", inputs=[x, w], outputs=[a]),
        gs.Node("Conv", "conv_b", inputs=[x, w], outputs=[b]),
        gs.Node("Relu", "relu", inputs=[b], outputs=[r]),
        gs.Node("Concat", "concat", {"axis": 1}, inputs=[a, r], outputs=[cat]),
        gs.Node("MaxPool", "pool", {"kernel_shape": [2, 2]}, inputs=[cat], outputs=[p]),
        gs.Node("Conv", "conv_c", inputs=[p, gs.Constant("w4", np.ones((2, 4, 1, 1), np.float32))], outputs=[c]),
    ]
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[c]).toposort()


def test_error_is_attributed_to_the_layer_that_made_it_not_to_the_previous_row() -> None:
    losses = {"a": 0.3, "b": 0.05, "cat": 0.3, "c": 0.4}
    added = added_errors(branchy_graph(), losses)
    # conv_b reads the input (no error); the concat adds nothing to its worst input (a); conv_c reads the
    # concat through an uncompared MaxPool. Consecutive differences would say b -0.25 and cat +0.25.
    assert added == pytest.approx({"a": 0.3, "b": 0.05, "cat": 0.0, "c": 0.1})


def test_a_layer_that_shrinks_the_error_it_received_gets_a_negative_share() -> None:
    added = added_errors(branchy_graph(), {"a": 0.3, "b": 0.05, "cat": 0.2, "c": 0.25})
    assert added["cat"] == pytest.approx(-0.1) and added["c"] == pytest.approx(0.05)


@pytest.mark.parametrize("width", [80, 240])
def test_long_output_names_are_numbered_where_the_table_would_cut_them(width: int) -> None:
    """`trtopt compare`'s per-output table in an 80-column terminal cut a TensorFlow export's names to "model/…",
    the same for every output; there they are numbered and listed whole below, and a wide terminal shows them."""
    from rich.console import Console

    from trtopt.cli.compare_cmd import _print_fitted
    from trtopt.metrics.compare import compare_outputs

    rng = np.random.default_rng(0)
    names = ["model/detection_head/boxes_regression_output:0", "model/classification_head/class_scores:0"]
    ref = {name: rng.standard_normal((4, 6)).astype(np.float32) for name in names}
    test = {name: value + 0.01 for name, value in ref.items()}
    outputs = [s.to_dict() for s in compare_outputs(iter([({}, ref, test)]), names).outputs]
    console = Console(width=width, record=True, file=io.StringIO())
    _print_fitted(console, outputs, 4, "cpu")
    text = console.export_text()
    for i, name in enumerate(names, 1):
        assert name in text  # whole, in the table or below it
        assert (f"#{i}: {name}" in text) == (width == 80)
    assert all(len(line) <= width for line in text.splitlines() if "#" not in line)
