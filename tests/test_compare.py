"""Per-layer attribution of quantisation error (`trtopt.compare.added_errors`) on graphs with branches.

    input ─► Conv a ─────────────┐
      └────► Conv b ─► Relu r ─► Concat cat ─► MaxPool p ─► Conv c

Compared tensors: a, b, cat, c (r and p are not compared: the walk goes through them).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from trtopt.compare import added_errors


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
