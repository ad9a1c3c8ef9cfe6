"""What a build says when its plan fails verification (`trtopt.verify`), and what the user can do then.

A plan fails when no variant of its backend computes what its Q/DQ graph says within the tolerance; the
error names the variants tried and, where the plan's own INT8 math is far from FP32, says to fix the
quantisation first. `--write-failed` writes such a plan anyway, its record saying it failed, so that
`trtopt compare --per-layer` or the user's own metric can look at it (a fingerprint model whose output
mixes smooth maps with an atan2 and a peak mask failed on those alone: docs/holdout.md round 9).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtopt.errors import TrtoptError
from trtopt.plan.verification import KERNEL_CAP, REFERENCE_ADVICE

if TYPE_CHECKING:
    from trtopt.backend import Backend
    from trtopt.plan.verification import Verification


def no_matching_variant(backend: Backend[Any], result: Verification, rejected: list[dict[str, Any]]) -> TrtoptError:
    """The error of a build none of whose variants (`rejected`; `result`: the last) passed."""
    tried = ", ".join(f"{r['variant']} (relative error {r['rel_error']:.3g})" for r in rejected)
    what = (
        f"No build of this plan computes what its graph says on {backend.machine()}: tried {tried}, against a "
        f"tolerance of {result.tolerance:.3g} (twice the plan's own quantisation error, at most {KERNEL_CAP})."
    )
    if result.far_from_fp32:  # the reference is the problem: kernels cannot follow math that far from FP32
        return TrtoptError(
            f"{what} The plan's own INT8 math is far from FP32 too (reference vs FP32: "
            f"{result.reference_vs_fp32.describe()}), so fix the quantisation first. Nothing was written.",
            fix=REFERENCE_ADVICE,
        )
    return TrtoptError(
        f"{what} Nothing was written.",
        fix=backend.mismatch_fix + "--exclude the layers `trtopt compare --per-layer` names (on a plan written with "
        "--write-failed), or report the model: the kernels should not differ from the reference.",
    )
