"""Property-based tests on random CNN graphs (trtopt.zoo.random_graphs; properties in tests/graph_fuzz.py).

A small derandomised budget runs in CI; `python tools/fuzz_graphs.py --examples N` runs long campaigns
and saves each failure as a minimal ONNX reproduction.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from graph_fuzz import (
    BuildVariant,
    Case,
    build_variants,
    check_int8_plan_valid,
    check_kernels_match_reference,
    check_optimize_idempotent,
    check_optimize_preserves_outputs,
    check_qdq_reference_close,
    random_graphs,
)
from hypothesis import HealthCheck, Phase, given, settings

from trtopt.zoo.random_graphs import RandomGraph

CI = settings(
    derandomize=True, max_examples=20, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def has_vnni(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether ONNX Runtime's u8s8 INT8 kernels can avoid the int16 saturation of AVX2's vpmaddubsw."""
    try:
        flags = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


@CI
@given(random_graphs())
def test_optimize_preserves_outputs_and_is_idempotent(graph: RandomGraph) -> None:
    case = Case(graph.model)
    check_optimize_preserves_outputs(case)
    check_optimize_idempotent(case)


@CI
@given(random_graphs(), build_variants())
def test_int8_build_is_valid_and_close_to_fp32(graph: RandomGraph, variant: BuildVariant) -> None:
    case = Case(graph.model, variant)
    check_int8_plan_valid(case)
    check_qdq_reference_close(case)


VNNI = has_vnni()


# Switch on (drop the mark and the `phases`) once the CPU backend picks a non-saturating encoding on AVX2
# machines. Without VNNI the expected failure is not shrunk (that alone took 15 s).
@pytest.mark.xfail(
    not VNNI,
    reason="ONNX Runtime's u8s8 INT8 kernels saturate (vpmaddubsw, int16) on CPUs without VNNI, so they do "
    "not match the Q/DQ reference there (fuzz campaign: up to 27x the rounding bound)",
    strict=False,
)
@settings(CI, max_examples=10, phases=tuple(Phase) if VNNI else (Phase.explicit, Phase.generate))
@given(random_graphs())
def test_int8_kernels_match_the_qdq_reference(graph: RandomGraph) -> None:
    check_kernels_match_reference(Case(graph.model))
