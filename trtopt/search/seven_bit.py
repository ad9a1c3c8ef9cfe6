"""Which dense INT8 layers get 7-bit weights: chosen per layer by measurement, within a fidelity budget (issue #45).

On CPUs whose u8s8 kernels saturate (AVX2, AVX-512 without VNNI), a dense layer runs ONNX Runtime's fast u8s8
kernels exactly only with weights of at most 7 bits (`trtopt.backend.cpu.isa`); with 8-bit weights it must run
the exact but slower u8u8 kernels. The 7-bit grid halves the weight resolution, so each layer narrowed is speed
bought with fidelity. The search, on the sensitivity search's samples (`trtopt.search.sensitivity.search_samples`),
in the form the backend builds (`Backend.measured_form`), with ONNX Runtime's optimisations off (the INT8 math
exactly):

1. a plan's cost is the error it adds against FP32: with e8 an output's relative error against FP32 (over all
   samples) in the 8-bit plan and e its error in the plan measured, sqrt(max(e^2 - e8^2, 0)) / e8, the worst output's
   figure (errors of independent origin add in squares). A plan is within budget at `TOLERANCE` or less: its error
   against FP32 grows by at most sqrt(1 + TOLERANCE^2) (1.41x), and the build's verification then holds its kernels
   to the narrowed plan's own reference. (Measuring the distance from the 8-bit plan instead counts both roundings:
   on ResNet-18 it allowed 2 of 20 layers where all 20 add 0.85 of e8.) A plan whose worst output cosine (the
   sensitivity search's figure, `trtopt.search._trials.cosine_figure`) falls below the search's aim (0.99), or below
   the 8-bit plan's where that is lower, is over budget whatever it adds;
2. every dense layer narrowed at once: kept where it is within budget (one trial; the common case);
3. else each layer narrowed alone; the layers are taken cheapest first (squared cost per multiply-add: the u8s8
   kernels' gain over u8u8 grows with a layer's work) while the squared costs add up within the budget; the
   set is then measured together and cut back by a quarter at a time, at most `CONFIRMS` times, until it is within.

Speed is not timed per layer: every dense conv measured ran faster on the u8s8 kernel than on u8u8 (BENCHMARKS.md,
*INT8 conv kernels*: 1.3-1.8x on an AVX2 EPYC), and the build times the whole plan against FP32 afterwards
(`trtopt.backend.cpu.speed`). `choose_layers` and `select` read only the figures they are given (tests inject them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

log = logging.getLogger(__name__)

TOLERANCE = 1.0  # the error 7-bit weights may add against FP32, in units of the 8-bit plan's (in squares)
CONFIRMS = 3  # measurements of the chosen set together, each cutting it back by a quarter when over budget
FLOOR = 1e-6  # an 8-bit plan error below this (an output quantisation does not touch) counts as this
DENSE = ("Conv", "Gemm", "MatMul")

Measure = Callable[[Sequence[str]], float]  # layers narrowed -> the error they add (units of the 8-bit plan's)


@dataclass(frozen=True)
class SevenBit:
    """What the search chose: the narrowed layers, of how many candidates, the error they add against FP32 (in units
    of the 8-bit plan's error), and how many trials it ran (the plan record's "seven_bit_weights" entry)."""

    layers: tuple[str, ...]
    candidates: int
    added_error: float
    trials: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"layers": list(self.layers)}


def choose_layers(alone: Mapping[str, float], work: Mapping[str, float], budget: float = TOLERANCE) -> list[str]:
    """The layers to narrow, cheapest first, from the error each one adds narrowed alone (`alone`) and its
    multiply-adds (`work`): squared errors add up to at most `budget` squared."""
    order = sorted(alone, key=lambda n: (alone[n] ** 2 / max(work.get(n, 1.0), 1.0), n))
    chosen, spent = [], 0.0
    for name in order:
        cost = alone[name] ** 2
        if np.isfinite(cost) and spent + cost <= budget**2:
            chosen.append(name)
            spent += cost
    return chosen


def select(measure: Measure, candidates: Sequence[str], work: Mapping[str, float], budget: float = TOLERANCE
           ) -> SevenBit:  # fmt: skip
    """The search of the module doc over `candidates`, `measure(layers)` being the error a plan adds."""
    if not candidates:
        return SevenBit((), 0, 0.0, 0)
    everything = measure(candidates)
    if everything <= budget:
        return SevenBit(tuple(candidates), len(candidates), everything, 1)
    alone = {name: measure((name,)) for name in candidates}
    chosen, trials = choose_layers(alone, work, budget), 1 + len(candidates)
    for _ in range(CONFIRMS):
        if not chosen:
            break
        moved = measure(chosen)
        trials += 1
        if moved <= budget:
            return SevenBit(tuple(chosen), len(candidates), moved, trials)
        chosen = chosen[: len(chosen) * 3 // 4]
    return SevenBit((), len(candidates), 0.0, trials)


def dense_candidates(graph: gs.Graph, layers: Sequence[str]) -> dict[str, float]:
    """The dense layers among `layers` (INT8 ones) with their multiply-adds per sample (weights x output positions
    where the graph knows them): Conv that is not depthwise, Gemm and MatMul with a constant weight."""
    nodes = {n.name: n for n in graph.nodes}
    found = {}
    for name in layers:
        node = nodes.get(name)
        if node is None or node.op not in DENSE or len(node.inputs) < 2:
            continue
        weight = node.inputs[1]
        if not isinstance(weight, gs.Constant) or weight.values.ndim < 2:
            continue
        if node.op == "Conv" and int(node.attrs.get("group", 1)) > 1 and weight.values.shape[1] == 1:
            continue  # depthwise: its kernel is exact with 8-bit weights on every CPU
        shape = node.outputs[0].shape or []
        positions = np.prod([d for d in shape[2:] if isinstance(d, int) and d > 0]) if node.op == "Conv" else 1
        found[name] = float(weight.values.size * positions)
    return found


def seven_bit_for_build(graph: gs.Graph, quant: Any, qplan: Any, calibration: Any, data: Any, batch: int,
                        lower: Callable[[Any], Any]) -> tuple[Any, SevenBit | None]:  # fmt: skip
    """For `trtopt.build`: `quant` (a `QuantConfig`) with the dense INT8 layers of `qplan` (after the sensitivity
    search, whose float layers stay float and whose thresholds `calibration` holds) that get 7-bit weights, and the
    search's record; measured on the search samples of the `trtopt.data.Dataset` `data` in the form `lower` gives.
    `quant` as it is, and None, where it does not ask for the search or there is no data."""
    from trtopt.search.sensitivity import search_samples

    if not quant.seven_bit_search or data is None:
        return quant, None
    kept = replace(quant, exclude=(*quant.exclude, *qplan.float_layers))
    found = seven_bit_layers(graph, kept, calibration, search_samples(data, batch)[0], lower)
    return replace(quant, seven_bit_layers=found.layers), found


def seven_bit_layers(graph: gs.Graph, quant: Any, calibration: Any, batches: Any,
                     lower: Callable[[Any], Any]) -> SevenBit:  # fmt: skip
    """The dense INT8 layers of the plan `quant` places that get 7-bit weights, measured on `batches` in the form
    `lower` gives."""
    from trtopt.errors import TrtoptError
    from trtopt.frontend.model_errors import plan_errors
    from trtopt.quant.placement import plan_quantization
    from trtopt.verify.selection import judged_graph

    searched, layers = judged_graph(graph, plan_quantization(graph, quant).quantized_layers)
    work = dense_candidates(searched, layers)
    failures: tuple[type[BaseException], ...] = (TrtoptError, *plan_errors())
    try:
        measure = _measurer(searched, quant, calibration, batches, lower, list(work))
        found = select(measure, list(work), work)
    except failures as exc:  # ONNX Runtime cannot run the Q/DQ graph as float math
        log.warning("no 7-bit weights: %s", str(exc).strip().splitlines()[0])
        return SevenBit((), len(work), 0.0, 0)
    log.info("7-bit weights on %d of %d dense INT8 layers (they add %.2f of the 8-bit plan's error against FP32, in "
             "squares; %d trials)", len(found.layers), found.candidates, found.added_error, found.trials)  # fmt: skip
    return found


def _measurer(graph: gs.Graph, quant: Any, calibration: Any, batches: Any, lower: Callable[[Any], Any],
              candidates: Sequence[str]) -> Measure:  # fmt: skip
    from trtopt.execution import OrtSession
    from trtopt.frontend import onnx_from_graph
    from trtopt.search._trials import DownstreamTrials, cosine_figure
    from trtopt.search.sensitivity import MIN_COSINE, quantized_model
    from trtopt.verify import collect

    fp32 = collect(OrtSession(onnx_from_graph(graph), spin=False).run, batches)
    base = quantized_model(graph, quant, calibration, quant.bias_correction, lower=lower)
    trials = DownstreamTrials(base, batches, candidates)
    eight = _joined(trials.base_outputs(), batches)
    names = [n for n, v in eight.items() if n in fp32 and np.issubdtype(v.dtype, np.floating)]
    unit = {n: max(relative_error(eight[n], fp32[n]), FLOOR) for n in names}
    floor = min(MIN_COSINE, cosine_figure(eight, fp32))  # the sensitivity search's aim, where the plan reached it

    def measure(layers: Sequence[str]) -> float:
        narrowed = replace(quant, seven_bit_layers=tuple(layers))
        got = _joined(trials.run(quantized_model(graph, narrowed, calibration, quant.bias_correction, lower=lower)),
                      batches)  # fmt: skip
        if cosine_figure(got, fp32) < floor:
            return float("inf")  # never below the sensitivity search's aim
        return max((added_error(relative_error(got[n], fp32[n]), unit[n]) for n in names), default=0.0)

    return measure


def added_error(error: float, eight: float) -> float:
    """The error a plan adds to the 8-bit plan's `eight` (both relative errors against FP32), in units of `eight`."""
    return float(np.sqrt(max(error**2 - eight**2, 0.0)) / eight) if np.isfinite(error) else float("inf")


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| over all elements (inf where they differ and want is all zeros)."""
    diff = float(np.linalg.norm((got.astype(np.float64) - want.astype(np.float64)).ravel()))
    norm = float(np.linalg.norm(want.astype(np.float64).ravel()))
    return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))


def _joined(outputs: Sequence[Mapping[str, np.ndarray]], batches: Any) -> dict[str, np.ndarray]:
    from trtopt.verify import collect

    runs = iter(outputs)
    return collect(lambda _feeds: dict(next(runs)), batches)
