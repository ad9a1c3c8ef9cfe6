"""`--method auto`: per tensor, keep the candidate threshold that moves the consuming layers' outputs least.

No single threshold method suits every tensor. Entropy (TensorRT's KL search) is right for the bell-shaped
activations of classifiers, and wrong where a few large values carry the signal: on PP-OCRv4's recogniser
it clips a tensor whose few large channels feed large weights, and one 1x1 conv's output falls to cosine
0.54 with FP32 (issue #21); max is right there and wastes resolution elsewhere. So for every calibrated
tensor the candidates of `AUTO_CANDIDATES` (entropy, mse, percentile, max: already computed from the one
histogram) are scored by what they do downstream:

1. run the FP32 model once on a few held-back samples with every scored tensor, every other input of the
   nodes that read one, and those nodes' outputs exposed (cached for step 2: the outputs are the reference);
2. for each tensor and each node that reads it, run that node alone (a one-node ONNX model in ONNX Runtime,
   the node's own weights) on the input rounded and clipped to each candidate's INT8 grid, all candidates
   stacked along the batch axis in one call (Add, Sub, Mul and Concat are computed without running them,
   with the same numbers: `trtopt.calib.auto_nodes`);
3. the score of a candidate is the sum over those nodes of ||y_q - y||^2 / ||y||^2; the lowest wins, ties
   go to the earlier candidate. A node that cannot run alone on stacked samples (a Reshape to a fixed
   batch, a shape computation) is replaced by the tensor's own relative squared error.

Weighting the rounding error by the consumer's weights is the point: an error on a channel that a conv
multiplies by 40 counts 40 times more.

Cost (measured in BENCHMARKS.md, section *auto calibration cost*): one forward pass of the model over the
scoring samples for the cache, and about one more per distinct candidate (each consumer runs once per
candidate); the histograms are not collected again. Work that cannot change the result is skipped: equal
candidates are scored once (`distinct_candidates`), a tensor with one distinct candidate is not run at
all, and the calibration stage passes its bounded activations (ReLU6, Sigmoid outputs), whose threshold it
sets to their maximum anyway, with the max candidate alone (`trtopt.calib.collect.calibrate`'s `at_max`).
On top of the forward passes come the MSE search of every scored tensor's histogram, the rounding to each
candidate's grid and the error sums: compiled loops that read each value once (`trtopt.calib.auto_kernels`).
Profiled on the models of that section (1 intra-op thread, issue #21), the scoring spent half its time
outside the consumers' convolutions: numpy's four passes of fake quantisation and float32 error sums,
ONNX Runtime runs of elementwise consumers and Concats (with a copy of their other inputs per candidate),
joining the cache from per-batch arrays, fresh output arrays per consumer run (page faults), and the MSE
search (numpy over 1920 candidates x 2048 bins per tensor); each is now a single pass or gone, and the
choices are the same (docs/benchmarks/auto-calibration-cost-choices.json in git, at 834753b).

Two approximations, both deliberate. Each tensor is scored with every other tensor float: the errors of
different layers mostly add up, and scoring them jointly would cost a model run per combination. And the
grid is the symmetric one (T / 127) of the plan's Q/DQ graph, also for the non-negative tensors that the CPU
lowering stores at T / 255: that finer grid makes clipping relatively costlier than rounding, so auto's
choice there errs, if anything, towards clipping. Memory: what scoring reads (every scored tensor and
the inputs and outputs of the nodes reading them, for SCORE_SAMPLES samples) is 3.2 GiB on PP-OCRv4's
detector at 640 x 640 and 6.5 GiB on the zoo's layout-cdla at 800 x 608; it is cached in groups of tensors
whose reads fit `trtopt.calib.auto_cache.scoring_budget()` (a quarter of the free memory, 1 to 4 GiB), one
forward pass per group (as far as the group's tensors), with the same
values as one pass for all; then one tensor's candidates at a time, and one scratch array per consumer
output, as large as the largest stacked output so far. The exposing session has no memory arena (it
would keep a pass's peak) and its outputs are copied out one at a time (`_released_run`).

The scoring samples must not be the samples the build verifies its plan on
(`trtopt.data.samples.calibration_and_checks` holds those back first); `trtopt.calib.stage.calibrate_graph`
then holds back `SCORE_SAMPLES` more from the histograms (`scoring_split`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from trtopt.calib.auto_cache import cache_groups, declared_sizes, prefix_model, reads, release_after, scoring_budget
from trtopt.calib.auto_kernels import fake_quantize_at, quantize_stack
from trtopt.calib.auto_nodes import NodeRunner as _NodeRunner
from trtopt.calib.auto_nodes import quiet_run
from trtopt.calib.auto_nodes import relative_errors as _relative_errors
from trtopt.calib.thresholds import QMAX

log = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]
# Samples the candidates are scored on: a few suffice, each holds thousands of values per tensor.
SCORE_SAMPLES = 8
# Candidate thresholds closer than this (relative) are one candidate, scored once.
SAME_THRESHOLD = 1e-6


@dataclass(frozen=True)
class TensorChoice:
    """The threshold `auto` kept for one tensor, the method that gave it, and every candidate's score."""

    method: str
    amax: float
    scores: Mapping[str, float]  # method -> relative squared error downstream
    scored_by: str  # "consumers" (node outputs) or "tensor" (its own error)


def scoring_split(dataset: Any, batch: int) -> tuple[Any, list[tuple[Feeds, int]]]:
    """(samples to histogram, (feeds, rows) batches to score candidates on) from a `trtopt.data.Dataset`.

    A calibration set of at least 4 x SCORE_SAMPLES gives its last SCORE_SAMPLES to scoring alone; a smaller
    one scores on its first samples, which it also histograms (a choice between four candidates per tensor
    has little room to overfit them). `trtopt.build` holds the verification samples back before this, so a
    plan is never judged on the samples that chose its thresholds.
    """
    count = min(SCORE_SAMPLES, len(dataset))
    if len(dataset) >= 4 * count:
        dataset, scored = dataset.split_tail(count)
    else:
        scored = dataset.split_tail(len(dataset) - count)[0] if len(dataset) > count else dataset
        log.info("auto calibration scores on %d of its %d calibration samples (too few to hold any back)",
                 count, len(dataset))  # fmt: skip
    return dataset, [(b.feeds, b.feed_rows) for b in scored.batches(batch)]


def fake_quantize(values: np.ndarray, amax: float, *, out: np.ndarray | None = None) -> np.ndarray:
    """Round to the symmetric INT8 grid of threshold `amax` and back (TensorRT's Q/DQ, zero point 0), as
    float32; into `out` (the shape of `values`) if given."""
    out = np.empty(np.shape(values), np.float32) if out is None else out
    return fake_quantize_at(values, np.float32(amax / QMAX), out)


def choose_thresholds(
    model: onnx.ModelProto,
    candidates: Mapping[str, Mapping[str, float]],
    batches: Iterable[tuple[Feeds, int]],
    *,
    threads: int | None = None,
    on_tensor: Callable[[int, int], None] | None = None,
) -> dict[str, TensorChoice]:
    """For each tensor of `candidates` (tensor -> method -> T), the best candidate on `batches` ((feeds,
    rows) pairs: the rows of each batch that are real samples, as verification uses them). `on_tensor`
    hears (tensors scored, tensors to score) after each (a 1024 x 1024 segmenter scores for minutes)."""
    from trtopt.execution import OrtSession

    distinct = {name: distinct_candidates(options) for name, options in candidates.items()}
    choices = {name: _only(found) for name, found in distinct.items() if len(found) == 1}
    scored = [name for name in candidates if name not in choices]
    if not scored:
        return choices
    consumers = _consumers(model, set(scored))
    nodes = [n for found in consumers.values() for n in found]
    # what the consumers read, and their float outputs: the reference each candidate is measured against
    needed = set(scored) | {t for n in nodes for t in (*n.input, *n.output) if t}
    needed -= {t.name for t in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input}
    # No arena: it would keep a run's peak (every exposed tensor) mapped beside the cache. The scored tensors
    # go in groups whose reads fit a budget, each group from a run of the graph cut to what it depends on,
    # with the same tensors exposed (the same values as one run for all: trtopt.calib.auto_cache), and each
    # read leaves the cache after its last scoring.
    batches = list(batches)
    sizes = declared_sizes(model, sum(rows for _, rows in batches))
    runner = _NodeRunner(model, threads)
    report = on_tensor or (lambda done, total: None)
    report(0, len(scored))
    done = 0
    groups = cache_groups(scored, consumers, sizes, budget=scoring_budget())
    for group in groups:
        wanted = sorted({t for n in group for t in reads(n, consumers)} & needed)
        cut = prefix_model(model, wanted) if len(groups) > 1 else None  # the nodes the group depends on
        source = cut if cut is not None else model
        made = {o for node in source.graph.node for o in node.output}
        session = OrtSession(source, expose=sorted((needed - graph_inputs) & made), threads=threads, spin=False,
                             arena=False)  # fmt: skip
        cached = _run(session, batches, wanted)
        released = release_after(group, consumers, cached)
        for index, name in enumerate(group):
            choices[name] = _choose(name, distinct[name], cached, consumers.get(name, []), runner)
            for finished in released[index]:
                del cached[finished]
            done += 1
            report(done, len(scored))
    return {name: choices[name] for name in candidates}


def distinct_candidates(options: Mapping[str, float]) -> dict[str, float]:
    """`options` (method -> T, in preference order) without the thresholds equal to an earlier one (within
    SAME_THRESHOLD, relative): the same grid scores the same, so it is scored once, under the first name."""
    distinct: dict[str, float] = {}
    for method, amax in options.items():
        if not any(abs(amax - kept) <= SAME_THRESHOLD * max(amax, kept) for kept in distinct.values()):
            distinct[method] = amax
    return distinct


def _only(distinct: Mapping[str, float]) -> TensorChoice:
    method, amax = next(iter(distinct.items()))
    return TensorChoice(method, amax, {method: 0.0}, "tensor")


def _choose(
    name: str,
    distinct: Mapping[str, float],
    cached: Mapping[str, np.ndarray],
    nodes: Sequence[onnx.NodeProto],
    runner: _NodeRunner,
) -> TensorChoice:
    values = cached[name]
    # Each candidate's rounding of the values, stacked along axis 0: made once, read by every node.
    stacked = quantize_stack(values, np.array(list(distinct.values()))).reshape(-1, *values.shape[1:])
    errors = np.zeros(len(distinct))
    scored = 0
    for node in nodes:
        node_errors = runner.errors(node, name, stacked, len(distinct), cached)
        if node_errors is not None:
            errors += node_errors
            scored += 1
    if scored == 0 and values.size:  # an empty tensor: every candidate rounds it alike
        errors = _relative_errors(stacked, values)
    best = int(np.argmin(errors))  # the first of equal scores: the candidates come in preference order
    method = list(distinct)[best]
    scores = dict(zip(distinct, (float(e) for e in errors), strict=True))
    return TensorChoice(method, distinct[method], scores, "consumers" if scored else "tensor")


def _consumers(model: onnx.ModelProto, names: set[str]) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in dict.fromkeys(node.input):
            if name in names:
                found.setdefault(name, []).append(node)
    return found


def _run(session: Any, batches: Iterable[tuple[Feeds, int]], names: list[str]) -> dict[str, np.ndarray]:
    """Every tensor of `names` over all `batches`, the real rows of each batch joined along axis 0.

    The float tensors that grow with the batch get their joined array after the first batch, and ONNX
    Runtime writes the later full batches straight into their rows (IO binding): no array per batch to
    join (that copy was a tenth of auto's scoring time on ddddocr's detector, at batch 1). A batch that
    does not fit (other shapes than the first batch's) falls back to `_run_plain` for the whole cache.
    """
    batches = list(batches)
    total = sum(rows for _, rows in batches)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    joined: dict[str, np.ndarray] = {}
    offset = 0
    for feeds, rows in batches:
        size = _batch_rows(feeds)
        wanted = [n for n in names if n not in feeds]
        into = {n: joined[n][offset : offset + size] for n in wanted if n in joined} if rows == size else {}
        outputs = _outputs(session, feeds, wanted, into)
        if outputs is None:
            return _run_plain(session, batches, names)
        for name in names:
            if name in into:
                continue
            value = np.asarray(feeds[name] if name in feeds else outputs[name])
            part = value[:rows] if value.ndim > 0 and value.shape[0] == size and rows < size else value
            grows = name not in feeds and np.issubdtype(part.dtype, np.floating) and part.ndim > 0
            if offset == 0 and len(batches) > 1 and grows and part.shape[0] == rows == size:
                joined[name] = np.empty((total, *part.shape[1:]), part.dtype)
                joined[name][:rows] = part
            elif name in joined:
                if part.shape != (rows, *joined[name].shape[1:]) or part.dtype != joined[name].dtype:
                    return _run_plain(session, batches, names)
                joined[name][offset : offset + rows] = part
            else:
                parts[name].append(part)
        offset += rows
    return {**{name: _join(values) for name, values in parts.items() if values}, **joined}


def _outputs(session: Any, feeds: Feeds, wanted: list[str], into: Mapping[str, np.ndarray]) -> Feeds | None:
    """`session`'s `wanted` outputs on `feeds`, those of `into` written into its arrays (None: they do not
    fit); the others as ONNX Runtime returns them."""
    if not into:
        return _released_run(session, feeds, wanted) if wanted else {}
    binding = session.session.io_binding()
    for name in session.input_names:
        binding.bind_cpu_input(name, np.ascontiguousarray(feeds[name]))
    for name in wanted:
        if name in into:
            array = into[name]
            binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        else:
            binding.bind_output(name, "cpu")
    try:
        session.session.run_with_iobinding(binding, quiet_run())
    except _ort_failures():
        return None  # an output of another shape than its array's
    values = dict(zip(wanted, binding.get_outputs(), strict=True))
    return {name: value.numpy() for name, value in values.items() if name not in into}


def _run_plain(session: Any, batches: Iterable[tuple[Feeds, int]], names: list[str]) -> dict[str, np.ndarray]:
    """`_run` with one array per batch, joined at the end."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for feeds, rows in batches:
        wanted = [n for n in names if n not in feeds]
        outputs = {**feeds, **(_released_run(session, feeds, wanted) if wanted else {})}
        size = _batch_rows(feeds)
        for name in names:
            value = np.asarray(outputs[name])
            keep = value.ndim > 0 and value.shape[0] == size and rows < size
            parts[name].append(value[:rows] if keep else value)
    return {name: _join(values) for name, values in parts.items()}


def _released_run(session: Any, feeds: Feeds, wanted: list[str]) -> dict[str, np.ndarray]:
    """`session.run(feeds, outputs=wanted)`, with each output copied out of ONNX Runtime's buffer and that
    buffer let go before the next is copied (IO binding): `session.run` copies all of them while holding
    all, twice the exposed tensors at once. The same values (the same run); its errors as `session.run`'s."""
    failures: tuple[type[BaseException], ...] = (KeyError, *_ort_failures())
    try:
        binding = session.session.io_binding()
        for name in session.input_names:
            binding.bind_cpu_input(name, np.ascontiguousarray(feeds[name]))
        for name in wanted:
            binding.bind_output(name, "cpu")
        session.session.run_with_iobinding(binding, quiet_run())
    except failures:
        return dict(session.run(feeds, outputs=wanted))  # its message for the caller
    values = binding.get_outputs()
    binding.clear_binding_outputs()
    outputs = {}
    for index, name in enumerate(wanted):
        outputs[name] = values[index].numpy()
        values[index] = None  # ONNX Runtime's copy goes now (the session has no arena to keep it)
    return outputs


def _ort_failures() -> tuple[type[BaseException], ...]:
    import onnxruntime as ort

    return (ort.capi.onnxruntime_pybind11_state.Fail, RuntimeError)


def _join(values: list[np.ndarray]) -> np.ndarray:
    """Batches joined along axis 0; a value that does not grow with the batch (a shape) is kept once."""
    if len(values) == 1 or values[0].ndim == 0 or any(v.shape[1:] != values[0].shape[1:] for v in values):
        return values[0]
    if not np.issubdtype(values[0].dtype, np.floating):
        return values[0]
    return np.concatenate(values)


def _batch_rows(feeds: Feeds) -> int:
    first = next(iter(feeds.values()))
    return int(first.shape[0]) if np.ndim(first) > 0 else 1
