"""What `--method auto`'s scoring cache holds at once (`trtopt.calib.auto`): bounded, with the same values.

Scoring a tensor reads the tensor itself and every input and output of the nodes that read it, on the
FP32 model over the scoring samples. Held for every scored tensor at once, that is several GB on a
detector (6.5 GiB on the zoo's layout-cdla at 800 x 608 for 8 samples, as its shapes declare; the build
peaked at 8.8 GB RSS). So the scored tensors are taken in groups whose reads fit `BUDGET` (estimated
from the shapes the model declares), and each group's tensors come from one run of the graph cut to the
nodes they depend on (`prefix_model`), with every tensor any group reads that the cut makes exposed: the
same nodes as ONNX Runtime optimises them in the whole graph, the same kernels, so the same values to the
last bit as one run for all (ONNX Runtime fuses differently around the tensors a model exposes; fetching
fewer outputs of one session changes nothing of that, and the cut keeps as outputs what the removed nodes
read). The price is one more forward pass over the scoring samples per group, as far as the group's
tensors (layout-cdla: 9 groups, and its scoring took 27 -> 30 s, avx2, 2 threads, on a shared machine,
when every pass ran the whole graph; PP-OCRv4-det: 5 groups, 15 -> 11 s: fewer pages to fault). Within a
group, a tensor leaves the cache once the last scoring that reads it is done (`release_after`). Cut graphs
and groups of a quarter of the free memory together: lore-detect's scoring (16 pages at 768 x 768, avx2)
245.6 -> 96.4 s with the same thresholds (BENCHMARKS *auto's scoring* at 834753b, tools/bench_auto_groups.py);
wired-table-rec's line segmenter at 1024 x 1024 over 15 minutes (stopped) -> 154 s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import onnx

# Bytes of cached tensors per group (all scoring samples together); a single tensor's reads may exceed it.
BUDGET = 1 << 30
MOST_BUDGET = 4 * BUDGET  # what `scoring_budget` gives at most, however much memory is free


def scoring_budget() -> int:
    """A group's budget on this machine: a quarter of the memory free now, from `BUDGET` to `MOST_BUDGET`.

    Groups change the time, never the values. At 1024 x 1024 (wired-table-rec's line segmenter: 2.4 GB of
    float activations per page, 8 scoring pages) 1 GiB groups meant a forward pass per one or two tensors."""
    from trtopt.memory import available_bytes

    free = available_bytes()
    return BUDGET if free is None else min(max(BUDGET, free // 4), MOST_BUDGET)


def reads(name: str, consumers: Mapping[str, Sequence[onnx.NodeProto]]) -> list[str]:
    """The tensors scoring `name` reads from the cache: itself and its consumers' inputs and outputs."""
    found = {name: None}
    for node in consumers.get(name, ()):
        found.update((t, None) for t in (*node.input, *node.output) if t)
    return list(found)


def cache_groups(
    scored: Sequence[str],
    consumers: Mapping[str, Sequence[onnx.NodeProto]],
    sizes: Mapping[str, int],
    budget: int = BUDGET,
) -> list[list[str]]:
    """`scored` cut, in order, into runs of tensors whose reads together (`sizes`: bytes; missing names count 0)
    stay within `budget`; a tensor whose own reads exceed it is a group alone."""
    groups: list[list[str]] = []
    held: set[str] = set()
    for name in scored:
        wanted = set(reads(name, consumers))
        total = sum(sizes.get(t, 0) for t in held | wanted)
        if groups and total <= budget:
            groups[-1].append(name)
            held |= wanted
        else:
            groups.append([name])
            held = wanted
    return groups


def release_after(
    scored: Sequence[str], consumers: Mapping[str, Sequence[onnx.NodeProto]], cached: Iterable[str]
) -> list[list[str]]:
    """For each tensor of `scored` (in scoring order), the names of `cached` that no later scoring reads:
    the cache can let them go once that tensor is scored. A cached name no scoring reads goes after the first."""
    last: dict[str, int] = {}
    for index, name in enumerate(scored):
        for tensor in reads(name, consumers):
            last[tensor] = index
    released: list[list[str]] = [[] for _ in scored]
    for name in cached:
        if released:
            released[last.get(name, 0)].append(name)
    return released


def declared_sizes(model: onnx.ModelProto, rows: int) -> dict[str, int]:
    """Bytes of each tensor of `model` with a declared shape and type, for `rows` samples: the first axis
    counts as the samples (a model declaring batch 1 runs the scoring batch), the others as declared; a
    tensor with an unknown axis or type is left out (it counts 0 in `cache_groups`)."""
    sizes: dict[str, int] = {}
    graph = model.graph
    for info in (*graph.value_info, *graph.output, *graph.input):
        kind = info.type.tensor_type
        if not kind.HasField("shape") or not kind.elem_type:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim]
        if any(d is None for d in dims[1:]):
            continue
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type).itemsize
        except (KeyError, TypeError, ValueError):
            continue
        per_sample = math.prod(d for d in dims[1:] if d is not None)
        sizes[info.name] = per_sample * itemsize * (rows if dims else 1)
    return sizes


def prefix_model(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto | None:
    """`model` cut to the nodes that `names` depend on, or None when that is the whole graph or the graph
    has subgraphs (a Loop or If body may read any outer tensor).

    ONNX Runtime runs every node of a session whatever outputs a run asks for (measured: ten 3x3 convs
    behind a ReLU cost the same when only the ReLU's output is fetched), so a group of early tensors paid
    the whole forward pass. Each output of the cut that a removed node read stays a graph output, so no
    kept tensor looks single-reader in the cut that was not single-reader in the whole graph (a kept tensor
    read by removed nodes alone is one the group wants: exposed in both), ONNX Runtime fuses the kept nodes
    as it does in the whole graph, and they compute the same values (tests/test_calib_auto_memory.py)."""
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return None
    producer = {out: index for index, node in enumerate(graph.node) for out in node.output if out}
    keep: set[int] = set()
    stack = [producer[name] for name in names if name in producer]
    while stack:
        index = stack.pop()
        if index not in keep:
            keep.add(index)
            stack.extend(producer[t] for t in graph.node[index].input if t in producer)
    if len(keep) == len(graph.node):
        return None
    made = {out for index in keep for out in graph.node[index].output if out}
    read_outside = {t for index, node in enumerate(graph.node) if index not in keep for t in node.input}
    kept_outputs = {o.name for o in graph.output}
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    del cut.graph.node[:]
    cut.graph.node.extend(node for index, node in enumerate(graph.node) if index in keep)
    del cut.graph.output[:]
    known = {v.name: v for v in (*graph.value_info, *graph.output)}
    for name in sorted(made & (read_outside | kept_outputs)):
        cut.graph.output.append(known.get(name) or onnx.ValueInfoProto(name=name))  # ONNX Runtime infers it
    return cut
