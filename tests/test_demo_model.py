"""The shipped demo model (EfficientNet-Lite0, ImageNet) on real labelled photos: FP32 and an INT8 plan.

Labels: tests/data/heldout/labels.json (acceptable ImageNet classes per photo, set by looking at the
photos). Measured when written: FP32 top-1 37/44, top-5 44/44 (models/README.md); the bounds below
leave room for other ONNX Runtime versions without letting a broken pipeline pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import trtopt
from trtopt.build import BuildConfig, build_plan
from trtopt.data import DataConfig, PreprocessSpec, preprocess_images
from trtopt.data.classes import imagenet_labels, top_k
from trtopt.execution import OrtSession
from trtopt.frontend import load_model
from trtopt.plan import write_plan
from trtopt.quant import QuantConfig

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "efficientnet_lite0.onnx"
HELDOUT = ROOT / "tests" / "data" / "heldout"


@pytest.fixture(scope="module")
def labelled() -> tuple[list[Path], list[list[int]]]:
    labels = json.loads((HELDOUT / "labels.json").read_text())
    files = sorted(labels)
    return [HELDOUT / f for f in files], [labels[f] for f in files]


@pytest.fixture(scope="module")
def batch(labelled) -> np.ndarray:  # type: ignore[no-untyped-def]
    spec = PreprocessSpec.from_dict(json.loads(MODEL.with_suffix(".json").read_text())["preprocess"])
    return preprocess_images(labelled[0], spec)


def _hits(logits: np.ndarray, truth: list[list[int]], k: int) -> int:
    return sum(
        bool(set(p.index for p in preds) & set(t)) for preds, t in zip(top_k(logits, k), truth, strict=True)
    )


def test_fp32_model_classifies_real_photos(labelled, batch) -> None:  # type: ignore[no-untyped-def]
    logits = OrtSession(load_model(MODEL).model).run({"input": batch})["logits"]
    assert logits.shape == (44, 1000)
    assert _hits(logits, labelled[1], 5) >= 42
    assert _hits(logits, labelled[1], 1) >= 33
    chelsea = [
        p.label
        for p in top_k(logits, 5, imagenet_labels())[
            [f.name for f in labelled[0]].index("skimage_chelsea.jpg")
        ]
    ]
    assert {"tabby", "tiger cat", "Egyptian cat"} & set(chelsea)


@pytest.mark.slow
def test_int8_plan_keeps_the_predictions(tmp_path, labelled, batch) -> None:  # type: ignore[no-untyped-def]
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(ROOT / "calib_data"),), count=48))
    result = build_plan(MODEL, config)
    # The 3-channel stem stays float (DESIGN.md: tiny layers), and so does the depthwise conv it feeds
    # (QuantConfig.float_leading_depthwise).
    assert result.report.float_convs == 2
    assert result.report.int8_convs == 47
    assert result.plan.metadata.quant is not None and len(result.plan.metadata.quant.bias_corrected_layers) == 48
    path = write_plan(result.plan, tmp_path / "demo.engine")
    engine = trtopt.Engine.load(path)
    assert engine.labels == imagenet_labels()
    int8 = engine(batch)
    fp32 = OrtSession(load_model(MODEL).model).run({"input": batch})["logits"]
    agreement = float((int8.argmax(1) == fp32.argmax(1)).mean())
    assert agreement >= 0.9, agreement  # measured 1.00 with 48 images (0.93-0.95 before bias correction)
    assert _hits(int8, labelled[1], 5) >= 40


def test_leading_depthwise_rule_can_be_switched_off() -> None:
    config = BuildConfig(
        backend="cpu",
        data=DataConfig(sources=(str(ROOT / "calib_data"),), count=8),
        quant=QuantConfig(float_leading_depthwise=False),
    )
    result = build_plan(MODEL, config)
    assert (result.report.float_convs, result.report.int8_convs) == (1, 48)
