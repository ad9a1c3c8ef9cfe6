"""The quartile shift (trtopt.quartile_shift): exact on hand-made arrays, blind to outliers, caught where cosine is
not (a LORE-like heat map whose bulk moved), quiet on small noise, and reported by the build and `trtopt compare`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtopt.agreement import Agreement, agreement
from trtopt.cli.compare_cmd import _outputs_table, _warnings
from trtopt.cli.summaries import verification_text
from trtopt.compare import compare_outputs
from trtopt.quartile_shift import MAX_SHIFT, SAMPLE, quartile_shift, sampled, shift_warning
from trtopt.verify import REFERENCE_MIN_COSINE, Verification


def _heat_map(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FP32, a plan that moved its bulk, a healthy plan): logits like lore-detect's `hm` (docs/holdout.md):
    a background near -29, 2% of huge negative values down to -4.4e4 carrying the norm, a few cells near +2."""
    rng = np.random.default_rng(seed)
    shape = (4, 2, 48, 48)
    fp32 = rng.normal(-29, 6, shape)
    kind = rng.random(shape)
    huge, cells = kind < 0.02, kind > 0.997
    fp32[huge] = -rng.uniform(1e3, 4.4e4, huge.sum())
    fp32[cells] = rng.normal(2, 1, cells.sum())
    bulk = ~huge & ~cells
    moved = fp32.copy()
    moved[bulk] += 27.3 + rng.normal(0, 2, bulk.sum())  # the background's median: -29 -> -1.7
    moved[~bulk] *= 1 + rng.normal(0, 0.05, (~bulk).sum())
    healthy = fp32 + rng.normal(0, 0.5, shape) + fp32 * rng.normal(0, 0.02, shape)
    return fp32.astype(np.float32), moved.astype(np.float32), healthy.astype(np.float32)


def test_exact_on_hand_made_arrays() -> None:
    want = np.arange(5.0)  # quartiles 1, 2, 3: interquartile range 2
    assert quartile_shift(want, want) == 0.0
    assert quartile_shift(np.array([0.0, 1, 3, 3, 4]), want) == pytest.approx(0.5)  # the median moved by 1
    assert quartile_shift(want * 2, want) == pytest.approx(1.5)  # quartiles 2, 4, 6: the top one moved by 3
    assert quartile_shift(want + 1000.0, want) == pytest.approx(500.0)


def test_outliers_beyond_the_quartiles_do_not_move_it() -> None:
    want = np.arange(8.0)  # quartiles 1.75, 3.5, 5.25
    got = want.copy()
    got[0], got[-1] = -1e6, 1e9  # the extremes are anything: the middle half is unchanged
    assert quartile_shift(got, want) == 0.0


def test_an_output_without_an_interquartile_range_uses_a_wider_spread() -> None:
    want = np.array([0.0] * 16 + [10, 20, 30, 40])  # more than 3/4 zeros: quartiles 0, 0, 0; 5-95% spread 30.5
    assert quartile_shift(want + 1, want) == pytest.approx(1 / 30.5)
    assert quartile_shift(np.ones(6), np.full(6, 3.0)) == pytest.approx(2 / 3e-3)  # a constant: in 1e-3 of its RMS
    assert quartile_shift(np.ones(6), np.zeros(6)) is None  # all zero: nothing to measure in
    assert quartile_shift(np.zeros(0), np.zeros(0)) is None


def test_values_tiny_beside_the_output_magnitude_do_not_count() -> None:
    rng = np.random.default_rng(1)
    scores = rng.normal(0, 1, (8, 40, 600)) * 10  # a confident softmax over 600 classes (PP-OCRv4-rec-like)
    probs = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    doubled = probs * np.where(probs < 1e-6, 2.0, 1.0)  # the smallest probabilities double, the top ones stay
    assert np.quantile(probs, 0.75) < 1e-6 and np.quantile(doubled, 0.75) > 1.9 * np.quantile(probs, 0.75)
    assert quartile_shift(doubled, probs) < 0.01


def test_non_finite_values_are_the_worst_figure() -> None:
    want = np.arange(6.0)
    assert quartile_shift(np.full(6, np.nan), want) == math.inf
    assert quartile_shift(want, np.array([0, 1, np.nan, 3, 4, 5])) is None


def test_large_outputs_are_measured_on_the_same_positions_of_both() -> None:
    rng = np.random.default_rng(2)
    want = rng.standard_normal(SAMPLE + 12345).astype(np.float32)
    got, kept = sampled(want + 0.25, want)
    assert len(kept) == SAMPLE and np.allclose(got - kept, 0.25)
    assert quartile_shift(want + 0.25, want) == pytest.approx(0.25 / 1.349, rel=0.02)  # a normal's IQR: 1.349


def test_a_bulk_shift_under_huge_outliers_is_caught_while_cosine_stays_high() -> None:
    fp32, moved, healthy = _heat_map()
    bad = agreement({"hm": moved}, {"hm": fp32})
    assert bad.cosine > REFERENCE_MIN_COSINE  # cosine, carried by the outliers, sees nothing wrong
    assert bad.shift is not None and bad.shift > MAX_SHIFT and bad.shift_output == "hm"
    good = agreement({"hm": healthy}, {"hm": fp32})
    assert good.shift is not None and good.shift < MAX_SHIFT / 10
    two = agreement({"hm": healthy, "x": fp32 * 3}, {"hm": fp32, "x": fp32})
    assert two.shift_output == "x"  # the output whose quartiles moved most decides


def test_the_build_warns_and_records_the_figure() -> None:
    def verification(shift: float | None) -> Verification:
        ref = Agreement(0.957, 0.3, None, shift=shift, shift_output="hm" if shift is not None else None)
        return Verification(samples=8, source="held back", isa="avx2", variant="u8u8", reference_vs_fp32=ref,
                            kernels_vs_reference=Agreement(0.999, 0.01, None), tolerance=0.25)  # fmt: skip

    moved = verification(3.3)
    (warning,) = moved.warnings
    assert "'hm'" in warning and "3.30 times" in warning and "--exclude" in warning
    record = moved.to_dict()
    assert Verification.from_dict(record) == moved
    assert "quartile shift 3.300 (hm)" in verification_text(record)
    assert verification(MAX_SHIFT).warnings == [] and verification(None).warning is None
    old = {k: v for k, v in record["reference_vs_fp32"].items() if not k.startswith("shift")}
    assert Verification.from_dict(record | {"reference_vs_fp32": old}).reference_vs_fp32.shift is None  # older plans


def test_compare_reports_the_figure_and_warns() -> None:
    fp32, moved, healthy = _heat_map(3)
    feeds = {"x": np.zeros((2, 3, 8, 8), np.float32)}
    batches = [(feeds, {"hm": fp32[i:i + 2], "ok": fp32[i:i + 2]}, {"hm": moved[i:i + 2], "ok": healthy[i:i + 2]})
               for i in (0, 2)]  # fmt: skip
    stats = {s.name: s for s in compare_outputs(iter(batches), ["hm", "ok"]).outputs}
    assert stats["hm"].quartile_shift == pytest.approx(quartile_shift(moved, fp32))  # batches add up exactly
    assert stats["ok"].quartile_shift == pytest.approx(quartile_shift(healthy, fp32))
    outputs = [s.to_dict() for s in stats.values()]
    (warning,) = _warnings(outputs)
    assert "'hm'" in warning and "interquartile" in warning
    assert shift_warning("ok", outputs[1]["quartile_shift"], 0.99) is None
    table = _outputs_table(outputs, 4, "cpu")
    assert "quartile shift" in [c.header for c in table.columns]
