"""The sensitivity search: where INT8 moves an output too far, the fewest layers kept float (or thresholds widened)
that bring it back, found on calibration samples and confirmed on others.

Its entry point is `float_sensitive_layers` (the build calls it between calibration and Q/DQ insertion), with
its record `Sensitivity`, which the plan stores. `seven_bit_for_build` is the same kind of search for the CPU
encoding u8s7 (issue #45): which dense layers take 7-bit weights, so ONNX Runtime's u8s8 kernels run them
exactly on CPUs whose kernels saturate, at the least fidelity cost (record: `SevenBit`).

Its helpers (`_trials`: running candidate plans; `_objective`: what a trial is judged by; `_greedy`, `_widen`,
`_ceiling`, `_ranking`, `_trial_count`) are private to it.

It sits above verification: a trial is a quantised plan in its backend's measured form
(`Backend.measured_form`), run as ONNX Runtime computes it and compared with FP32 by the figures a build's
verification records (`trtopt.metrics.agreement`).
"""

from trtopt.search.sensitivity import (
    MIN_COSINE,
    REASON,
    SENSITIVITY_PHASE,
    Sensitivity,
    float_sensitive_layers,
)
from trtopt.search.seven_bit import SevenBit, seven_bit_for_build

__all__ = [
    "MIN_COSINE",
    "REASON",
    "SENSITIVITY_PHASE",
    "SevenBit",
    "Sensitivity",
    "float_sensitive_layers",
    "seven_bit_for_build",
]
