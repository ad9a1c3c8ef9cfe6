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

if TYPE_CHECKING:
    from trtopt.agreement import Agreement
    from trtopt.backend import Backend
    from trtopt.verify import Verification

# What to do when the reference is far from FP32 (the warning's second half, and the fix of the error).
REFERENCE_ADVICE = (
    "Calibrate on samples like the ones the model will see (--calib with representative data), try another "
    "--method (auto, percentile, mse), or --exclude the layers `trtopt compare --per-layer` names (on a plan "
    "written with --write-failed). The sensitivity search, on unless --no-auto-exclude, keeps layers float only "
    "where that reaches its aim."
)


def reference_warning(reference_vs_fp32: Agreement) -> str:
    """The warning (and what to do) for a plan whose INT8 reference is far from FP32."""
    from trtopt.verify import REFERENCE_MIN_COSINE

    return (
        f"the INT8 plan itself is far from FP32 (reference vs FP32: cosine {reference_vs_fp32.cosine:.3f} on its "
        f"worst output, below {REFERENCE_MIN_COSINE}): expect its results to differ from the float model's. "
        f"{REFERENCE_ADVICE}"
    )


def no_matching_variant(backend: Backend[Any], result: Verification, rejected: list[dict[str, Any]]) -> TrtoptError:
    """The error of a build none of whose variants (`rejected`; `result`: the last) passed."""
    from trtopt.verify import KERNEL_CAP

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
