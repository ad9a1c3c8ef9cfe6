"""`--method auto`'s whole-model check: each tensor's own best threshold, or max everywhere, whichever moves the
model's outputs least.

`trtopt.calib.auto` scores each tensor's candidates with every other tensor float: the errors of different layers
mostly add up, and scoring them jointly would cost a model run per combination. Mostly: on a detector whose
outputs are sparse score logits (MediaPipe's BlazeFace in the real-export corpus, issue #45), auto's per-tensor
choices, each the least error where it is read, gave an all-INT8 reference of cosine 0.847 to FP32, entropy
0.834, and max everywhere 0.964 (AVX-512 VNNI EPYC): clipping every tensor a little removes the few large
values its score outputs are made of, layer after layer. So once auto has chosen, the model runs twice more on
the scoring samples, every calibrated tensor rounded to its chosen grid, then to its max grid (the symmetric grid
of the plan's Q/DQ graph, as the scoring rounds: `trtopt.calib.auto.fake_quantize`), and where max moves the
outputs clearly less (`CLEAR_WIN`), every tensor takes its max threshold, recorded as `WHOLE_MODEL`. Only where
auto's choices move the outputs materially (`MATERIAL`): below that the check is a guard with nothing to guard,
and eight samples cannot tell two small errors apart (a 7-class emotion classifier of the corpus scored 0.0055
against max's 0.0031 there, and max was the less faithful on 32 held-out photos: cosine 0.9981 against 0.9991).
Cost: one or two forward passes over `SCORE_SAMPLES` samples, plus the FP32 outputs' pass (the demo: 0.4 s of a
3.7 s calibration, AVX-512 VNNI EPYC).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtopt.calib.thresholds import QMAX

log = logging.getLogger(__name__)

Batches = Sequence[tuple[Mapping[str, np.ndarray], int]]
WHOLE_MODEL = "max (whole-model check)"  # the method `choices` records for a threshold this check set
CLEAR_WIN = 0.8  # max is kept where its error is at most this fraction of the per-tensor choices'
MATERIAL = 0.01  # ... and theirs at least this (relative squared error: about 1 - cosine 0.005)


def fake_quantized(model: onnx.ModelProto, amax: Mapping[str, float]) -> onnx.ModelProto:
    """A copy of `model` in which every reader of each float32 tensor of `amax` reads it rounded to the symmetric
    INT8 grid of its threshold (QuantizeLinear -> DequantizeLinear, scale T / 127, after the tensor's producer);
    graph outputs keep their float values. Tensors of other types, or of unknown type, are left as they are."""
    from trtopt.frontend import weightless

    inferred = weightless.infer_shapes(model)
    infos = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    float32 = {i.name for i in infos if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    rounded = {name: t for name, t in amax.items() if name in float32 and t > 0}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    pairs: dict[str, list[onnx.NodeProto]] = {}
    for name, threshold in rounded.items():
        graph.initializer.extend([numpy_helper.from_array(np.float32(threshold / QMAX), f"{name}/whole/scale"),
                                  numpy_helper.from_array(np.int8(0), f"{name}/whole/zero")])  # fmt: skip
        pairs[name] = [helper.make_node("QuantizeLinear", [name, f"{name}/whole/scale", f"{name}/whole/zero"],
                                        [f"{name}/whole/q"]),
                       helper.make_node("DequantizeLinear", [f"{name}/whole/q", f"{name}/whole/scale",
                                                             f"{name}/whole/zero"], [f"{name}/whole"])]  # fmt: skip
    nodes = [node for i in graph.input for node in pairs.get(i.name, [])]
    for node in graph.node:
        node.input[:] = [f"{n}/whole" if n in pairs else n for n in node.input]
        nodes.append(node)
        nodes += [pair for out in node.output for pair in pairs.get(out, [])]
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


def output_error(model: onnx.ModelProto, reference: Sequence[Sequence[np.ndarray]], batches: Batches,
                 threads: int | None) -> float:  # fmt: skip
    """The mean over `model`'s outputs of ||y - r||^2 / ||r||^2 on `batches`' real rows, against `reference` (each
    batch's outputs, in the model's output order), the model run as float math (no fused INT8 kernels)."""
    from trtopt.execution import OrtSession

    session = OrtSession(model, threads=threads, opt_level="disable", spin=False)
    squares = np.zeros(len(reference[0]))
    totals = np.zeros(len(reference[0]))
    for (feeds, rows), expected in zip(batches, reference, strict=True):
        got = session.run(dict(feeds))
        for i, (name, want) in enumerate(zip(session.output_names, expected, strict=True)):
            have, want = np.asarray(got[name], np.float64)[:rows], np.asarray(want, np.float64)[:rows]
            if have.shape != want.shape:  # a data-dependent length (boxes kept by a threshold): the common part
                if have.ndim != want.ndim:
                    continue
                common = tuple(slice(0, min(a, b)) for a, b in zip(have.shape, want.shape, strict=True))
                have, want = have[common], want[common]
            squares[i] += float(np.sum((have - want) ** 2))
            totals[i] += float(np.sum(want**2))
    return float(np.mean(squares / np.maximum(totals, 1e-30)))


def whole_model_choice(
    model: onnx.ModelProto, chosen: Mapping[str, float], maxima: Mapping[str, float], batches: Batches,
    threads: int | None = None,
) -> tuple[bool, float, float]:  # fmt: skip
    """(whether max everywhere wins, the per-tensor choices' error, max's: NaN where not measured): `output_error`
    of each set of thresholds, rounded everywhere at once, against the FP32 outputs on `batches`."""
    from trtopt.execution import OrtSession

    fp32 = OrtSession(model, threads=threads, opt_level="disable", spin=False)
    reference = [[np.asarray(out)[:rows] for out in fp32.run(dict(feeds)).values()] for feeds, rows in batches]
    own = output_error(fake_quantized(model, chosen), reference, batches, threads)
    if own < MATERIAL:
        log.info("auto's whole-model check: relative squared error %.4g with each tensor's choice", own)
        return False, own, float("nan")
    at_max = output_error(fake_quantized(model, maxima), reference, batches, threads)
    log.info("auto's whole-model check: relative squared error %.4g with each tensor's choice, %.4g with max",
             own, at_max)  # fmt: skip
    return at_max <= CLEAR_WIN * own, own, at_max


def max_wins(model: onnx.ModelProto, chosen: Mapping[str, float], maxima: Mapping[str, float], batches: Batches,
             threads: int | None) -> bool:  # fmt: skip
    """`whole_model_choice`'s verdict; False, with a warning, where the check cannot run (auto's choices stand)."""
    try:
        return whole_model_choice(model, chosen, maxima, batches, threads)[0]
    except Exception as exc:  # noqa: BLE001 - a check on top of auto's choices: where it fails, they stand
        text = str(exc).strip()
        log.warning("auto's whole-model check did not run (%s); each tensor keeps its own choice",
                    text.splitlines()[0] if text else type(exc).__name__)  # fmt: skip
        return False
