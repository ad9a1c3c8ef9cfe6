"""The distribution shift (trtopt.metrics.distribution_shift): exact on hand-made arrays, outliers count by their
number, caught where cosine is not (a LORE-like heat map whose bulk moved), quiet on small noise, and reported by
the build and `trtopt compare`."""

from __future__ import annotations

import numpy as np
import pytest

from trtopt.cli.compare_cmd import _outputs_table, _warnings
from trtopt.cli.summaries import verification_text
from trtopt.metrics.agreement import Agreement, agreement
from trtopt.metrics.compare import ErrorStats, compare_batches, compare_outputs
from trtopt.metrics.distribution_shift import (
    BATCH_SAMPLE,
    MAX_SHIFT,
    MIN_ELEMENTS,
    SAMPLE,
    distribution_shift,
    sampled,
    shift_warning,
)
from trtopt.plan.verification import REFERENCE_MIN_COSINE, Verification


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
    want = np.arange(8.0)
    assert distribution_shift(want, want, 1) == 0.0
    assert distribution_shift(want + 0.5, want, 1) == pytest.approx(1 / 8)  # each value passes one level
    assert distribution_shift(want + 2.5, want, 1) == pytest.approx(3 / 8)  # below 2.5: 3 of FP32's, none of its
    assert distribution_shift(want + 100, want, 1) == 1.0  # every value on the other side of 7
    assert distribution_shift(want[::-1].copy(), want, 1) == 0.0  # values swapped between positions: cosine's job


def test_outliers_count_by_their_number_not_their_size() -> None:
    want = np.arange(8.0)
    got = want.copy()
    got[0], got[-1] = -1e6, 1e9  # the extremes moved very far, but they are 2 of 8 values, each past no other
    assert distribution_shift(got, want, 1) == pytest.approx(1 / 8)


def test_small_outputs_and_constants() -> None:
    assert distribution_shift(np.ones(MIN_ELEMENTS - 1), np.zeros(MIN_ELEMENTS - 1)) is None  # too few for a figure
    assert distribution_shift(np.ones(MIN_ELEMENTS), np.zeros(MIN_ELEMENTS)) == 1.0
    assert distribution_shift(np.zeros(0), np.zeros(0), 1) is None


def test_no_unit_to_choose_the_same_on_logits_and_their_sigmoid() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(-8, 3, 5000)
    moved = logits + rng.normal(0.5, 0.2, 5000)
    sigmoid = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    assert distribution_shift(sigmoid(moved), sigmoid(logits)) == pytest.approx(distribution_shift(moved, logits))


def test_non_finite_values_are_the_worst_figure() -> None:
    want = np.arange(6.0)
    assert distribution_shift(np.full(6, np.nan), want, 1) == 1.0
    assert distribution_shift(want, np.array([0, 1, np.nan, 3, 4, 5]), 1) is None


def test_large_outputs_are_measured_on_the_same_positions_of_both() -> None:
    rng = np.random.default_rng(2)
    want = rng.standard_normal(SAMPLE + 12345).astype(np.float32)
    got, kept = sampled(want + 0.25, want)
    assert len(kept) == SAMPLE and np.allclose(got - kept, 0.25)
    assert distribution_shift(want + 0.25, want) == pytest.approx(0.0987, abs=0.003)  # 2 * Phi(0.125) - 1


def test_a_bulk_shift_under_huge_outliers_is_caught_while_cosine_stays_high() -> None:
    fp32, moved, healthy = _heat_map()
    bad = agreement({"hm": moved}, {"hm": fp32}, {})
    assert bad.cosine > REFERENCE_MIN_COSINE  # cosine, carried by the outliers, sees nothing wrong
    assert bad.shift is not None and bad.shift > MAX_SHIFT and bad.shift_output == "hm"
    good = agreement({"hm": healthy}, {"hm": fp32}, {})
    assert agreement({"hm": moved}, {"hm": fp32}).shift is None  # no axes: the search's calls, cosine only
    assert good.shift is not None and good.shift < MAX_SHIFT / 4
    two = agreement({"hm": healthy, "x": fp32 * 3}, {"hm": fp32, "x": fp32}, {})
    assert two.shift_output == "x"  # the output whose values moved most decides


def test_the_build_warns_and_records_the_figure() -> None:
    def verification(shift: float | None) -> Verification:
        ref = Agreement(0.957, 0.3, None, shift=shift, shift_output="hm" if shift is not None else None)
        return Verification(samples=8, source="held back", isa="avx2", variant="u8u8", reference_vs_fp32=ref,
                            kernels_vs_reference=Agreement(0.999, 0.01, None), tolerance=0.25)  # fmt: skip

    moved = verification(0.61)
    (warning,) = moved.warnings
    assert "'hm'" in warning and "61% of its values" in warning and "--exclude" in warning
    record = moved.to_dict()
    assert Verification.from_dict(record) == moved
    assert "distribution shift 0.610 (hm)" in verification_text(record)
    assert verification(MAX_SHIFT).warnings == [] and verification(None).warning is None
    old = {k: v for k, v in record["reference_vs_fp32"].items() if not k.startswith("shift")}
    assert Verification.from_dict(record | {"reference_vs_fp32": old}).reference_vs_fp32.shift is None  # older plans


def test_compare_reports_the_figure_and_warns() -> None:
    fp32, moved, healthy = _heat_map(3)
    feeds = {"x": np.zeros((2, 3, 8, 8), np.float32)}
    batches = [(feeds, {"hm": fp32[i:i + 2], "ok": fp32[i:i + 2]}, {"hm": moved[i:i + 2], "ok": healthy[i:i + 2]})
               for i in (0, 2)]  # fmt: skip
    stats = {s.name: s for s in compare_outputs(iter(batches), ["hm", "ok"]).outputs}
    assert stats["hm"].distribution_shift == pytest.approx(distribution_shift(moved, fp32))  # batches add up exactly
    assert stats["ok"].distribution_shift == pytest.approx(distribution_shift(healthy, fp32))
    outputs = [s.to_dict() for s in stats.values()]
    (warning,) = _warnings(outputs)
    assert "'hm'" in warning and "other side" in warning
    assert shift_warning("ok", outputs[1]["distribution_shift"], 0.99) is None
    table = _outputs_table(outputs, 4, "cpu")
    assert "distribution shift" in [c.header for c in table.columns]


def test_compare_keeps_a_bounded_sample_and_per_layer_statistics_keep_none() -> None:
    rng = np.random.default_rng(4)
    stats = ErrorStats("y")
    for _ in range(SAMPLE // BATCH_SAMPLE + 1):  # one batch more than the cap holds
        ref = rng.standard_normal(BATCH_SAMPLE + 100).astype(np.float32)
        stats.update(ref, ref + 1.0)
    assert sum(len(k) for k in stats.kept[1]) == SAMPLE and stats.distribution_shift == pytest.approx(0.383, abs=0.01)
    (layer,) = compare_batches([({"y": ref}, {"y": ref + 1.0})], ["y"])
    assert layer.distribution_shift is None and not layer.kept[1]
