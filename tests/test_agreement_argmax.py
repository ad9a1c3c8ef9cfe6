"""Argmax agreement over positions for per-position class scores (trtopt.metrics.agreement): which outputs qualify,
the figure computed exactly with ties left out, and where the build and `trtopt compare` report it."""

from __future__ import annotations

import numpy as np
import pytest

from trtopt.cli.compare_cmd import _outputs_table, _warnings
from trtopt.cli.summaries import verification_text
from trtopt.metrics.agreement import (
    ARGMAX_MIN_AGREEMENT,
    Agreement,
    agreement,
    argmax_counts,
    argmax_warning,
    class_axes,
    class_axis,
)
from trtopt.metrics.compare import compare_outputs
from trtopt.plan.verification import Verification


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def test_which_outputs_qualify() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 20, 37)).astype(np.float32)
    assert class_axis(_softmax(logits, 2)) == 2  # [N, T, C] recogniser
    assert class_axis(np.log(_softmax(logits, 2))) == 2  # LogSoftmax
    assert class_axis(_softmax(rng.standard_normal((2, 5, 8, 8)), 1)) == 1  # softmaxed segmentation map
    assert class_axis(_softmax(rng.standard_normal((20, 1, 37)), 2)) == 2  # time-major [T, N, C]
    assert class_axis(_softmax(logits[0], 1)) is None  # [N, C]: a classifier (top-1 covers it)
    sigmoid = (1 / (1 + np.exp(-rng.standard_normal((1, 50, 10))))).astype(np.float32)
    assert class_axis(sigmoid) is None  # independent per-class scores of a detector head
    # raw logits: only on a text-line input, with the classes on the largest (last) axis
    assert class_axis(logits, (32, 320)) == 2 and class_axis(logits) is None and class_axis(logits, (64, 64)) is None
    assert class_axis(rng.standard_normal((1, 84, 8400)).astype(np.float32), (640, 640)) is None  # YOLOv8 head
    assert class_axis(rng.standard_normal((2, 1, 128)).astype(np.float32)) is None  # a recurrent state
    assert class_axis(np.zeros((2, 3, 4), np.int64)) is None
    assert class_axes({"p": _softmax(logits, 2), "s": sigmoid}) == {"p": 2}


def test_the_figure_counts_untied_positions_exactly() -> None:
    rng = np.random.default_rng(1)
    want = _softmax(rng.standard_normal((3, 10, 6)) * 3, 2)
    flat = want.reshape(-1, 6)
    ties = [4, 17]  # two positions whose top two scores are equal: left out
    for i in ties:
        order = np.argsort(flat[i])
        flat[i, order[-2]] = flat[i, order[-1]]
    got = want.copy().reshape(-1, 6)
    flips = [0, 4, 9, 22]  # 4 is a tie: flipping it costs nothing
    for i in flips:
        got[i, np.argsort(got[i])[-2]] = 2.0
    same, untied = argmax_counts(got.reshape(want.shape), want, 2)
    assert untied == 30 - len(ties) and same == untied - 3
    figures = agreement({"p": got.reshape(want.shape)}, {"p": want}, {"p": 2})
    assert figures.argmax == pytest.approx(25 / 28) and figures.positions == 28
    assert "argmax 89.29% of 28 positions" in figures.describe()
    assert agreement({"p": want}, {"p": want}).argmax is None  # no axes given: no figure (the search's calls)


def test_warning_below_the_level_names_the_fix() -> None:
    text = argmax_warning(0.97, 640, 0.9957)
    assert text is not None and "97.00%" in text and "of 640 positions" in text and "0.9957" in text
    assert "--calib" in text and "--exclude" in text
    assert argmax_warning(ARGMAX_MIN_AGREEMENT, 640, 0.99) is None
    assert argmax_warning(None, None, 0.99) is None


def _verification(argmax: float | None) -> Verification:
    ref = Agreement(0.9957, 0.05, None, argmax, 640 if argmax is not None else None)
    return Verification(samples=8, source="held back", isa="avx2", variant="u8u8", reference_vs_fp32=ref,
                        kernels_vs_reference=Agreement(0.9999, 0.01, None), tolerance=0.1)  # fmt: skip


def test_verification_record_warns_and_round_trips() -> None:
    flipped = _verification(0.97)
    assert len(flipped.warnings) == 1 and "top class" in flipped.warnings[0] and flipped.warning == flipped.warnings[0]
    record = flipped.to_dict()
    assert Verification.from_dict(record) == flipped
    assert "argmax 97.00% of 640 positions" in verification_text(record)
    assert _verification(0.995).warnings == [] and _verification(None).warning is None
    old = {k: v for k, v in record["reference_vs_fp32"].items() if k not in ("argmax", "positions")}
    assert Verification.from_dict(record | {"reference_vs_fp32": old}).reference_vs_fp32.argmax is None  # older plans


def test_compare_reports_the_figure_and_warns() -> None:
    rng = np.random.default_rng(2)
    feeds = {"x": np.zeros((2, 3, 32, 128), np.float32)}  # a text-line input
    batches = []
    for _ in range(3):
        ref = _softmax(rng.standard_normal((2, 16, 12)) * 4, 2)
        test = ref.copy()
        test[0, 0] = ref[0, 0][::-1]  # reverses the scores: the top class changes at one position per batch
        batches.append((feeds, {"p": ref, "n": ref[:, :, 0]}, {"p": test, "n": ref[:, :, 0]}))
    stats = {s.name: s for s in compare_outputs(iter(batches), ["p", "n"]).outputs}
    assert stats["p"].argmax_agreement == pytest.approx(1 - 3 / 96) and stats["p"].positions == 96
    assert stats["n"].argmax_agreement is None
    outputs = [s.to_dict() for s in stats.values()]
    assert outputs[0]["argmax_positions"] == 96
    (warning,) = _warnings(outputs)  # the argmax agreement judges these positions: no worst-input warning too
    assert warning.startswith("output 'p'") and "96.88%" in warning and outputs[0]["worst_sample_index"] is None
    assert len(_outputs_table(outputs, 6, "cpu").columns) == 10


def test_the_sensitivity_search_aims_at_the_top_class_agreement_too() -> None:
    """A tagger's [N, T, C] probabilities can keep a cosine above 0.99 while the top class changes at 5% of the
    positions (slovorez, docs/holdout.md round 8): the search's figures (trtopt.search._trials) take the agreement
    where it is lower, pooled and per sample; outputs that are no class scores keep their cosine."""
    from trtopt.search._trials import cosine_figures, output_figures, sample_cosines

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 25, 6)) * 3
    logits[..., 0] += 8  # a clear winner at every position...
    logits[:, :5, 1] = logits[:, :5, 0] - 0.05  # ...but a near tie at the first 5 of 25 positions of each sample
    want = _softmax(logits, axis=2)
    swapped = logits.copy()
    swapped[0, :5, 1] += 0.1  # sample 0: the runner-up wins at those 5 positions, the values barely move
    got = _softmax(swapped, axis=2)
    scores = rng.normal(size=(4, 10)).astype(np.float32)
    figures = cosine_figures({"p": got, "s": scores}, {"p": want, "s": scores})
    assert figures[0] == pytest.approx(95 / 100) and figures[1] == pytest.approx(1.0)
    assert agreement({"p": got}, {"p": want}).cosine > 0.99  # what the search read before: nothing to mend
    rows = sample_cosines([{"p": got, "s": scores}], [({}, 4)], {"p": want, "s": scores})
    np.testing.assert_allclose(rows[0], [20 / 25, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(rows[1], [1.0, 1.0, 1.0, 1.0])
    both = sample_cosines([{"p": got, "s": scores}], [({}, 4)], {"p": want, "s": scores}, split=True)
    np.testing.assert_array_equal(both[0], rows)  # the aim form first, then the cosines alone (the gains' form)
    assert both.shape == (2, 2, 4) and both[1, 0, 0] > 0.99 and np.all(both[1, 0, 1:] > 0.9999)
    pair = output_figures([{"p": got, "s": scores}], [({}, 4)], {"p": want, "s": scores}, split=True)
    np.testing.assert_array_equal(pair[0], figures)
    assert pair[1, 0] > 0.99 and pair[1, 1] == pytest.approx(1.0)
