"""What `--method auto`'s scoring cache holds at once (`trtopt.calib.auto`): bounded, with the same values.

Scoring a tensor reads the tensor itself and every input and output of the nodes that read it, on the
FP32 model over the scoring samples. Held for every scored tensor at once, that is several GB on a
detector (6.5 GiB on the zoo's layout-cdla at 800 x 608 for 8 samples, as its shapes declare; the build
peaked at 8.8 GB RSS). So the scored tensors are taken in groups whose reads fit `BUDGET` (estimated
from the shapes the model declares), and each group's tensors come from one run of the same session, the
one with every tensor any group reads exposed: the same graph as ONNX Runtime optimised it, the same
kernels, so the same values to the last bit as one run for all (ONNX Runtime fuses differently around
the tensors a model exposes; fetching fewer outputs of one session changes nothing of that). The price
is one more forward pass over the scoring samples per group (layout-cdla: 9 groups, and its scoring took
27 -> 30 s, avx2, 2 threads, on a shared machine; PP-OCRv4-det: 5 groups, 15 -> 11 s: fewer pages to
fault). Within a group, a tensor leaves the cache once the last scoring that reads it is done
(`release_after`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import onnx

# Bytes of cached tensors per group (all scoring samples together); a single tensor's reads may exceed it.
BUDGET = 1 << 30


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
