"""tools/bench_cpu_runtimes.py's verdict (issue #44's goal): trtopt's default plan against every peer, on made-up
figures (the benchmark itself runs builds for minutes; its timing is not a test's business)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.fixture(scope="module")
def bench() -> Any:
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    sys.path.insert(0, str(TOOLS))
    try:
        import bench_cpu_runtimes

        yield bench_cpu_runtimes
    finally:
        sys.path.remove(str(TOOLS))


def timed(speedups: dict[str, float], noise: float = 0.0) -> dict[str, Any]:
    """Speed-ups as the benchmark records them, with the rounds behind them: FP32 at 10 ms, each variant at
    10 ms / its speed-up, each round off by up to `noise` (a fraction, alternating in sign from round to round)."""
    wobble = [1 + noise * (1 if r % 2 else -1) * (r % 5) / 4 for r in range(20)]
    ms = {v: [10 / s * w for w in (wobble if i % 2 else wobble[::-1])] for i, (v, s) in enumerate(speedups.items())}
    return speedups | {"ms": ms}


def result(default: str, b1: dict[str, float], b8: dict[str, float], cosines: dict[str, float]) -> dict[str, Any]:
    speed = {(threads, batch): timed(figures) for threads in (1, 2) for batch, figures in ((1, b1), (8, b8))}
    return {"name": "m", "default": default, "speed": speed, "scores": {v: (c, None) for v, c in cosines.items()}}


COSINES = {"trtopt cpu": 0.999, "trtopt openvino": 0.998, "NNCF + OpenVINO": 0.99, "ORT quantize_static": 0.95}


def test_the_default_plan_is_judged_against_the_other_tools_only(bench: Any) -> None:
    b1 = {"trtopt cpu": 1.2, "trtopt openvino": 1.5, "NNCF + OpenVINO": 1.4, "ORT quantize_static": 1.3}
    b8 = {"trtopt cpu": 1.9, "trtopt openvino": 1.6, "NNCF + OpenVINO": 1.5, "ORT quantize_static": 1.5}
    lines = bench.rows([result("openvino", b1, b8, COSINES)])
    assert lines[2].startswith("| m | 1 | 1.50x / 1.60x (openvino) |") and "| yes |" in lines[2]
    b1["NNCF + OpenVINO"] = 1.55  # ahead of the default at b1, not of trtopt cpu's plan at b8: only the default counts
    verdict = bench._goal([timed(b1), timed(b8)], {v: (c, None) for v, c in COSINES.items()}, "trtopt openvino")
    assert verdict == "no: NNCF + OpenVINO at b1 (1.55x: 3.2% behind)"


def test_a_peer_ahead_by_less_than_the_noise_is_a_tie(bench: Any) -> None:
    """1% behind, with rounds that scatter by up to 10%: the interval of the paired ratio reaches parity."""
    figures = {"trtopt cpu": 1.485, "trtopt openvino": 1.0, "NNCF + OpenVINO": 1.0, "ORT quantize_static": 1.5}
    scores = {v: (c, None) for v, c in COSINES.items()}
    verdict = bench._goal([timed(figures, noise=0.1), timed(figures, noise=0.1)], scores, "trtopt cpu")
    assert re.fullmatch(r"tie: ORT quantize_static at b1 \(1.50x: 0.\d% behind, within noise\), "
                        r"ORT quantize_static at b8 \(1.50x: 0.\d% behind, within noise\)", verdict)
    steady = bench._goal([timed(figures), timed(figures)], scores, "trtopt cpu")  # the same gap, rounds that agree
    assert steady.startswith("no: ORT quantize_static at b1 (1.50x: 1.0% behind)")


def test_a_more_faithful_peer_fails_the_goal(bench: Any) -> None:
    figures = {"trtopt cpu": 1.5, "trtopt openvino": 1.0, "NNCF + OpenVINO": 1.0, "ORT quantize_static": 1.0}
    scores = {v: (c, None) for v, c in (COSINES | {"ORT quantize_static": 0.9995}).items()}
    assert bench._goal([timed(figures)] * 2, scores, "trtopt cpu") == "no: ORT quantize_static's cosine"
    assert bench._goal([timed(figures), "static batch 1"], {}, "trtopt cpu") == "no: trtopt's build failed"


def test_a_gap_no_wider_than_two_sessions_of_the_default_plan_is_a_tie(bench: Any) -> None:
    """Steady rounds, 1% behind ORT's quantizer: a miss, unless the default plan's second session ran 2% apart."""
    figures = {"trtopt cpu": 1.485, "trtopt openvino": 1.0, "NNCF + OpenVINO": 1.0, "ORT quantize_static": 1.5}
    scores = {v: (c, None) for v, c in COSINES.items()}
    apart = figures | {bench.twin_of("trtopt cpu"): 1.515}
    verdict = bench._goal([timed(apart), timed(apart)], scores, "trtopt cpu")
    assert verdict == ("tie: ORT quantize_static at b1 (1.50x: 1.0% behind, within noise), "
                       "ORT quantize_static at b8 (1.50x: 1.0% behind, within noise)")
    near = figures | {bench.twin_of("trtopt cpu"): 1.49}
    assert bench._goal([timed(near), timed(near)], scores, "trtopt cpu").startswith("no: ")


def test_fidelity_is_the_worst_outputs_cosine_and_the_first_outputs_top1(bench: Any) -> None:
    """A landmark model's second head moved by a plan counts, where the first output alone hid it."""
    import numpy as np

    rng = np.random.default_rng(0)
    logits, head = rng.normal(size=(4, 10)), rng.normal(size=(4, 6))
    calls = {bench.FP32: lambda feeds: [logits, head],
             "plan": lambda feeds: [logits, head + rng.normal(scale=2.0, size=head.shape)]}  # fmt: skip
    scores = bench.fidelity(calls, [({"x": np.zeros(4)}, 4), ({"x": np.zeros(4)}, 3)])
    assert scores[bench.FP32] == (pytest.approx(1.0), 1.0)
    cosine, top1 = scores["plan"]
    assert cosine < 0.8 and top1 == 1.0  # the first output untouched: its classes agree


def test_a_float_plan_sets_no_fidelity_bar_in_the_default_column(bench: Any) -> None:
    """The benchmark picks the default column as `auto` does: a build that wrote the float plan (INT8 did not pay on
    that runtime) has no INT8 error, not an error of 0 that every INT8 plan would fail against."""
    assert bench._auto_error({"error_to_fp32": 0.0, "float_plan": True}) is None
    assert bench._auto_error({"error_to_fp32": 0.016, "float_plan": False}) == 0.016
    assert bench._auto_error({"error_to_fp32": None, "float_plan": False}) == 0.0  # an unverified plan, as before
