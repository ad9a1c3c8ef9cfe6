"""The compiled loops of `trtopt.calib.auto_kernels` (numba), imported on the first auto calibration only.

Module-level functions calling each other as globals, so that numba's disk cache serves every later process
(see `trtopt.calib.kernels_numba`, which also says where the cache goes). What each loop computes, and how
its sums differ from numpy's, is in `trtopt.calib.auto_kernels`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtopt.calib.config import QMAX  # numba compiles it in as a constant
from trtopt.calib.kernels_numba import compiled

# The sums run in LANES independent float64 accumulators, added at the end: a single one chains every add
# to the previous one and runs at half the speed.
LANES = 8


@compiled
def quantize(flat: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    top = np.float32(QMAX)
    for c in range(scales.size):
        scale = scales[c]
        for i in range(flat.size):
            q = np.rint(flat[i] / scale)  # float32 / float32: float32, as np.divide(..., dtype=float32)
            q = q if q < top else top
            out[c, i] = (q if q > -top else -top) * scale


@compiled
def energy(ref: np.ndarray) -> float:
    total = 0.0
    for i in range(ref.size):
        r = np.float64(ref[i])
        total += r * r
    return total


@compiled
def squared(parts: np.ndarray, ref: np.ndarray, errors: np.ndarray, energy_out: np.ndarray) -> None:
    energy_out[0] = energy(ref)
    size = ref.size
    whole = size - size % LANES
    for c in range(parts.shape[0]):
        acc = np.zeros(LANES)
        for i in range(0, whole, LANES):
            for j in range(LANES):
                d = np.float64(parts[c, i + j] - ref[i + j])  # the float32 difference, as numpy's subtract
                acc[j] += d * d
        total = acc.sum()
        for i in range(whole, size):
            d = np.float64(parts[c, i] - ref[i])
            total += d * d
        errors[c] = total


@compiled
def apply(op: int, a: np.float32, b: np.float32) -> np.float32:
    return a + b if op == 0 else (a - b if op == 1 else a * b)  # float32, as ONNX Runtime's kernels


@compiled
def elementwise(
    parts: np.ndarray, other: np.ndarray, ref: np.ndarray, op: int, first: bool, errors: np.ndarray, energy_out: Any
) -> None:
    energy_out[0] = energy(ref)
    size = ref.size
    whole = size - size % LANES
    for c in range(parts.shape[0]):
        acc = np.zeros(LANES)
        for i in range(0, whole, LANES):
            for j in range(LANES):
                k = i + j
                y = apply(op, parts[c, k], other[k]) if first else apply(op, other[k], parts[c, k])
                d = np.float64(y - ref[k])
                acc[j] += d * d
        total = acc.sum()
        for k in range(whole, size):
            y = apply(op, parts[c, k], other[k]) if first else apply(op, other[k], parts[c, k])
            d = np.float64(y - ref[k])
            total += d * d
        errors[c] = total


@compiled
def mse(centres: np.ndarray, weights: np.ndarray, candidates: np.ndarray, errors: np.ndarray) -> None:
    size = centres.size
    whole = size - size % LANES
    top = float(QMAX)
    for j in range(candidates.size):
        t = candidates[j]
        up, down = QMAX / t, t / QMAX
        acc = np.zeros(LANES)
        for i in range(0, whole, LANES):
            for lane in range(LANES):
                c = centres[i + lane]
                d = c - min(np.rint(c * up), top) * down
                acc[lane] += d * d * weights[i + lane]
        total = acc.sum()
        for i in range(whole, size):
            c = centres[i]
            d = c - min(np.rint(c * up), top) * down
            total += d * d * weights[i]
        errors[j] = total
