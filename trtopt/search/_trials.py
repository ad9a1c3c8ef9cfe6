"""Sensitivity trials that recompute only what a trial changes (trtopt.search.sensitivity).

A trial keeps a few layers float: its Q/DQ graph differs from the plan's own graph around those layers
(their Q/DQ, their weights, what bias correction and the Concat range rule redo there), and every tensor
upstream of the changes is the same as in the plan's graph. `DownstreamTrials` runs the plan's graph once
over the samples and keeps its tensors; a trial then runs only the nodes whose outputs differ, fed at the
boundary with the kept tensors, and takes every unchanged output from the kept run.

Which nodes differ is found by content, not by name: each tensor gets a fingerprint made of its
producer's operator, attributes and input fingerprints (initializers by their bytes, graph inputs by
name), and a trial tensor whose fingerprint the plan's graph also has holds the same values on the same
samples. So whatever a trial re-quantises, the recomputed part is exactly what changed, and the cosine is
that of the full trial graph (the same ONNX Runtime kernels on the same inputs, optimisations off).

Memory: the kept tensors are those the trials of the layers to be tried will read from outside their
changes (`_boundaries`: a guess from the plan's graph), taken at the compute node that made them (not at
its Q/DQ, recomputed cheaply), for every sample, up to `budget` bytes in all, in the order of the layers
(the first batch's sizes decide, for every batch: no batch is larger). A boundary tensor that was not kept
is recomputed from further upstream, so the budget trades time for memory and never changes a result;
the peak is the first batch's run with every candidate exposed.
Graphs with subgraph attributes (If, Loop, Scan: their bodies read outer tensors by name) run whole.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from trtopt.metrics.labels import LabelAgreement, is_label_map
from trtopt.passes.query import proto_links

log = logging.getLogger(__name__)

BUDGET = 1 << 30  # bytes of kept tensors (for all samples together)
_CHEAP = {"QuantizeLinear", "DequantizeLinear", "Constant", "Shape", "Identity"}

Batches = Sequence[tuple[Mapping[str, np.ndarray], int]]


def fingerprints(model: onnx.ModelProto) -> dict[str, bytes]:
    """Tensor name -> fingerprint of what computes it (see the module doc). An input read before it is made
    (a graph out of topological order) gets a mark of this model alone: such a node never matches, so it
    and what it reads are recomputed."""
    graph = model.graph
    alone = b"?" + id(model).to_bytes(8, "little")
    prints: dict[str, bytes] = {i.name: b"input:" + i.name.encode() for i in graph.input}
    for init in graph.initializer:
        digest = hashlib.blake2b(digest_size=16)
        digest.update(bytes([init.data_type]) + str(list(init.dims)).encode())
        digest.update(init.raw_data if init.HasField("raw_data") else _without_name(init).SerializeToString())
        prints[init.name] = b"init:" + digest.digest()
    for node in graph.node:
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{node.domain}:{node.op_type}".encode())
        for attr in sorted(node.attribute, key=lambda a: a.name):
            digest.update(attr.SerializeToString())
        for name in node.input:
            digest.update(b"|" + prints.get(name, alone + name.encode()) if name else b"|-")
        for index, name in enumerate(node.output):
            if name:
                prints[name] = digest.copy().digest() + index.to_bytes(4, "little")
    return prints


def _without_name(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.ClearField("name")
    return copy


def has_subgraphs(model: onnx.ModelProto) -> bool:
    graph_types = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    return any(a.type in graph_types for n in model.graph.node for a in n.attribute)


class DownstreamTrials:
    """Outputs of Q/DQ graphs that differ from `base` in places, on `batches`, recomputing only the changes."""

    def __init__(self, base: onnx.ModelProto, batches: Batches, layers: Sequence[str], budget: int = BUDGET) -> None:
        from trtopt.execution import OrtSession

        self.batches = list(batches)
        self.base_prints = {p: name for name, p in fingerprints(base).items()}
        self.whole = has_subgraphs(base)
        outputs = self.outputs = [o.name for o in base.graph.output]
        kept = [] if self.whole else [t for t in _boundaries(base, layers) if t not in set(outputs)]
        session = OrtSession(base, expose=kept, opt_level="disable", spin=False)
        self.cache: list[dict[str, np.ndarray]] = []
        for feeds, _rows in self.batches:  # the first batch decides what is kept: the others are no larger
            self.cache.append(session.run(feeds, outputs=[*outputs, *kept]))
            if len(self.cache) == 1:
                kept = _within(self.cache[0], kept, outputs, budget // len(self.batches))
                self.cache[0] = {name: self.cache[0][name] for name in [*outputs, *kept]}
        self.kept_bytes = sum(v.nbytes for part in self.cache for v in part.values())
        log.info("sensitivity trials keep %d tensors of the plan's run (%.0f MB)", len(kept), self.kept_bytes / 2**20)
        self.nodes_run = 0  # nodes the trials have run, for tests and reports

    def base_outputs(self) -> list[dict[str, np.ndarray]]:
        """The plan's own outputs on each batch, from the kept run."""
        return [{o: part[o] for o in self.outputs} for part in self.cache]

    def run(self, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
        """`model`'s outputs on each batch (every row, as ONNX Runtime gives them)."""
        from trtopt.execution import OrtSession

        outputs = [o.name for o in model.graph.output]
        made = {out for node in model.graph.node for out in node.output}
        if self.whole or not set(outputs) <= made:  # an output that is an input or a constant: run it whole
            whole = OrtSession(model, opt_level="disable", spin=False)
            self.nodes_run += len(model.graph.node)
            return [whole.run(feeds, outputs=outputs) for feeds, _rows in self.batches]
        cut, sources = self._cut(model)
        self.nodes_run += len(cut.graph.node)
        session = OrtSession(cut, opt_level="disable", spin=False) if cut.graph.node else None
        results = []
        for (feeds, _rows), kept in zip(self.batches, self.cache, strict=True):
            got = {name: kept[base] for name, base in sources.items() if name in outputs}
            if session is not None:
                inputs = {name: kept[base] for name, base in sources.items()} | dict(feeds)
                got |= session.run(inputs)
            results.append({name: got[name] for name in outputs})
        return results

    def _cut(self, model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
        """The part of `model` that must run, and its tensors taken from the kept run (name -> base name)."""
        graph = model.graph
        prints = fingerprints(model)
        producer = {out: node for node in graph.node for out in node.output if out}
        initializers = {i.name for i in graph.initializer}
        inputs = {i.name for i in graph.input}
        kept = self.cache[0] if self.cache else {}
        sources: dict[str, str] = {}
        needed: set[int] = set()
        stack = [o.name for o in graph.output]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen or not name or name in initializers or name in inputs:
                continue
            seen.add(name)
            base = self.base_prints.get(prints.get(name, b""))
            if base is not None and base in kept:
                sources[name] = base
                continue
            node = producer[name]
            needed.add(id(node))
            stack.extend(node.input)
        nodes = [n for n in graph.node if id(n) in needed]
        return _submodel(model, nodes, sources, {s: kept[b] for s, b in sources.items()}), sources


def _boundaries(base: onnx.ModelProto, layers: Sequence[str]) -> list[str]:
    """The compute-node tensors a trial of each of `layers` kept float will likely read from the kept run, in
    `layers`' order: what the layer's downstream reads from outside it, followed up through Q/DQ nodes
    (cheap to recompute) to the compute node that made it. A guess from `base` alone: re-quantising may
    change a little more (a Concat's other inputs), which then runs from further upstream."""
    graph = base.graph
    producer, consumers = proto_links(graph)
    by_name = {node.name: node for node in graph.node}
    found: dict[str, None] = {}
    for layer in layers:
        if layer not in by_name:
            continue
        region, stack = set(), [by_name[layer]]
        while stack:
            node = stack.pop()
            if id(node) not in region:
                region.add(id(node))
                stack.extend(c for out in node.output for c in consumers.get(out, ()))
        reads = [t for n in graph.node if id(n) in region for t in n.input if t in producer]
        for name in reads:
            if id(producer[name]) not in region:
                found.update(dict.fromkeys(_compute_sources(name, producer)))
    return list(found)


def _compute_sources(name: str, producer: Mapping[str, onnx.NodeProto]) -> list[str]:
    """`name`, or the outputs of the compute nodes it is made from through Q/DQ-like nodes only."""
    node = producer.get(name)
    if node is None:
        return []  # a graph input or initializer: never kept
    if node.op_type not in _CHEAP:
        return [name]
    return [s for t in node.input if t for s in _compute_sources(t, producer)]


def _within(first: Mapping[str, np.ndarray], order: Sequence[str], always: Sequence[str], budget: int) -> list[str]:
    """The names of `order`, in order, whose arrays in `first` fit in `budget` bytes beside those of `always`."""
    total = sum(first[name].nbytes for name in always)
    chosen = []
    for name in order:
        if total + first[name].nbytes <= budget:
            total += first[name].nbytes
            chosen.append(name)
    return chosen


def _submodel(
    model: onnx.ModelProto, nodes: list[onnx.NodeProto], sources: Mapping[str, str], values: Mapping[str, np.ndarray]
) -> onnx.ModelProto:
    """`nodes` of `model` as a model fed with `sources` (typed from `values`) and the graph inputs they read."""
    graph = model.graph
    read = {name for node in nodes for name in node.input if name}
    made = {name for node in nodes for name in node.output if name}
    feeds = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(values[name].dtype),
                                      [None] * values[name].ndim)
        for name in sorted((read & set(sources)) - made)  # a node run for one output makes its others
    ]  # fmt: skip
    feeds += [i for i in graph.input if i.name in read]
    outputs = [o for o in graph.output if o.name in made]
    initializers = [i for i in graph.initializer if i.name in read]
    sub = helper.make_graph(nodes, "trial", feeds, outputs, initializers)
    cut = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return cut


def sample_cosines(outputs: Sequence[Mapping[str, np.ndarray]], batches: Batches,
                   expected: Mapping[str, np.ndarray], split: bool = False) -> np.ndarray:  # fmt: skip
    """Each output's per-sample cosines to `expected`, a row per output in `expected`'s order
    (`trtopt.verify.agreement`'s figure, sample by sample: two zero samples agree, a non-finite one scores
    -1), from `outputs`, one mapping per batch of `batches`, trimmed to each batch's rows. As in
    `cosine_figures`, a label map scores its mean IoU, and per-position class scores the sample's top-class
    agreement where that is lower; with `split`, the cosines without that agreement too, where they differ
    (`trtopt.search._objective.split`)."""
    from trtopt.metrics.arrays import joined_batches, row_cosines, zero_padded
    from trtopt.search._objective import split as split_rows

    aims, steadies = [], []
    for name, want in expected.items():
        parts = [(o[name], rows) for o, (_f, rows) in zip(outputs, batches, strict=True)]
        got, ref = zero_padded([joined_batches(parts), want])
        n = len(want) if np.ndim(want) else 1  # a 0-d output (MatMul of two vectors) is one sample
        if is_label_map(np.asarray(want), None):
            aims.append(label_ious(got.reshape(n, -1), ref.reshape(n, -1)))
            steadies.append(aims[-1])
            continue
        tops = [_argmax_figure(got[i:i + 1], ref[i:i + 1]) for i in range(n)] if np.ndim(want) >= 3 else [1.0] * n
        got, ref = got.astype(np.float64).reshape(n, -1), ref.astype(np.float64).reshape(n, -1)
        cosines = row_cosines(got, ref)
        steadies.append(np.where(np.isfinite(cosines), cosines, -1.0))
        aims.append(np.minimum(steadies[-1], tops))
    if not aims:
        return np.ones((1, 1))
    return split_rows(np.array(aims), np.array(steadies)) if split else np.array(aims)


def label_ious(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """A label map's figure in place of its cosine, per row (sample): the mean IoU of its non-background classes
    (`trtopt.metrics.labels`). The cosine of class ids weighs class 2 twice class 1 and is carried by the
    background: wired-table-rec's line segmenter kept 99.55% of its pixels' labels and a cosine of 0.894 with
    a mean IoU of 83.2% for its two line classes (all-INT8 plan, 16 calibration pages, avx2)."""
    rows = []
    for test, ref in zip(got, want, strict=True):
        labels = LabelAgreement()
        labels.update(ref[np.newaxis], test[np.newaxis])
        rows.append(labels.mean_iou if labels.mean_iou is not None else 1.0)
    return np.array(rows, np.float64)


def worst_cosine(model: onnx.ModelProto, batches: Batches, expected: Mapping[str, np.ndarray]) -> float:
    """The search's figure for `model`'s Q/DQ reference against `expected` on `batches` (`cosine_figure`)."""
    from trtopt.execution import OrtSession
    from trtopt.verify import collect

    reference = OrtSession(model, opt_level="disable", spin=False)  # Q/DQ computed as float math
    return cosine_figure(collect(reference.run, batches), expected)


def output_figures(
    outputs: Sequence[Mapping[str, np.ndarray]], batches: Batches, expected: Mapping[str, np.ndarray],
    split: bool = False,
) -> np.ndarray:
    """`cosine_figures` of outputs already computed, one mapping per batch of `batches` (their lowest is
    `worst_cosine`'s figure); with `split`, `figure_pair`'s two rows where they differ
    (`trtopt.search._objective.split`)."""
    from trtopt.search._objective import split as split_rows
    from trtopt.verify import collect

    runs = iter(outputs)
    pair = figure_pair(collect(lambda _feeds: dict(next(runs)), batches), expected)
    return split_rows(*pair) if split else pair[0]


def cosine_figure(outputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> float:
    """The lowest output cosine both ways it is reported (`cosine_figures`)."""
    return float(np.min(cosine_figures(outputs, expected)))


def cosine_figures(outputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each output's cosine, in `expected`'s order, the lower of the two ways it is reported: the mean of
    per-sample cosines (the build's verification, `trtopt.verify.agreement`) and the cosine over all
    elements (`trtopt compare`, the zoo benchmark); -1 where either is not finite. They part most on small
    outputs: on table-cls's 2 logits, 0.992 per sample against 0.982 over all elements on the same
    calibration pages (avx2), so aiming at the first alone let a plan stop short of the second. A label map
    (`trtopt.metrics.labels.is_label_map`) is weighed by its mean IoU instead (`label_ious`), both ways, and
    per-position class scores by their top-class agreement where that is lower (`_argmax_figure`)."""
    return figure_pair(outputs, expected)[0]


def figure_pair(outputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(`cosine_figures`, the same without the top-class agreement): the search's aim and steady figures
    (`trtopt.search._objective`)."""
    from trtopt.metrics.agreement import agreement
    from trtopt.metrics.compare import ErrorStats

    aims, steadies = [], []
    for name, want in expected.items():
        if is_label_map(np.asarray(want), None):  # the mean IoU per sample and over all of them (`label_ious`)
            pooled = LabelAgreement()  # the labels alone: no cosine or error of the class ids to compute per trial
            pooled.update(np.asarray(want), np.asarray(outputs[name]))
            rows = len(want)
            per_sample = label_ious(np.asarray(outputs[name]).reshape(rows, -1), np.asarray(want).reshape(rows, -1))
            aims.append(min(float(np.mean(per_sample)), 1.0 if pooled.mean_iou is None else pooled.mean_iou))
            steadies.append(aims[-1])
            continue
        stats = ErrorStats(name)
        stats.update(np.asarray(want), np.asarray(outputs[name]))
        pair = (agreement({name: outputs[name]}, {name: want}).cosine, stats.cosine)
        steadies.append(min(pair) if np.all(np.isfinite(pair)) else -1.0)
        aims.append(min(steadies[-1], _argmax_figure(outputs[name], want)) if steadies[-1] > -1.0 else -1.0)
    if not aims:
        return np.ones(1), np.ones(1)
    return np.array(aims), np.array(steadies)


def _argmax_figure(got: np.ndarray, want: np.ndarray) -> float:
    """For per-position class scores (`trtopt.metrics.agreement.class_axis`: a tagger's or recogniser's [N, T, C]
    probabilities), the share of untied positions whose top class is FP32's; 1 for any other output. The build
    warns below `ARGMAX_MIN_AGREEMENT` (99%), the search's aim: slovorez's morpheme tagger (docs/holdout.md round
    8) kept a cosine of 0.998 and changed the tag of 5.4% of held-out letters, 36% of words, all from its last
    conv; the search, reading cosines alone, stopped at once."""
    from trtopt.metrics.agreement import argmax_counts, class_axis

    axis = class_axis(np.asarray(want))
    if axis is None:
        return 1.0
    same, untied = argmax_counts(np.asarray(got), np.asarray(want), axis)
    return same / untied if untied else 1.0
