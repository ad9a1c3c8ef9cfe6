"""Automatic exclusion (issue #16, part 3): when INT8 moves an output too far, keep the fewest layers in float.

TensorRT and Model Optimizer users find those layers by hand (Polygraphy's debug tools, `--exclude`); the
build does it for them, on calibration samples alone. It searches on the first `SAMPLES` (16) of them and,
when at least `SEARCH_LEAST` + `CONFIRM` (16) are there, holds the `CONFIRM` (8) after the search's back to
confirm what it keeps (a set of 16 searches on 8 and confirms on 8; fewer than 16 are all searched on):

1. quantise as usual and run the plan in the form its backend builds (`Backend.measured_form`: the CPU
   backend's lowered graph, TensorRT's Q/DQ graph as it is; ONNX Runtime, optimisations off: the INT8
   arithmetic exactly) against FP32; if every output keeps a cosine of at least `MIN_COSINE` on the search
   samples and on the confirmation samples, stop. The cosine is the lower of the two figures the project
   reports, output by output (`trials.cosine_figures`): the mean of per-sample cosines (the build's
   verification) and the cosine over all elements (`trtopt compare`, the zoo benchmark), or a label map's
   mean IoU (`trials.label_ious`) in its place; the confirmation samples' is the first;
2. sensitivity: for each of the `CANDIDATES` INT8 layers that add the most error (one run of the Q/DQ graph
   beside FP32, every layer's output compared, as `trtopt compare --per-layer` ranks them), every output's
   cosine with that layer alone kept float; a layer that alone lifts the worst to `MIN_COSINE` (on the
   confirmation samples too) ends this stage (one layer is the fewest there can be). Before, one trial keeps
   them all float at once (`trtopt.search._ceiling`): the search ends there, keeping none, when even that
   leaves the worst output below 0.95 (SLANet-plus: 107 trials in 11.5 minutes, then refused);
3. greedy: keep float the layer that gains most, then the next, re-measuring each time, until the worst
   output reaches `MIN_COSINE` on the search and the confirmation samples or `MAX_SHARE` of the layers are
   float. A layer's gain (`trtopt.search._objective`) is the larger of the worst output's rise and the cut of
   the outputs' summed shortfall below `MIN_COSINE` (one output: its rise), read from the cosines alone
   where the aim also weighs a top-class agreement (a recogniser's). A layer is kept only if it gains
   at least `MIN_GAIN` on the search samples, or lifts the worst output to `MIN_COSINE` (the last step),
   and the confirmation samples do not refute it: their paired
   per-sample gain, mean plus `NOISE` (2) standard errors, must reach `MIN_GAIN` (a layer that gains on the
   search samples alone, chance among the 48 tried, is refused; one the confirmation samples cannot tell
   from a gain is not); only layers that alone gained `MIN_GAIN` are tried: the stage ends where the sorted
   alone-gains fall below it, and never starts when none reaches it;
4. another round when the greedy stage kept some layers but ran out short of the aim: the first `LATER`
   (24) candidates not kept nor refused are tried again on top of the kept ones, and the greedy stage runs
   over those gains; `ROUNDS` (2) rounds at most, none after a round that kept nothing (same plans again);
5. still short: wider thresholds for the activations those candidates read (`trtopt.search._widen`), by the
   greedy stage's rules; they cost no run time (layout-cdla's error is spread past what float layers mend).

`MIN_GAIN` (0.001, a tenth of the error `MIN_COSINE` allows) is what a float layer must buy: it costs
latency on every inference, and the searches it cuts bought nothing (measured on the zoo with 8 search
samples and 16 candidates: ddddocr-det kept 6 layers for 0.9823 -> 0.9834 without it, none with it).

Why a second round (avx2; held-out: tools/bench_zoo.py's 16 samples, the plan as built; measured before the
search measured the CPU plan's lowered form and before equalisation crossed PP-LCNetV3's affine blocks):
the worst cosine is no sum of the layers' gains (a layer kept float changes which output is worst and what the others'
errors add up to), so a gain measured alone misjudges a layer beside those kept float. PP-OCRv4-det's
first round ends at 0.9893 (0.9920 confirmed) with p2o.Conv.61 and p2o.Conv.2; p2o.Conv.6, which alone
lowered the cosine (0.9004 -> 0.8986), lifts those two to 0.9935 (0.9937 confirmed): held-out 0.9891 ->
0.9934, text-map IoU 96.3% -> 97.3%. PP-OCRv4-rec's ends at 0.9807 (0.9674) with p2o.Conv.15 and
p2o.Conv.4; p2o.Conv.10, which beside p2o.Conv.15 alone had lowered it, lifts them to 0.9915 (0.9796):
held-out 0.9722 -> 0.9770, exact CTC match 62.5% -> 75%. A third round kept nothing there, nor a second
on layout-cdla (best try 0.9860 -> 0.9878, 0.9851 -> 0.9858 confirmed), hence 2. A later round's trials
cost more than the first's (each reruns all that the early kept layers change: 5.9 s against 2.3 s on
PP-OCRv4-det under load), and the layers it kept ranked 8th and 19th, hence `LATER`. No margin above
`MIN_COSINE`: table-cls reaches it (0.9929, 0.9913 confirmed, 0.9860 held-out), and aiming at 0.994
instead, the four layers that lift its search samples to 0.994-0.997 on top of the two kept each lower
the confirmation samples to 0.979-0.985. Measured again with the final rule (below): aiming at 0.994 left
PP-OCRv4-rec and layout-cdla as they were and cost ddddocr-det box F1 (93.4% -> 88.3%, one more layer).

Why the aim is the lower of two cosines on both sample sets: a plan stopped at step 1 on its search samples
alone (PP-OCRv4-rec: 0.9902 there, 0.9847 held-out), and the mean per-sample cosine flatters small outputs
(table-cls's 2 logits: 0.992 per sample, 0.982 over all elements on the same pages). In the zoo rerun that
added it (avx2, BENCHMARKS *zoo*), ddddocr-ocr went 0.9937 -> 0.9977 held-out (two layers kept) and table-cls
0.9860 -> 0.9897; runs of the other changes made at the same time had each left both as they were. Why the
summed shortfall: on layout-cdla (8 outputs) three class-score maps tie as the worst, so the search on the
worst output alone stopped at 0.9853 with 5 layers (0.9835 held-out, box F1 92.6%); with it, 7 layers and
0.9899 (0.9877 held-out, box F1 94.3%), and keeping the last step to the aim, 9 layers: 0.9919, 0.9909 held-out
(BENCHMARKS *zoo*, avx2; build 130 -> 190 s), the single-output models unchanged.

Why more samples and a confirmation (PP-OCRv4-rec, 32 text lines, avx2, measured in TensorRT's form):
searched on its first 8 lines the plan went 0.9778 -> 0.9901 with two layers kept float, but those 8 lines
are easy ones: on the next 8 the same plans score 0.956 -> 0.982 and on 16 held-out lines 0.946 -> 0.974.
Searched on 16 lines and confirmed on the next 8, it kept p2o.Conv.15 alone (0.9743 on 16 held-out lines).

Why the confirmation weighs its noise: one layer kept float moves a sample's cosine either way by far more
than `MIN_GAIN` (PP-OCRv4-rec, p2o.Conv.15: -0.041 to +0.033 on the 8 confirmation lines, mean -0.0004,
against +0.0195 on the 16 search lines and +0.026 on 16 held-out ones). Demanding `MIN_GAIN` of those 8
lines' mean refused the layers that help held-out data most (as the CPU plan: p2o.Conv.4 alone, 0.9632
held-out); refusing only gains refuted beyond 2 standard errors keeps four (0.9838; before equalisation
crossed PP-LCNetV3's affine blocks).

Every trial re-quantises a copy of the graph as the build does (unlike-range Concats, bias correction), so
the measured cosine is that of the plan that would be built; it then runs only what that re-quantisation
changed, fed at the boundary with tensors of one run of the plan's own graph (`trtopt.search._trials`: the
same ONNX Runtime kernels on the same inputs, so the same cosine to the last bit): whole default builds
took 238 -> 163 CPU seconds on layout-cdla, 124 -> 91 on PP-OCRv4-det with the same layers and cosines
(avx2, 1 intra-op thread). The kept tensors fill at most `trials.BUDGET` (1 GiB; PP-OCRv4-det's 8 pages
at 640 x 640 take 0.96 GB). The trials are at most `CANDIDATES` + `LATER`, the greedy steps and 2 however
deep the model (trying every layer alone took over 15 minutes on a 200-layer PicoDet on 2 cores). What is
measured is the plan as its backend builds it: the CPU backend lowers TensorRT's form to uint8
activations (`trtopt.backend.cpu.lowering`: non-negative tensors get
twice the resolution), and measured in TensorRT's form PP-OCRv4-rec with p2o.Conv.15 float scored 0.9602 on
held-out lines where its built plan scored 0.9743. The lowering is a pure function of the graph's content,
so the trials' fingerprints match on the lowered form as on TensorRT's, and a trial's cosine is that of the
CPU plan as ONNX Runtime runs it (tests/test_quant_sensitivity_lowered.py).
The ranking is only a guide: on PP-OCRv4-det the layers that matter rank 19th and 35th (its text-map IoU with
16 candidates 0.887, with 48 0.968, with all 64 0.970, against 0.909 for ONNX Runtime's quantiser;
tools/bench_autocalib.py), hence 48. The rule depends on measured cosines only (no time budget), so a build is
the same on any machine. `trtopt build --no-auto-exclude` skips it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.data.dataset import sample_batches
from trtopt.quant.config import QuantConfig
from trtopt.search import _widen as widen
from trtopt.search._ceiling import Ceiling, ceiling
from trtopt.search._greedy import MIN_GAIN as MIN_GAIN
from trtopt.search._greedy import NOISE as NOISE
from trtopt.search._greedy import REASON as REASON
from trtopt.search._greedy import Greedy, greedy
from trtopt.search._objective import Cosines, Figures, worst, worst_mean
from trtopt.search._ranking import rank_by_added_error
from trtopt.search._trial_count import TrialCount, memo
from trtopt.search._trials import output_figures

log = logging.getLogger(__name__)

MIN_COSINE = 0.99
MAX_SHARE = 0.25  # never more than this share of the INT8 layers kept float
SAMPLES = 16  # the most calibration samples the search measures on
CONFIRM = 8  # samples after them that confirm its layers, when at least SEARCH_LEAST remain for the search
SEARCH_LEAST = 8
CANDIDATES = 48  # layers tried alone: those adding the most error to their own output (16 missed PP-OCRv4-det's)
ROUNDS = 2  # alone + greedy rounds, the second on top of the layers the first kept float
LATER = CANDIDATES // 2  # the candidates a later round tries again, the first of the ranked ones
SENSITIVITY_PHASE = "sensitivity"  # the phase its progress reports carry (one per trial)

Batches = Sequence[tuple[Mapping[str, np.ndarray], int]]
Lower = Callable[[onnx.ModelProto], onnx.ModelProto]  # a Q/DQ model -> the form the backend builds (`measured_form`)


def _as_is(model: onnx.ModelProto) -> onnx.ModelProto:
    return model


@dataclass(frozen=True)
class Sensitivity:
    """What the analysis found: the worst output cosine before and after, and the layers kept float (why)."""

    before: float
    after: float
    layers: dict[str, str] = field(default_factory=dict)
    trials: int = 0
    confirmed: tuple[float, float] | None = None  # worst cosine before/after on the confirmation samples
    refused: dict[str, str] = field(default_factory=dict)  # layers (or moves) that gained on the search samples alone
    ceiling: Ceiling | None = None  # the candidates kept float at once (`trtopt.search._ceiling`), where tried
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)  # tensor -> widened (`trtopt.search._widen`)

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = dict(before=self.before, after=self.after, layers=dict(self.layers), trials=self.trials)
        if self.confirmed is not None:
            found["confirmed"] = {"before": self.confirmed[0], "after": self.confirmed[1]}
        if self.refused:
            found["refused"] = dict(self.refused)
        if self.ceiling is not None:
            found["ceiling"] = self.ceiling.to_dict()
        if self.thresholds:
            found["thresholds"] = {tensor: dict(move) for tensor, move in self.thresholds.items()}
        return found

    def amax(self, calibrated: Mapping[str, float]) -> dict[str, float]:
        """The plan's thresholds: `calibrated` with those the search widened."""
        return {**calibrated, **{tensor: move["to"] for tensor, move in self.thresholds.items()}}


def quantized_model(
    graph: gs.Graph, quant: QuantConfig, calibration: Any, bias_correction: bool, exclude: Sequence[str] = (),
    lower: Lower = _as_is,
) -> onnx.ModelProto:  # fmt: skip
    """The Q/DQ model `trtopt.build` would make of `graph` with `exclude` kept float (the graph is untouched),
    in the form `lower` gives it (the backend's `measured_form`)."""
    from trtopt.frontend import copy_graph, onnx_from_graph
    from trtopt.quant.bias import correct_biases
    from trtopt.quant.concat_ranges import float_unlike_concats
    from trtopt.quant.placement import plan_quantization
    from trtopt.quant.qdq import insert_qdq

    copy = copy_graph(graph)
    plan = plan_quantization(copy, replace(quant, exclude=(*quant.exclude, *exclude)))
    plan = float_unlike_concats(copy, plan, calibration.ranges)
    if bias_correction and calibration.channel_means:
        correct_biases(copy, plan, calibration.channel_means, quant.seven_bit_layers)
    insert_qdq(copy, plan, calibration.amax, quant.seven_bit_layers, quant.min_amax)
    return lower(onnx_from_graph(copy))


def find_sensitive_layers(
    measure: Callable[[Sequence[str]], Figures],
    layers: Sequence[str],
    *,
    min_cosine: float = MIN_COSINE,
    rank: Callable[[], Sequence[str]] | None = None,
    on_trial: Callable[[int, int], None] | None = None,
    confirm: Callable[[Sequence[str]], Cosines] | None = None,
    wider: Callable[[Sequence[str], Collection[str]], Sequence[str]] | None = None,
) -> Sensitivity:
    """The search of the module doc over `layers`; `measure(exclude)` is each output's cosine (one float for
    one output) with `exclude` kept float, weighed as `trtopt.search._objective` says. `rank()`, called only
    when the plan falls short, orders `layers` most error first; the first `CANDIDATES` of that order are
    tried (all of `layers` without it). `confirm(exclude)`, where given, is the per-sample cosines (a row
    per output) on samples `measure` does not use: the greedy stage keeps a layer only if they do not
    refute its gain, and stops only when both sample sets reach `min_cosine`. `wider(tried, kept)`, where
    given, is the threshold moves (`trtopt.search._widen` keys) the last stage tries when the plan is still short.
    `on_trial(done, most)` is called after each trial once the search runs (`most`: its upper bound)."""
    before = measure(())
    start = confirm(()) if confirm is not None and layers and worst(before) >= min_cosine else None
    if not layers or (worst(before) >= min_cosine and (start is None or worst_mean(start) >= min_cosine)):
        return Sensitivity(worst(before), worst(before))  # the aim reached on both sample sets: nothing to keep
    tried = list(rank())[:CANDIDATES] if rank is not None and len(layers) > CANDIDATES else list(layers)
    steps = max(1, int(MAX_SHARE * len(layers)))
    stage = steps if confirm is None else 2 * steps + 1  # a round's first greedy trial is an alone one
    most = len(tried) * (1 + 2 * (wider is not None)) + (ROUNDS - 1) * LATER + stage  # widen: 2 moves per input
    count = TrialCount(on_trial, 1, most + 2 * (len(tried) < len(layers)))  # + `trtopt.search._ceiling`'s trials
    measure = memo(count.wrap(measure))  # a later round may try again what the greedy stage tried
    top = ceiling(measure, tried, len(layers), LATER)
    if top is not None and top.hopeless:  # no set of candidates kept float lifts the plan near the aim
        count.finish()
        log.warning("sensitivity search stopped: %s", top.describe(worst(before), min_cosine))
        return Sensitivity(worst(before), worst(before), trials=count.done, ceiling=top)
    check = memo(count.wrap(confirm)) if confirm is not None else None
    alone: dict[str, Figures] = {}
    for layer in tried:
        alone[layer] = measure((layer,))
        if worst(alone[layer]) >= min_cosine and (check is None or worst_mean(check((layer,))) >= min_cosine):
            break  # one layer reaches the aim (on both sample sets): no plan keeps fewer float
    found, gains = Greedy({}, before, min_cosine, start, start, {}), alone
    for round_ in range(ROUNDS):
        if round_:  # each layer again, on top of those kept float: its gain there, not alone
            gains = {layer: measure((*found.chosen, layer)) for layer in tried[:LATER]
                     if layer not in found.chosen and layer not in found.refused}  # fmt: skip
        order = sorted((layer for layer in gains if found.pays(gains[layer])),
                       key=lambda k: (-found.gain(gains[k]), -worst(gains[k])))  # fmt: skip
        kept = len(found.chosen)
        greedy(found, order[: steps - kept], gains, measure, check)
        if found.reached() or len(found.chosen) in (kept, steps):
            break  # the aim, the cap, or a round that kept nothing (the next would try the same plans)
    if wider is not None and not found.reached():  # trtopt.search._widen: no float layer is left that pays
        gains = {move: measure((*found.chosen, move)) for move in wider(tried, found.chosen)}
        order = sorted((m for m in gains if found.pays(gains[m])), key=lambda m: -found.gain(gains[m]))
        greedy(found, widen.best_per_tensor(order), gains, measure, check)
    count.finish()
    confirmed = None if found.start is None or found.checked is None else (
        worst_mean(found.start), worst_mean(found.checked))  # fmt: skip
    return Sensitivity(worst(before), worst(found.current), widen.layers(found.chosen), count.done, confirmed,
                       {widen.shown(key): why for key, why in found.refused.items()}, top,
                       widen.thresholds(found.chosen))  # fmt: skip


def exclude_sensitive(
    graph: gs.Graph, quant: QuantConfig, calibration: Any, bias_correction: bool, batches: Batches,
    layers: Sequence[str], on_trial: Callable[[int, int], None] | None = None, confirm: Batches = (),
    lower: Lower = _as_is,
) -> Sensitivity:  # fmt: skip
    """Run the analysis for the build: `layers` are the INT8 layers of its plan, `batches` the calibration
    samples it searches on, `confirm` others that only confirm the layers it keeps, `lower` the form the
    backend builds each plan in (what is measured); `on_trial` as for `find_sensitive_layers`."""
    from trtopt.search._trials import BUDGET

    base = quantized_model(graph, quant, calibration, bias_correction, lower=lower)
    tried: list[Sequence[str]] = [layers]  # the layers tried alone, once ranked: what the trials' cache keeps

    def rank() -> list[str]:
        order = rank_by_added_error(graph, base, batches, layers)
        tried[0] = order[:CANDIDATES]
        return order

    def build(exclude: Sequence[str]) -> onnx.ModelProto:
        floats, moves = widen.split(exclude)  # layers kept float, wider thresholds
        return quantized_model(graph, quant, widen.widened(calibration, moves), bias_correction, floats, lower) \
            if exclude else base  # fmt: skip

    # the plan's graph runs once per sample set; the confirmation, a few greedy trials, gets a quarter of the memory
    measure = _measurer(graph, base, batches, build, lambda: tried[0], BUDGET)
    check = _measurer(graph, base, confirm, build, lambda: tried[0], BUDGET // 4, True) if confirm else None
    wider = partial(widen.moves_for, graph, calibration)
    found = find_sensitive_layers(measure, layers, rank=rank, on_trial=on_trial, confirm=check, wider=wider)
    if found.layers or found.thresholds:
        log.info("sensitivity analysis keeps %d layers float and widens %d thresholds: worst output cosine "
                 "%.4f -> %.4f (%s)", len(found.layers), len(found.thresholds), found.before, found.after,
                 ", ".join([*found.layers, *found.thresholds]))  # fmt: skip
    moved = {tensor: {"from": float(calibration.amax[tensor]), **move} for tensor, move in found.thresholds.items()}
    return replace(found, thresholds=moved)


def _measurer(
    graph: gs.Graph, base: onnx.ModelProto, batches: Batches, build: Callable[[Sequence[str]], onnx.ModelProto],
    tried: Callable[[], Sequence[str]], budget: int, per_sample: bool = False,
) -> Callable[[Sequence[str]], Cosines]:  # fmt: skip
    """`measure(exclude)` on `batches`: the plan's own graph run whole, a trial by `trtopt.search._trials` (set
    up at the first trial, keeping what the trials of the layers `tried()` then names will read); each
    output's figure (`trials.cosine_figures`), or with `per_sample` its cosine on each sample, a row each,
    in both the aim and steady forms where they differ (`trtopt.search._objective`)."""
    from trtopt.execution import OrtSession
    from trtopt.frontend import onnx_from_graph
    from trtopt.search._trials import DownstreamTrials, sample_cosines
    from trtopt.verify import collect

    expected = collect(OrtSession(onnx_from_graph(graph), spin=False).run, batches)
    trials: list[DownstreamTrials] = []

    def measure(exclude: Sequence[str]) -> Cosines:
        if not exclude and not trials:  # before the first trial (the layers it will try may not be ranked yet)
            reference = OrtSession(base, opt_level="disable", spin=False)  # Q/DQ computed as float math
            outputs = [reference.run(feeds) for feeds, _rows in batches]
        else:
            if not trials:
                trials.append(DownstreamTrials(base, batches, tried(), budget))
            outputs = trials[0].run(build(exclude)) if exclude else trials[0].base_outputs()
        if per_sample:
            return sample_cosines(outputs, batches, expected, split=True)
        return output_figures(outputs, batches, expected, split=True)

    return measure


def float_sensitive_layers(
    graph: gs.Graph, quant: QuantConfig, plan: Any, calibration: Any, data: Any, batch: int,
    progress: Callable[[Any], None] | None = None, lower: Lower = _as_is,
) -> tuple[Any, Sensitivity | None]:  # fmt: skip
    """For `trtopt.build`: `plan` with the sensitive layers kept float, searched and confirmed on the first
    calibration samples of `data` (`search_samples`; a `trtopt.data.Dataset`, without the build's verification
    samples), each trial measured in the form `lower` gives it (the backend's `measured_form`), outputs after
    TopK / NMS by what they select from (`trtopt.verify.selection`). `progress` gets a `CalibProgress` per trial."""
    from trtopt.calib.collect import count_reporter
    from trtopt.errors import TrtoptError
    from trtopt.frontend.model_errors import plan_errors
    from trtopt.quant.placement import plan_quantization
    from trtopt.verify.selection import judged_graph

    if not plan.quantized_layers:
        return plan, None

    batches, confirm = search_samples(data, batch)
    failures: tuple[type[BaseException], ...] = (TrtoptError, *plan_errors())
    try:
        searched, layers = judged_graph(graph, plan.quantized_layers)
        found = exclude_sensitive(searched, quant, calibration, quant.bias_correction, batches, layers,
                                  count_reporter(progress, SENSITIVITY_PHASE), confirm, lower)  # fmt: skip
    except failures as exc:  # ONNX Runtime cannot run the Q/DQ graph as float math: nothing to measure
        log.warning("no sensitivity analysis: %s", str(exc).strip().splitlines()[0])
        return plan, None
    if found.trials and len(data) < SAMPLES + CONFIRM:  # fewer than it is made for (table-cls: docs/zoo.md)
        log.warning("the sensitivity search had %d calibration samples: it searched on %d and confirmed on %d; with "
                    "%d or more it searches on %d and picks its layers more surely", len(data),
                    sum(n for _, n in batches), sum(n for _, n in confirm), SAMPLES + CONFIRM, SAMPLES)  # fmt: skip
    if not found.layers:
        return plan, found
    plan = plan_quantization(graph, replace(quant, exclude=(*quant.exclude, *found.layers)))
    return replace(plan, float_layers={**plan.float_layers, **found.layers}), found


def search_samples(dataset: Any, batch: int) -> tuple[Batches, Batches]:
    """(search, confirmation) batches of a `trtopt.data.Dataset`: the first `SAMPLES` at most, then `CONFIRM`
    more if that leaves `SEARCH_LEAST` to the search (none are held back from a smaller set)."""
    total = len(dataset)
    if total < SEARCH_LEAST + CONFIRM:
        return sample_batches(dataset, batch, SAMPLES), []
    search = min(SAMPLES, total - CONFIRM)
    head, rest = dataset.split_tail(total - search)
    return sample_batches(head, batch, search), sample_batches(rest, batch, CONFIRM)
