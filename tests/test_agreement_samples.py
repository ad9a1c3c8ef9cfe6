"""The worst single sample: a mean over samples can hide a plan that fails a few inputs.

`trtopt.metrics.agreement.agreement` (the build's verification) and `trtopt compare` both name the sample whose
output is farthest from FP32, and warn when it is below `SAMPLE_MIN_COSINE` while the mean is not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from model_files import tiny_model_with_images
from task_models import text_map

from trtopt.cli.main import main
from trtopt.metrics.agreement import SAMPLE_MIN_COSINE, Agreement, agreement
from trtopt.metrics.compare import ErrorStats
from trtopt.plan.verification import Verification


def _one_bad_sample(samples: int = 40, bad: int = 17, noise: float = 0.8) -> tuple[dict, dict]:
    rng = np.random.default_rng(3)
    target = {"scores": rng.standard_normal((samples, 12)), "map": rng.standard_normal((samples, 2, 8))}
    outputs = {k: v + 0.01 * rng.standard_normal(v.shape) for k, v in target.items()}
    outputs["map"][bad] += noise * rng.standard_normal((2, 8))
    return outputs, target


def test_the_worst_sample_is_found_and_named() -> None:
    outputs, target = _one_bad_sample()
    figures = agreement(outputs, target, samples=40)
    want = outputs["map"][17].ravel() @ target["map"][17].ravel() / (
        np.linalg.norm(outputs["map"][17]) * np.linalg.norm(target["map"][17]))
    assert figures.worst_sample == pytest.approx(want) and want < SAMPLE_MIN_COSINE
    assert (figures.worst_sample_output, figures.worst_sample_index) == ("map", 17)
    assert figures.cosine > SAMPLE_MIN_COSINE  # the mean hides it
    assert f"worst sample {want:.4f}" in figures.describe(worst_sample=True) and "worst" not in figures.describe()


def test_no_worst_sample_where_rows_are_not_samples() -> None:
    outputs, target = _one_bad_sample()
    assert agreement(outputs, target).worst_sample is None  # the sensitivity search's calls: not asked for
    assert agreement(outputs, target, samples=8).worst_sample is None  # 40 rows of 8 samples: time steps
    few = {"p": target["scores"]}  # 12 logits per sample: their top class judges them
    assert agreement({"p": -few["p"]}, few, samples=40).worst_sample is None
    judged = {"steps": outputs["map"]}  # per-position class scores, or a label map: argmax agreement, mean IoU
    assert agreement(judged, {"steps": target["map"]}, {"steps": 2}, samples=40).worst_sample is None
    assert agreement(judged, {"steps": target["map"]}, label_maps=["steps"], samples=40).worst_sample is None


def _verification(reference: Agreement, samples: int = 40) -> Verification:
    return Verification(samples=samples, source="held back", isa="avx2", variant="u8u8", reference_vs_fp32=reference,
                        kernels_vs_reference=Agreement(0.9999, 0.01, None), tolerance=0.2)  # fmt: skip


def test_the_build_warns_of_one_far_sample_and_keeps_the_record() -> None:
    outputs, target = _one_bad_sample()
    record = _verification(agreement(outputs, target, samples=40))
    (warning,) = record.warnings
    assert "sample 18 of 40" in warning and "output map" in warning and "--calib" in warning
    assert Verification.from_dict(record.to_dict()) == record
    fine = _verification(agreement(*_one_bad_sample(noise=0.0), samples=40))
    assert fine.warnings == [] and fine.reference_vs_fp32.worst_sample > SAMPLE_MIN_COSINE
    older = _verification(Agreement(0.99, 0.05, None))  # plans written before the figure: no key, no warning
    assert "worst_sample" not in older.to_dict()["reference_vs_fp32"] and older.warnings == []


def test_a_far_plan_is_not_warned_twice() -> None:
    far = Agreement(0.9, 0.3, None, worst_sample=0.2, worst_sample_output="map", worst_sample_index=0)
    record = Verification(**{**_verification(far).__dict__, "far_from_fp32": True})
    assert len(record.warnings) == 1 and "one input" not in record.warnings[0]


def test_compare_statistics_count_samples_across_batches() -> None:
    outputs, target = _one_bad_sample()
    stats = ErrorStats("map")
    for start in range(0, 40, 16):  # batches of 16, 16 and 8: the bad sample is the second batch's second
        part = slice(start, start + 16)
        stats.update(target["map"][part], outputs["map"][part], batch=len(target["map"][part]))
    assert stats.worst_sample == (pytest.approx(agreement(outputs, target, samples=40).worst_sample), 17)
    assert stats.to_dict()["worst_sample_index"] == 17
    unbatched, ids = ErrorStats("map"), ErrorStats("labels")
    unbatched.update(target["map"], outputs["map"])
    ids.update(np.zeros((40, 32), np.int64), np.ones((40, 32), np.int64), batch=40)  # a label map: IoU judges it
    assert unbatched.to_dict()["worst_sample_cosine"] is None and ids.worst_sample is None


def test_compare_names_the_worst_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The file `trtopt compare` names is the one whose own comparison is the worst, at that cosine (a text
    detector's 32 x 32 score map, tests/task_models.py)."""
    tiny_model_with_images(tmp_path, 8)
    onnx.save_model(text_map(), tmp_path / "map.onnx")
    common, plan = [str(tmp_path / "map.onnx")], str(tmp_path / "map.engine")
    assert main(["build", *common, "--int8", "--calib", str(tmp_path / "images"), "--min-channels", "1",
                 "--preset", "imagenet", "--backend", "cpu", "--json", "-o", plan]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["compare", *common, plan, "--data", str(tmp_path / "images"), "--json"]) == 0
    (output,) = json.loads(capsys.readouterr().out)["outputs"]
    alone = {}
    for image in sorted((tmp_path / "images").iterdir()):
        assert main(["compare", *common, plan, "--data", str(image), "--json"]) == 0
        alone[image.name] = json.loads(capsys.readouterr().out)["outputs"][0]["cosine"]
    worst = min(alone, key=alone.__getitem__)
    assert Path(output["worst_sample"]).name == worst and alone[worst] < max(alone.values())
    assert output["worst_sample_cosine"] == pytest.approx(alone[worst], abs=1e-6)
