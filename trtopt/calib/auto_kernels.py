"""The per-value loops of `--method auto`'s scoring (`trtopt.calib.auto`): one read of each value each.

Scoring a tensor rounds it to every candidate's INT8 grid, runs the nodes that read it on those roundings,
and sums each candidate's squared error against the FP32 outputs. With numpy each of those is several
passes over arrays of candidates x samples x the tensor (fake quantisation alone is four: divide, round,
clip, multiply); here each is one compiled loop (numba, `trtopt.calib.auto_kernels_numba`), with a numpy fallback
where numba is missing. Measured on PP-OCRv4's recogniser and ddddocr's detector (issue #21,
docs/benchmarks/auto-calibration-cost.md at 834753b) these passes, and the ONNX Runtime runs of elementwise consumers
that `elementwise_errors` replaces, were a third of auto's scoring time.

- `quantize_stack`: every candidate's fake quantisation of a tensor, stacked, in float32 as
  `trtopt.calib.auto.fake_quantize` computes it (the same float32 operations in the same order: equal bits).
- `squared_errors`: sum (out_c - ref)^2 per candidate c, and sum ref^2, the float32 differences accumulated
  in float64 (`sum_of_squares`: sum ref^2 alone). The float32 dot products used before accumulated in
  float32, off by up to about 1e-4 relative over millions of values; no choice of the three benchmark
  models moved (docs/benchmarks/auto-calibration-cost-choices.json at 834753b, compared before and after).
- `elementwise_errors`: the same sums for an Add, Sub or Mul consumer, the node's float32 result computed in
  the loop instead of by ONNX Runtime (one IEEE operation per value: the same bits as its kernels), so the
  node's output, and the other input's copy per candidate, are never written out.
- `mse_errors`: the squared error of every candidate threshold over a histogram, for
  `trtopt.calib.thresholds.mse_threshold` (auto searches it for every tensor): each term computed as numpy
  computed it, summed in another order (the thresholds of the three benchmark models are unchanged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from trtopt.calib.config import QMAX

log = logging.getLogger(__name__)

# The elementwise ops `elementwise_errors` computes itself, by code of the compiled loop.
ELEMENTWISE = {"Add": 0, "Sub": 1, "Mul": 2}


def quantize_stack(values: np.ndarray, amaxes: np.ndarray) -> np.ndarray:
    """[len(amaxes), *values.shape] float32: `values` fake-quantised at each threshold of `amaxes`."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    scales = (np.asarray(amaxes, np.float64) / QMAX).astype(np.float32)
    out = np.empty((scales.size, flat.size), np.float32)
    _kernels()["quantize"](flat, scales, out)
    return out.reshape(scales.size, *np.shape(values))


def squared_errors(out: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, float]:
    """(sum (part_c - reference)^2 for each of the equal parts of `out` along axis 0, sum reference^2)."""
    ref = np.ascontiguousarray(reference, dtype=np.float32).reshape(-1)
    parts = np.ascontiguousarray(out, dtype=np.float32).reshape(-1, ref.size)
    errors = np.zeros(parts.shape[0])
    energy = np.zeros(1)
    _kernels()["squared"](parts, ref, errors, energy)
    return errors, float(energy[0])


def sum_of_squares(values: np.ndarray) -> float:
    """sum values^2, accumulated in float64."""
    return float(_kernels()["energy"](np.ascontiguousarray(values, dtype=np.float32).reshape(-1)))


def mse_errors(centres: np.ndarray, weights: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """For each threshold t of `candidates`: sum weights * (c - q(c))^2 over the bin `centres` c, with
    q(c) = min(rint(c * 127 / t), 127) * t / 127 (`trtopt.calib.thresholds.mse_threshold`; centres >= 0), all
    float64, each term as numpy computes it."""
    errors = np.empty(candidates.size)
    as64 = [np.ascontiguousarray(a, dtype=np.float64) for a in (centres, weights, candidates)]
    _kernels()["mse"](*as64, errors)
    return errors


def elementwise_errors(
    op: str, stacked: np.ndarray, other: np.ndarray, reference: np.ndarray, *, scored_first: bool
) -> tuple[np.ndarray, float]:
    """`squared_errors` of `op`(part_c, other) (or (other, part_c) if not `scored_first`) for each part of
    `stacked` along axis 0; `other` broadcasts to `reference`'s shape, the shape of each part."""
    ref = np.ascontiguousarray(reference, dtype=np.float32).reshape(-1)
    parts = np.ascontiguousarray(stacked, dtype=np.float32).reshape(-1, ref.size)
    second = np.ascontiguousarray(np.broadcast_to(np.asarray(other, np.float32), reference.shape)).reshape(-1)
    errors = np.zeros(parts.shape[0])
    energy = np.zeros(1)
    _kernels()["elementwise"](parts, second, ref, ELEMENTWISE[op], scored_first, errors, energy)
    return errors, float(energy[0])


@lru_cache(maxsize=1)
def _kernels() -> dict[str, Callable[..., Any]]:
    try:
        import numba  # noqa: F401 - heavy (LLVM): imported on the first auto calibration, not with trtopt
    except ImportError:  # pragma: no cover - numba is a dependency; this keeps odd platforms working
        log.warning("numba is not installed: auto calibration scores with numpy, slower (pip install numba)")
        return {
            "quantize": _quantize_numpy,
            "squared": _squared_numpy,
            "elementwise": _elementwise_numpy,
            "energy": _energy_numpy,
            "mse": _mse_numpy,
        }
    from trtopt.calib import auto_kernels_numba as compiled

    names = ("quantize", "squared", "elementwise", "energy", "mse")
    return {name: getattr(compiled, name) for name in names}


# Candidates per step of the numpy MSE search: 256 x 2048 float64 = 4 MiB of temporaries.
_MSE_CHUNK = 256


def _mse_numpy(centres: np.ndarray, weights: np.ndarray, candidates: np.ndarray, errors: np.ndarray) -> None:
    work = np.empty((min(_MSE_CHUNK, candidates.size), centres.size))  # one buffer, every step in place
    for start in range(0, candidates.size, _MSE_CHUNK):
        t = candidates[start : start + _MSE_CHUNK, None]
        levels = work[: t.shape[0]]
        np.multiply(centres[None, :], QMAX / t, out=levels)
        np.rint(levels, out=levels)
        np.minimum(levels, QMAX, out=levels)  # the centres are >= 0: only the upper clip can bind
        np.multiply(levels, t / QMAX, out=levels)
        np.subtract(centres[None, :], levels, out=levels)
        np.square(levels, out=levels)
        np.multiply(levels, weights, out=levels)
        errors[start : start + _MSE_CHUNK] = levels.sum(axis=1)


def fake_quantize_at(values: np.ndarray, scale: np.float32, out: np.ndarray) -> np.ndarray:
    """`values` rounded to the symmetric INT8 grid of step `scale` and back, into `out` (float32): the numpy
    form of the compiled `quantize` loop, and `trtopt.calib.auto.fake_quantize`'s arithmetic."""
    np.divide(values, scale, out=out, dtype=np.float32)
    np.rint(out, out=out)
    np.clip(out, -QMAX, QMAX, out=out)
    return np.multiply(out, scale, out=out)


def _quantize_numpy(flat: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    for c in range(scales.size):
        fake_quantize_at(flat, scales[c], out[c])


def _energy_numpy(ref: np.ndarray) -> float:
    return float(np.dot(ref.astype(np.float64), ref.astype(np.float64)))


def _squared_numpy(parts: np.ndarray, ref: np.ndarray, errors: np.ndarray, energy: np.ndarray) -> None:
    energy[0] = _energy_numpy(ref)
    for c in range(parts.shape[0]):
        diff = (parts[c] - ref).astype(np.float64)
        errors[c] = float(np.dot(diff, diff))


def _elementwise_numpy(
    parts: np.ndarray, other: np.ndarray, ref: np.ndarray, op: int, first: bool, errors: np.ndarray, energy: Any
) -> None:
    ufunc = (np.add, np.subtract, np.multiply)[op]
    results = np.stack([ufunc(p, other) if first else ufunc(other, p) for p in parts])
    _squared_numpy(results, ref, errors, energy)
