"""The sensitivity search: where INT8 moves an output too far, the fewest layers kept float (or thresholds widened)
that bring it back, found on calibration samples and confirmed on others.

One entry point, `float_sensitive_layers` (the build calls it between calibration and Q/DQ insertion), and one
record, `Sensitivity`, which the plan stores. Its helpers (`_trials`: running candidate plans; `_objective`: what a
trial is judged by; `_greedy`, `_widen`, `_ceiling`, `_ranking`, `_trial_count`) are private to it.

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

__all__ = ["MIN_COSINE", "REASON", "SENSITIVITY_PHASE", "Sensitivity", "float_sensitive_layers"]
