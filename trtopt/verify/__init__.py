"""Every plan checks itself: FP32, the plan's Q/DQ reference and the backend's kernels run on the same held-back
samples (`verified`), outputs after TopK / NMS judged by what they select from (`selection`), and what a build
says when no variant of its backend computes what its graph says (`failure`). The record it writes, and the
tolerances it is judged by, belong to the plan (`trtopt.plan.verification`).

It sits above the backends (it builds their variants and runs them) and below the sensitivity search and the
build, which use it.
"""

from trtopt.verify.verified import VerifyConfig, build_verified, collect, observed_outputs, verify_plan

__all__ = ["VerifyConfig", "build_verified", "collect", "observed_outputs", "verify_plan"]
