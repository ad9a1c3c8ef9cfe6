"""Thin layers in INT8 where that costs no fidelity (CPU plans; issue #45).

The CPU backend keeps layers with fewer than 16 channels float, and a depthwise conv whose input a float layer
writes (`QuantConfig.min_channels`, `float_leading_depthwise`): on the demo (EfficientNet-Lite0, pretrained),
quantising its 3-channel stem and the depthwise conv after it cost 3 points of top-1 agreement with FP32 on 160
held-out photos (96.9% -> 93.8%, cosine 0.9986 -> 0.9971). Where they cost nothing, they cost time: a float stem
and depthwise conv at the input's full resolution, each followed by a QuantizeLinear and a layout change to the
integer kernels' NHWC. On the real-export corpus's MobileNetV2s at batch 8 (avx2 EPYC, 1 thread, interleaved,
quiet machine) trtopt's plan ran 1.46-1.66x FP32's speed against ONNX Runtime's quantizer's 1.47-1.82x, whose plan
quantises both; with them quantised, trtopt's plan has ONNX Runtime's op counts.

So a build whose user left both settings to the backend (`QuantConfig.widen_thin`) measures the plan with every
layer of any width eligible (`min_channels` 1, `float_leading_depthwise` off) against the default one, each in the
backend's measured form on the sensitivity search's calibration samples, outputs judged as the search judges them
(`trtopt.verify.selection.judged_graph`), and takes it where its worst output's relative error to FP32 is within
`SLACK` of the default plan's (plus `FLOOR`): the same fidelity, by the figure the build's verification records.
The sensitivity search then runs on the plan taken, as on any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtopt.quant import QuantConfig

log = logging.getLogger(__name__)

SLACK = 1.05  # the wider plan's error may be this multiple of the default plan's ...
FLOOR = 2e-4  # ... plus this (two plans that both reproduce FP32 within rounding)


def thin_layers_where_free(
    graph: gs.Graph, quant: QuantConfig, calibration: Any, data: Any, batch: int,
    lower: Callable[[onnx.ModelProto], onnx.ModelProto],
) -> tuple[QuantConfig, str | None]:  # fmt: skip
    """`quant` with every width eligible for INT8 where that measured as faithful as `quant` (see the module), and
    what was measured (None: nothing to decide: not asked for, no data, or no layer more in INT8)."""
    from trtopt.quant.placement import plan_quantization

    if not quant.widen_thin or data is None:
        return quant, None
    wide = replace(quant, min_channels=1, float_leading_depthwise=False, widen_thin=False)
    default_layers = plan_quantization(graph, quant).quantized_layers
    more = set(plan_quantization(graph, wide).quantized_layers) - set(default_layers)
    if not more:
        return quant, None
    errors = _errors(graph, (quant, wide), calibration, data, batch, lower, default_layers)
    if errors is None:
        return quant, None
    base, wider = errors
    taken = wider <= base * SLACK + FLOOR
    note = (f"{len(more)} thin layer(s) {'in INT8' if taken else 'kept float'}: relative error to FP32 on the search "
            f"samples {wider:.4f} with them in INT8, {base:.4f} without")  # fmt: skip
    log.info(note)
    return (wide if taken else quant), note


def _errors(
    graph: gs.Graph, configs: tuple[QuantConfig, ...], calibration: Any, data: Any, batch: int,
    lower: Callable[[onnx.ModelProto], onnx.ModelProto], layers: Any,
) -> tuple[float, ...] | None:  # fmt: skip
    """Each config's worst output relative error to FP32 on the search samples; None where ONNX Runtime cannot
    run a plan as float math (nothing to measure: the default placement stays)."""
    from trtopt.errors import TrtoptError
    from trtopt.execution import OrtSession
    from trtopt.frontend import onnx_from_graph
    from trtopt.frontend.model_errors import plan_errors
    from trtopt.search.sensitivity import quantized_model, search_samples
    from trtopt.verify import collect
    from trtopt.verify.selection import judged_graph

    batches, _ = search_samples(data, batch)
    judged, _ = judged_graph(graph, list(layers))
    failures: tuple[type[BaseException], ...] = (TrtoptError, *plan_errors())
    try:
        expected = collect(OrtSession(onnx_from_graph(judged), spin=False).run, batches)
        found = []
        for config in configs:
            model = quantized_model(judged, config, calibration, config.bias_correction, lower=lower)
            outputs = collect(OrtSession(model, opt_level="disable", spin=False).run, batches)
            floats = [n for n, v in expected.items() if np.issubdtype(np.asarray(v).dtype, np.floating)] or expected
            found.append(max(_relative(outputs[name], expected[name]) for name in floats))
    except failures as exc:
        log.warning("thin layers kept float, unmeasured: %s", str(exc).strip().splitlines()[0])
        return None
    return tuple(found)


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    want64 = np.asarray(want, dtype=np.float64)
    norm = float(np.linalg.norm(want64))
    return float(np.linalg.norm(np.asarray(got, dtype=np.float64) - want64)) / norm if norm > 0 else 0.0
