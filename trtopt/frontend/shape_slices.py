"""`Shape` with `start` / `end` (opset 15+), spelt as `Shape` then `Slice` before constant folding.

onnx-graphsurgeon 0.6.1's shape folding reads a `Shape` node's output as its input's whole shape and ignores
`start` and `end`: `Shape(x[2, 3, 4, 5], start=1, end=3)` folds to [2, 3, 4, 5], not [3, 4], and a `Gather` or
`Slice` after it picks from the wrong dimensions. The folded graph then computes something else, or ONNX
Runtime refuses it ("Mismatch between number of splits (8) and outputs (2)"). Found on onnx's own conformance
models (`onnx.backend.test.case.node`: the expanded RotaryEmbedding, Attention and CausalConv functions of
opsets 23-27), and torch.onnx's dynamo exporter writes `aten::size(dim)` the same way. Spelt as a plain `Shape`
and a `Slice` of constants, it folds right, and computes the same where it does not fold.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs


def spell_shape_slices(graph: gs.Graph) -> int:
    """Rewrite every `Shape` with `start` or `end` in `graph` and its subgraphs; returns how many."""
    count = 0
    for node in list(graph.nodes):
        for value in node.attrs.values():
            if isinstance(value, gs.Graph):
                count += spell_shape_slices(value)
        if node.op != "Shape" or not ({"start", "end"} & set(node.attrs)):
            continue
        start, end = int(node.attrs.pop("start", 0)), node.attrs.pop("end", None)
        whole = gs.Variable(f"{node.outputs[0].name}_whole", dtype=np.int64)
        sliced = node.outputs[0]
        node.outputs = [whole]
        limit = np.iinfo(np.int64).max if end is None else int(end)
        constants = [gs.Constant(f"{sliced.name}_{what}", np.array([v], np.int64))
                     for what, v in (("start", start), ("end", limit), ("axis", 0))]  # fmt: skip
        graph.nodes.append(gs.Node("Slice", f"{node.name}_slice", inputs=[whole, *constants], outputs=[sliced]))
        count += 1
    if count:
        graph.toposort()
    return count


def join_shape_slices(graph: gs.Graph) -> int:
    """After folding, each `Shape` -> `Slice` pair `spell_shape_slices` wrote that is still there (the shape was not
    constant: a dynamic batch) as one `Shape` with `start` and `end` again, as the exporter wrote it; returns how
    many."""
    count = 0
    for node in list(graph.nodes):
        whole = node.outputs[0] if node.op == "Shape" and len(node.outputs) == 1 else None
        if whole is None or not whole.name.endswith("_whole") or len(whole.outputs) != 1:
            continue
        sliced = whole.outputs[0]
        bounds = [t.values for t in sliced.inputs[1:]] if sliced.name == f"{node.name}_slice" else []
        if len(bounds) != 3 or not all(isinstance(t, gs.Constant) for t in sliced.inputs[1:]):
            continue
        start, end, _axis = (int(np.asarray(v).reshape(-1)[0]) for v in bounds)
        node.attrs.update({"start": start} if start else {})
        node.attrs.update({"end": end} if end != np.iinfo(np.int64).max else {})
        node.outputs = [sliced.outputs[0]]
        sliced.outputs.clear()
        count += 1
    if count:
        graph.cleanup()
    return count
