"""What activation equalisation did before a calibration, as a trtopt calibration cache records it.

Equalisation (`trtopt.quant.equalize`) rewrites the graph before calibration: it rescales the channels of the
tensors that feed depthwise convs and renames them (`<name>.equalized`). The thresholds measured afterwards
belong to the rewritten graph, so a cache that holds them must also say how to redo the rewrite: the gain of
every channel of every rescaled site. A build from the cache applies those gains (never measures new ones)
before it reads a threshold, and gets the graph and thresholds a build from data got
(`trtopt.quant.equalize_cache`).

In trtopt's JSON cache (`trtopt.calib.cache_formats`) this is the optional "equalization" object:

    {"applied": true, "graph_fingerprint": "<sha256 of the graph before the rewrite>",
     "output_folds": ["Relu", ...] or null, "gains": {"<tensor before the rewrite>": [g_0, g_1, ...], ...}}

"applied": false says the calibration ran on the graph as given (`--no-equalize`); a cache without the object
was written before trtopt recorded it, or by another tool, and builds without equalisation. "output_folds"
is what bounded the gains (`QuantConfig.output_folds` of the backend the calibration was for; null: conv
outputs not quantised), only informative. The other formats (TensorRT's, ONNX Runtime's) are read by tools
that run the model as given, so trtopt writes them without equalisation and they carry no record: their text
is left exactly as those tools read it, no trtopt field and no sidecar. A TensorRT cache holds one scale per
tensor name of the network it calibrated, to be redone when the network's structure changes (TensorRT's
IInt8Calibrator.read_calibration_cache, https://docs.nvidia.com/deeplearning/tensorrt/api/python_api/infer/Int8/Calibrator.html),
and TensorRT deprecated implicit calibration in 10.1 for explicit Q/DQ (IInt8MinMaxCalibrator's page there),
which TensorRT 11 builds from; the rescaled, renamed tensors exist in trtopt's rewritten graph only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtopt.errors import CalibrationError


@dataclass(frozen=True, eq=False)
class EqualizationRecord:
    """`applied`: the thresholds are those of the rewritten graph; `gains`: per site tensor (its name before
    the rewrite), the per-channel gain g_c >= 1, in the order the sites were rescaled (empty: nothing needed
    it); `graph_fingerprint`: `model_fingerprint` of the graph before the rewrite; `output_folds`: see the
    module docstring."""

    applied: bool
    gains: Mapping[str, np.ndarray] = field(default_factory=dict)
    graph_fingerprint: str | None = None
    output_folds: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "graph_fingerprint": self.graph_fingerprint,
            "output_folds": list(self.output_folds) if self.output_folds is not None else None,
            "gains": {name: [float(g) for g in gain] for name, gain in self.gains.items()},
        }

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> EqualizationRecord:
        """Read and check the cache's "equalization" object; a malformed one is a clear error."""
        fix = "Recalibrate with `trtopt calibrate` to rewrite the cache."
        if not isinstance(raw, dict) or not isinstance(raw.get("applied"), bool):
            raise CalibrationError(f"{where!r}: \"equalization\" must be an object with a true/false \"applied\".",
                                   fix=fix)  # fmt: skip
        gains_raw, folds = raw.get("gains") or {}, raw.get("output_folds")
        fingerprint = raw.get("graph_fingerprint")
        if not isinstance(gains_raw, dict) or (fingerprint is not None and not isinstance(fingerprint, str)):
            raise CalibrationError(f"{where!r}: \"equalization\" has a malformed \"gains\" or \"graph_fingerprint\".",
                                   fix=fix)  # fmt: skip
        if folds is not None and not (isinstance(folds, list) and all(isinstance(f, str) for f in folds)):
            raise CalibrationError(f"{where!r}: \"equalization.output_folds\" must be a list of op types or null.",
                                   fix=fix)  # fmt: skip
        gains = {}
        for name, values in gains_raw.items():
            ok = isinstance(values, list) and values and all(_is_gain(v) for v in values)
            if not ok:
                raise CalibrationError(
                    f"{where!r}: the equalisation gains of {name!r} must be a non-empty list of finite numbers >= 1.",
                    fix=fix,
                )
            gains[str(name)] = np.array(values, dtype=np.float64)
        return cls(raw["applied"], gains, fingerprint, tuple(folds) if folds is not None else None)


def _is_gain(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 1.0
