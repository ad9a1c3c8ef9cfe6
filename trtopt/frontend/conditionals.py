"""`If` nodes whose condition constant folding decided: the branch taken replaces the node.

onnx-graphsurgeon 0.6.1 does this inside `Graph.fold_constants` (`flatten_subgraphs=True`), but only for the
first output of an `If`: it detaches each output from the node while it walks the node's output list, so the
walk ends after one, and every later output is left with no producer. ONNX Runtime then refuses the model
("Node input ... is not a graph input, initializer, or output of a previous node"). Silero VAD's 16 kHz export
(silero-vad 6.2.3, `silero_vad_16k_op15.onnx`) has such an `If` with two outputs around its decoder's LSTM cell;
with that flattening `trtopt optimize` wrote a model nothing could load. The loader therefore folds with
flattening off and flattens here, every output, including outputs a branch passes through from the outer
graph or a constant (an `Identity` carries those), and outputs the branch's own nodes also read (ONNX's
expanded AffineGrid function: `step_d_then` is returned and halved inside the branch).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs


def flatten_constant_ifs(graph: gs.Graph) -> int:
    """Replace each `If` with a constant condition by the nodes of the branch it takes, in `graph` and in the
    subgraphs of its other nodes (innermost first), in place. Returns how many were replaced."""
    flattened = 0
    index = 0
    while index < len(graph.nodes):
        node = graph.nodes[index]
        for value in node.attrs.values():
            if isinstance(value, gs.Graph):
                flattened += flatten_constant_ifs(value)
        if node.op != "If" or not isinstance(node.inputs[0], gs.Constant):
            index += 1
            continue
        taken = bool(np.asarray(node.inputs[0].values).reshape(-1)[0])
        nodes = _inlined(graph, node, node.attrs["then_branch" if taken else "else_branch"])
        graph.nodes[index : index + 1] = nodes
        index += len(nodes)
        flattened += 1
    return flattened


def _inlined(graph: gs.Graph, node: gs.Node, branch: gs.Graph) -> list[gs.Node]:
    """The branch's nodes, writing the `If` node's own output tensors (the node is detached from them)."""
    outer = set(graph.tensors())
    for inner in branch.nodes:  # ONNX keeps subgraph names apart from the outer graph's; a model that does not
        for tensor in inner.outputs:  # still gets no clash
            if tensor.name in outer:
                tensor.name = f"{tensor.name}_{node.name}"
    results = list(branch.outputs)
    targets = list(node.outputs)
    node.inputs.clear()
    node.outputs.clear()
    nodes = list(branch.nodes)
    own = {id(n) for n in nodes}
    moved: dict[int, gs.Tensor] = {}  # id of a branch output already rebound -> the node output it became
    for target, result in zip(targets, results, strict=True):
        producer = next((n for n in result.inputs if id(n) in own), None)
        if producer is not None and id(result) not in moved:
            position = next(i for i, t in enumerate(producer.outputs) if t is result)
            for consumer in list(result.outputs):  # the branch's own nodes that read it read the target now
                for slot in [i for i, t in enumerate(consumer.inputs) if t is result]:
                    consumer.inputs[slot] = target
            producer.outputs[position] = target
            moved[id(result)] = target
        else:  # passed through from the outer graph, a constant, or an output the branch returns twice
            source = moved.get(id(result), result)
            nodes.append(gs.Node("Identity", name=f"{node.name}/{target.name}", inputs=[source], outputs=[target]))
    return nodes
