"""The order in which the sensitivity search (`trtopt.search.sensitivity`) tries INT8 layers alone: the error
each adds to its own output, most first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

Batches = Sequence[tuple[Mapping[str, np.ndarray], int]]


def rank_by_added_error(
    graph: gs.Graph, quantized: onnx.ModelProto, batches: Batches, layers: Sequence[str]
) -> list[str]:
    """`layers` ordered by the error each adds to its own output (1 - cosine with FP32, less the worst error
    it reads: `trtopt.metrics.compare.added_errors`), most first, from one run of FP32 and of the Q/DQ reference
    with every layer's outputs exposed, compared batch by batch (nothing of a deep model is held)."""
    from trtopt.execution import OrtSession
    from trtopt.frontend import onnx_from_graph
    from trtopt.metrics.compare import ErrorStats, added_errors

    outputs = {n.name: [t.name for t in n.outputs if t.name] for n in graph.nodes if n.name in set(layers)}
    made = {t for node in quantized.graph.node for t in node.output}  # Q/DQ insertion keeps the layers' names
    names = sorted({t for ts in outputs.values() for t in ts} & made)
    hidden = [n for n in names if n not in {t.name for t in graph.outputs}]
    fp32 = OrtSession(onnx_from_graph(graph), expose=hidden, spin=False)
    reference = OrtSession(quantized, expose=hidden, opt_level="disable", spin=False)
    stats = {name: ErrorStats(name) for name in names}
    for feeds, rows in batches:
        want, got = fp32.run(feeds, outputs=names), reference.run(feeds, outputs=names)
        for name in names:
            stats[name].update(np.asarray(want[name])[:rows], np.asarray(got[name])[:rows])
    added = added_errors(graph, {name: 1.0 - s.cosine for name, s in stats.items()})
    score = {layer: max((added.get(t, 0.0) for t in ts), default=0.0) for layer, ts in outputs.items()}
    return sorted(layers, key=lambda layer: -score.get(layer, 0.0))
