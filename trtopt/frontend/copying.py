"""A copy of a gs.Graph that keeps what onnx-graphsurgeon's own `Graph.copy` drops.

onnx-graphsurgeon 0.6.1 copies a `Variable` as `Variable(name, dtype, shape)`, so every sequence-typed value
(`SequenceEmpty`, `SequenceConstruct`, `SplitToSequence`, ... outputs) comes back as a tensor. Exported, the
copy declares `tensor(float)` where the op writes `seq(tensor(float))`, and ONNX Runtime refuses the model
("Type Error: Type (tensor(float)) of output arg (seq_1) of node (SequenceConstruct_0) does not match expected
type (seq(tensor(float)))"): every build and `trtopt optimize` of such a model failed, found on the sequence
models that ship in the onnx wheel (onnx/backend/test/data/simple/test_sequence_model*).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_graphsurgeon as gs


def copy_graph(graph: gs.Graph) -> gs.Graph:
    """`graph.copy()`, with each value's type (tensor, sequence, sparse tensor) as in `graph`, subgraphs too."""
    kinds = {v.name: v.type for v in _variables(graph) if v.type != "tensor_type"}
    copy = graph.copy()
    if kinds:
        for variable in _variables(copy):
            variable.type = kinds.get(variable.name, variable.type)
    return copy


def _variables(graph: gs.Graph) -> Iterator[gs.Variable]:
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Variable):
            yield tensor
    for node in graph.nodes:
        for value in node.attrs.values():
            if isinstance(value, gs.Graph):
                yield from _variables(value)
