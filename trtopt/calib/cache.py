"""Calibration caches: trtopt's JSON, TensorRT's text cache, ONNX Runtime's calibration.json / .cache.

`load_cache(path)` recognises the format from the content; `save_cache(path, calibration, format=)`
writes one atomically; `check_cache_matches` says whether a cache fits a model. The formats ("trtopt",
"tensorrt", "onnxruntime-json", "onnxruntime-text") live in `cache_formats.py`, registered in
`CACHE_FORMATS` in detection order.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trtopt.calib.cache_formats import (
    CACHE_FORMATS,
    CacheFormat,
    check_values,
    sample_names,
    trt_scale_from_hex,
    trt_scale_to_hex,
)
from trtopt.calib.calibration import Calibration
from trtopt.calib.thresholds import FP32_AMAX
from trtopt.errors import CalibrationError
from trtopt.frontend.writer import write_atomic

__all__ = [
    "CACHE_FORMATS",
    "CacheFormat",
    "check_cache_matches",
    "load_cache",
    "save_cache",
    "trt_scale_from_hex",
    "trt_scale_to_hex",
]

log = logging.getLogger(__name__)


def load_cache(path: str | os.PathLike[str]) -> Calibration:
    """Read a calibration cache in any registered format (recognised from its content)."""
    target = _resolve(Path(path))
    try:
        text = target.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise CalibrationError(
            f"{str(target)!r} is a binary file, not a calibration cache trtopt reads (ONNX Runtime's "
            "calibration.flatbuffers, or an engine?).",
            fix="Pass the calibration.json or calibration.cache beside it, or a TensorRT/trtopt cache.",
        ) from None
    for name in CACHE_FORMATS:
        fmt = CACHE_FORMATS.get(name)
        if fmt.detect(text):
            calibration = fmt.read(text, str(target))
            log.info("read %d thresholds from %s (%s)", len(calibration.amax), target, name)
            return calibration
    first = text.strip().splitlines()[0][:80] if text.strip() else "(empty file)"
    raise CalibrationError(
        f"{str(target)!r} is not a calibration cache trtopt recognises; its first line is {first!r}.",
        fix="Expected a trtopt JSON cache, a TensorRT cache (first line TRT-<version>-EntropyCalibration2) "
        "or ONNX Runtime's calibration.json / calibration.cache.",
    )


def save_cache(
    path: str | os.PathLike[str],
    calibration: Calibration,
    format: str = "trtopt",
    *,
    trt_version: str | None = None,
    trt_algorithm: str = "EntropyCalibration2",
) -> Path:
    """Write `calibration` atomically as `format` (a name in `CACHE_FORMATS`); returns the path.

    For "tensorrt", `trt_version` is the number in the header (e.g. "8601" for 8.6.1, "100300" for
    10.3.0; `None`: the installed TensorRT's, else 10.3.0's) and `trt_algorithm` the calibrator it names
    (EntropyCalibration2 by default, what trtexec --calib expects, whatever `calibration.method` was).
    """
    fmt = CACHE_FORMATS.get(format)
    record = calibration.equalization
    if format != "trtopt" and record is not None and record.applied and record.gains:
        raise CalibrationError(
            f"The thresholds belong to the graph as trtopt's activation equalisation rewrote it ({len(record.gains)} "
            f"tensors rescaled and renamed), which {format} tools do not run; a {format} cache cannot hold the "
            "rewrite.",
            fix="Calibrate with --no-equalize for a cache other tools read (`trtopt calibrate --format ...` does so), "
            "or write trtopt's own format.",
        )
    check_values(calibration.amax, calibration.amax, where="the calibration to save")
    text = fmt.write(calibration, {"trt_version": trt_version, "trt_algorithm": trt_algorithm})
    return write_atomic(path, text.encode("utf-8"))


# Thresholds a cache may hold. Calibration from data gives 127 * 2**-14 (~0.008) for all-zero tensors and
# rarely anything above 1e4, and a tensor whose values are tiny its own range, down to the FP32 backends' floor
# (`trtopt.calib.thresholds.FP32_AMAX`, ~1e-28); 1e30 or 1e-30 (a hand-edited or corrupted cache) would quantise
# every value to zero or saturate it, a useless plan.
MIN_AMAX = FP32_AMAX
MAX_AMAX = 1e9


def channel_counts(graph: Any) -> dict[str, int]:
    """Tensor name -> size of axis 1 (the axis channel means are taken over), where the graph knows it."""
    counts = {}
    for name, tensor in graph.tensors().items():
        shape = getattr(tensor, "shape", None)
        if shape is not None and len(shape) > 1 and isinstance(shape[1], int) and shape[1] > 0:
            counts[name] = int(shape[1])
    return counts


def _mismatched_means(cache: Calibration, names: set[str], channels: Mapping[str, int]) -> list[str]:
    means = cache.channel_means or {}
    return [
        f"{name!r} has {np.asarray(means[name]).size}, the tensor {channels[name]} channels"
        for name in sorted(names & set(means) & set(channels))
        if np.asarray(means[name]).size != channels[name]
    ]


def check_cache_matches(
    cache: Calibration,
    tensors: Iterable[str],
    *,
    fingerprint: str | None = None,
    channels: Mapping[str, int] | None = None,
) -> None:
    """Raise `CalibrationError` unless `cache` has a usable threshold for every one of `tensors` and, when
    both are known, was made for the model with `fingerprint`. Thresholds must lie in MIN_AMAX..MAX_AMAX, and
    where `channels` (tensor -> size of axis 1) is given, each tensor's channel means must have that length."""
    wanted = list(dict.fromkeys(tensors))
    problems = []
    if fingerprint is not None and cache.fingerprint is not None and fingerprint != cache.fingerprint:
        problems.append(
            f"it was made for another model (fingerprint {cache.fingerprint[:12]}…, "
            f"this model's is {fingerprint[:12]}…)"
        )
    missing = [t for t in wanted if t not in cache.amax]
    if missing:
        problems.append(f"{len(missing)} of {len(wanted)} tensors have no threshold: {sample_names(missing)}")
    bad = [t for t in wanted if t in cache.amax and not (math.isfinite(cache.amax[t]) and cache.amax[t] > 0)]
    if bad:
        problems.append(f"{len(bad)} thresholds are zero, negative or not finite: {sample_names(bad)}")
    absurd = [t for t in wanted if t in cache.amax and t not in bad and not MIN_AMAX <= cache.amax[t] <= MAX_AMAX]
    if absurd:
        problems.append(
            f"{len(absurd)} thresholds are outside {MIN_AMAX:g}..{MAX_AMAX:g}, which would quantise every value "
            f"to 0 or saturate it: {sample_names(absurd)}"
        )
    short = _mismatched_means(cache, set(wanted) - set(missing), channels or {})
    if short:
        problems.append(f"channel_means of {len(short)} tensors have the wrong length: {'; '.join(short[:4])}")
    if problems:
        raise CalibrationError(
            f"The calibration cache {cache.source or ''} does not fit this model: {'; '.join(problems)}.",
            fix="Recalibrate this model on its own data, or pass the cache made for this exact model and the "
            "same graph optimisations (tensor names change when passes fuse layers).",
        )
    extra = len(set(cache.amax) - set(wanted))
    if extra:
        log.debug("calibration cache has %d thresholds for tensors not quantised here", extra)


def _resolve(path: Path) -> Path:
    if path.is_dir():
        for name in ("calibration.json", "calibration.cache"):
            if (path / name).is_file():
                return path / name
        raise CalibrationError(
            f"{str(path)!r} is a folder without calibration.json or calibration.cache in it.",
            fix="Pass the cache file itself.",
        )
    if not path.is_file():
        raise CalibrationError(f"Calibration cache {str(path)!r} does not exist.", fix="Check the path.")
    return path
