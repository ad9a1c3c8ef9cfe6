"""8-bit weights whose neighbouring pairs of products fit saturating int16 sums (`QuantConfig.pair_bounded_weights`).

On CPUs without VNNI (AVX2, AVX-512 without VNNI: `trtopt.backend.cpu.isa`) ONNX Runtime's u8s8 kernels multiply
with `vpmaddubsw`, which adds the products of two neighbouring reduction elements into a saturating int16. A pair
can saturate only when both weights are of one sign and large: 255 * (|q0| + |q1|) > 32767, i.e. |q0| + |q1| > 128
(one weight alone, at most 127, always fits; two of opposite signs partly cancel). 7-bit weights make every pair fit
by halving every weight's resolution. Here each output channel keeps its 8-bit grid (max|w| / 127) unless one of its
same-sign neighbouring pairs sums above 128; that channel then takes the smallest coarser scale at which every pair
fits, rounded from the float weights (at most 254 / 128 = 1.98x coarser, where 7-bit weights are 2x coarser on
every channel), and bias correction corrects for that grid.

Which elements are neighbours is the kernel's packing. Probed on ONNX Runtime 1.32 (avx2 EPYC; uint8 inputs of 255
against two weights of 127, the rest 0; `tests/test_quant_pairs.py` repeats it on saturating CPUs): QLinearConv
pairs its reduction in NHWC order, (kh, kw, C_in) flattened with C_in innermost, elements (2i, 2i + 1): input
channels 0 and 1 of one tap saturate, 1 and 2 do not, and with 3 or 5 input channels the last channel of one tap
pairs with the first of the next. Gemm and MatMul pair along K. Depthwise convs multiply one product at a time.
The build's verification compares the kernels with the plan's reference, so a kernel that paired otherwise would
be caught, not trusted.

Measured on the demo (EfficientNet-Lite0, avx2, every dense conv pair-bounded, 8 verification photos): INT8
reference relative error to FP32 0.060 (cosine 0.9981), against 0.076 (0.9972) with the 7-bit weights the u8s7
search chose for all 33 dense layers; the same bounding rounded from the 8-bit values instead of the float weights
gave 0.101.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

PAIR_LIMIT = 128  # |q0| + |q1| of a same-sign pair: 255 * 128 = 32640 <= 32767
_WIDENINGS = 60  # at most this many steps of a channel's scale to absorb rounding up past the limit
DENSE = ("Conv", "Gemm", "MatMul")


def reduction_rows(q: np.ndarray, op: str, attrs: Mapping[str, Any]) -> np.ndarray | None:
    """Weights as [output, K] in the order the kernels pair the reduction (module doc), or None for a layout this
    does not describe (a batched MatMul weight, a depthwise conv)."""
    if op == "Conv" and q.ndim >= 3:
        if int(attrs.get("group", 1)) > 1 and q.shape[1] == 1:
            return None
        return np.moveaxis(q, 1, -1).reshape(q.shape[0], -1)  # (C_out, kh, kw, C_in) flattened
    if op == "Gemm" and q.ndim == 2:
        return q if attrs.get("transB", 0) else q.T
    if op == "MatMul" and q.ndim == 2:
        return q.T
    return None


def output_axis(op: str, attrs: Mapping[str, Any]) -> int:
    """The weight's output-channel axis in its stored layout (what `reduction_rows` puts first)."""
    return 0 if op == "Conv" or (op == "Gemm" and attrs.get("transB", 0)) else 1


def pair_sums(rows: np.ndarray) -> np.ndarray:
    """Per row, the largest |q0| + |q1| over same-sign pairs (2i, 2i + 1); a lone weight counts as its magnitude.

    Computed as max(|q0 + q1| over the pairs, |q| over the row): a same-sign pair's |q0 + q1| is |q0| + |q1|,
    at least either magnitude; a pair of opposite signs or with a zero has |q0 + q1| at most the larger magnitude,
    which |q| counts. Int16 holds every sum of two int8 values. The same numbers as a select between the two
    cases over int32 copies, 9x faster (3.5 -> 0.4 ms on a 1280 x 320 weight; every dense layer of every CPU
    build calls this once per widening step)."""
    q = rows.astype(np.int16)
    if q.size == 0:
        return np.zeros(len(q), np.int32)
    even = q.shape[1] - q.shape[1] % 2  # an odd last element pairs with nothing: |q| counts it
    pairs = np.abs(q[:, 0:even:2] + q[:, 1:even:2]).max(axis=1, initial=0)
    return np.maximum(pairs, np.abs(q).max(axis=1)).astype(np.int32)


def fits_pairs(q: np.ndarray, op: str, attrs: Mapping[str, Any]) -> bool:
    """Whether int8 weights `q` (as stored) meet uint8 activations exactly in saturating u8s8 kernels."""
    rows = reduction_rows(q, op, attrs)
    return rows is not None and bool((pair_sums(rows) <= PAIR_LIMIT).all())


def pair_bounded(values: np.ndarray, axis: int, scale: np.ndarray, op: str, attrs: Mapping[str, Any]
                 ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(int8 weights, per-channel scales along `axis`) for float `values` starting from the 8-bit `scale`: the
    channels with a same-sign pair above `PAIR_LIMIT` widened until every pair fits (module doc). Layouts that
    `reduction_rows` does not describe, or a channel axis other than the output's, keep the 8-bit grid."""
    shape = [1] * values.ndim
    shape[axis] = -1

    def rounded(s: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(values / s.reshape(shape)), -127, 127).astype(np.int8)

    q = rounded(scale)
    rows = reduction_rows(q, op, attrs)
    if rows is None or axis != output_axis(op, attrs) or scale.size != rows.shape[0]:
        return q, scale
    widened = scale.astype(np.float64)
    for _ in range(_WIDENINGS):
        sums = pair_sums(rows)
        over = sums > PAIR_LIMIT
        if not over.any():
            break
        widened = widened * np.where(over, np.maximum(sums / PAIR_LIMIT, 1.005), 1.0)
        q = rounded(widened.astype(np.float32))
        rows = reduction_rows(q, op, attrs)
        assert rows is not None
    return q, widened.astype(np.float32)
