"""Activation equalisation with a calibration cache (trtopt.quant.equalize_cache): a build from a cache redoes
the rewrite the calibration recorded, so it makes the plan a build from the same data makes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from trtopt.build import BuildConfig, build_plan
from trtopt.calib import CalibConfig, load_cache, save_cache
from trtopt.calib.cache_formats import TRTOPT_VERSION
from trtopt.cli.main import main
from trtopt.data.config import DataConfig
from trtopt.errors import CalibrationError
from trtopt.execution import run_model
from trtopt.frontend import graph_from_onnx, onnx_from_graph
from trtopt.quant import QuantConfig
from trtopt.zoo import GraphBuilder

SAMPLES = 16  # fewer than 8 x the verification samples: a build from data holds none back, as `calibrate`


def _model(spread: float, seed: int = 5) -> onnx.ModelProto:
    """input ─ Conv 16->32 ─ Relu ─ dw Conv ─ Relu ─ Conv 32->32 ─ Relu ─ dw Conv ─ Relu ─ Conv 32->16 ─ output,
    each depthwise conv's input with channel ranges `spread` apart (undone by its weights)."""
    b = GraphBuilder("eq_cache", seed=seed, opset=14)
    x = b.input("input", ["N", 16, 12, 12])
    y = b.conv(x, 16, 32, 1)
    y = b.relu(b.conv(b.relu(y), 32, 32, 3, group=32))
    y = b.relu(b.conv(y, 32, 32, 1))
    y = b.relu(b.conv(y, 32, 32, 3, group=32))
    graph = graph_from_onnx(b.build([b.conv(y, 32, 16, 1, out="output")]))
    factors = np.geomspace(1.0 / spread, 1.0, 32).astype(np.float32)
    convs = [n for n in graph.nodes if n.op == "Conv"]
    for producer, depthwise in ((convs[0], convs[1]), (convs[2], convs[3])):
        producer.inputs[1].values = producer.inputs[1].values * factors[:, None, None, None]
        producer.inputs[2].values = producer.inputs[2].values * factors
        depthwise.inputs[1].values = depthwise.inputs[1].values / factors[:, None, None, None]
    return onnx_from_graph(graph)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("eqcache")
    onnx.save_model(_model(100.0), root / "m.onnx")
    onnx.save_model(_model(100.0, seed=6), root / "other_weights.onnx")  # same graph, other weights
    rng = np.random.default_rng(3)
    np.savez(root / "calib.npz", input=rng.standard_normal((SAMPLES, 16, 12, 12)).astype(np.float32))
    np.savez(root / "eval.npz", input=rng.standard_normal((4, 16, 12, 12)).astype(np.float32))
    return root


@pytest.fixture(scope="module")
def saved(work: Path) -> tuple[Path, BuildConfig]:
    """A build from data that saved its cache (trtopt's format, with the equalisation record)."""
    return work / "saved.json", build_plan(work / "m.onnx", _config(work, save=work / "saved.json"))


def _config(work: Path, *, cache: Path | None = None, save: Path | None = None, equalize: bool = True) -> BuildConfig:
    return BuildConfig(backend="cpu", data=DataConfig(sources=(str(work / "calib.npz"),)),
                       calib=CalibConfig(cache=cache, save_cache=save),
                       quant=QuantConfig(min_channels=1, equalize=equalize))  # fmt: skip


def _outputs(plan_onnx: bytes, work: Path) -> np.ndarray:
    feeds = dict(np.load(work / "eval.npz"))
    return np.asarray(run_model(onnx.load_from_string(plan_onnx), feeds)["output"])


def test_build_from_its_saved_cache_makes_the_same_plan(work: Path, saved: tuple[Path, Any]) -> None:
    direct = saved[1]
    cache = json.loads((work / "saved.json").read_text())
    assert cache["version"] == TRTOPT_VERSION == 2 and cache["equalization"]["applied"]
    assert len(cache["equalization"]["gains"]) == 2 and direct.equalization == "2 tensors rescaled"
    assert any(t.endswith(".equalized") for t in cache["thresholds"])
    again = build_plan(work / "m.onnx", _config(work, cache=work / "saved.json"))
    assert again.equalization is not None and again.equalization.startswith("2 tensors rescaled, with the gains")
    assert again.plan.sections["onnx"] == direct.plan.sections["onnx"]
    assert dict(again.calibration.amax) == dict(direct.calibration.amax)  # type: ignore[union-attr]
    np.testing.assert_array_equal(_outputs(again.plan.sections["onnx"], work),
                                  _outputs(direct.plan.sections["onnx"], work))  # fmt: skip
    plain = build_plan(work / "m.onnx", _config(work, equalize=False))
    assert plain.plan.sections["onnx"] != direct.plan.sections["onnx"]  # equalisation changed this model's plan


def test_calibrate_then_build_from_the_cache_equals_a_direct_build(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--calib", str(work / "calib.npz")]
    assert main(["calibrate", str(work / "m.onnx"), *common, "--backend", "cpu", "-o", str(work / "c.json")]) == 0
    capsys.readouterr()
    for name, extra in (("direct", []), ("cached", ["--calib-cache", str(work / "c.json")])):
        args = ["build", str(work / "m.onnx"), "--int8", *common, *extra, "--backend", "cpu", "--min-channels", "1"]
        assert main([*args, "-o", str(work / f"{name}.engine"), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["equalization"].startswith("2 tensors rescaled")
    assert main(["export", str(work / "direct.engine"), "--section", "onnx", "-o", str(work / "d.onnx")]) == 0
    assert main(["export", str(work / "cached.engine"), "--section", "onnx", "-o", str(work / "c.onnx")]) == 0
    direct, cached = (work / "d.onnx").read_bytes(), (work / "c.onnx").read_bytes()
    assert cached == direct
    np.testing.assert_array_equal(_outputs(cached, work), _outputs(direct, work))


def _old_format_cache(work: Path) -> Path:
    """A cache as trtopt wrote it before it recorded equalisation: the graph as given, no "equalization"."""
    assert main(["calibrate", str(work / "m.onnx"), "--calib", str(work / "calib.npz"), "--no-equalize",
                 "-o", str(work / "plain.json")]) == 0  # fmt: skip
    doc = json.loads((work / "plain.json").read_text())
    assert doc["version"] == 1 and doc["equalization"]["applied"] is False
    del doc["equalization"]
    (work / "old.json").write_text(json.dumps(doc))
    return work / "old.json"


def test_an_old_cache_builds_without_equalisation_and_says_how_to_get_it(work: Path) -> None:
    old = _old_format_cache(work)
    result = build_plan(work / "m.onnx", _config(work, cache=old))
    note = result.equalization or ""
    assert note.startswith("not applied") and "no equalisation record" in note and "trtopt calibrate" in note
    plain = build_plan(work / "m.onnx", _config(work, equalize=False))  # what it built before: the graph as given
    np.testing.assert_allclose(_outputs(result.plan.sections["onnx"], work),
                               _outputs(plain.plan.sections["onnx"], work), rtol=0, atol=1e-5)  # fmt: skip
    flagged = build_plan(work / "m.onnx", _config(work, cache=work / "plain.json"))
    assert "--no-equalize" in (flagged.equalization or "")


def test_no_equalize_with_a_cache_of_the_rewritten_graph_is_refused(
    work: Path, saved: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CalibrationError, match="--no-equalize") as info:
        build_plan(work / "m.onnx", _config(work, cache=saved[0], equalize=False))
    assert "Drop --no-equalize" in (info.value.fix or "")
    code = main(["build", str(work / "m.onnx"), "--int8", "--calib-cache", str(saved[0]), "--no-equalize",
                 "--backend", "cpu", "-o", str(work / "x.engine")])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "--no-equalize" in err and "Traceback" not in err and not (work / "x.engine").exists()


def _tampered(work: Path, name: str, change: dict) -> Path:
    doc = json.loads((work / "saved.json").read_text())  # the `saved` fixture's
    doc["equalization"].update(change)
    (work / name).write_text(json.dumps(doc))
    return work / name


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"graph_fingerprint": "0" * 64}, "after equalising another graph"),
        ({"gains": {"nope": [1.0, 2.0]}}, "no tensor feeding a depthwise conv is named 'nope'"),
        ("short", "has 3 gains, the tensor 32 channels"),
        ({"gains": {"x": "big"}}, "must be a non-empty list of finite numbers >= 1"),
        ({"applied": "yes"}, "true/false"),
    ],
)
def test_a_cache_that_does_not_fit_the_graph_is_a_clear_error(
    work: Path, saved: tuple[Path, Any], capsys: pytest.CaptureFixture[str], change: dict | str, says: str
) -> None:
    if change == "short":
        gains = json.loads((work / "saved.json").read_text())["equalization"]["gains"]
        change = {"gains": {name: values[:3] for name, values in gains.items()}}
    assert isinstance(change, dict)
    bad = _tampered(work, "bad.json", change)
    code = main(["build", str(work / "m.onnx"), "--int8", "--calib-cache", str(bad), "--backend", "cpu",
                 "-o", str(work / "bad.engine")])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and says in err and "Traceback" not in err and not (work / "bad.engine").exists()


def test_a_cache_of_another_model_is_refused(
    work: Path, saved: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    other = GraphBuilder("other", seed=1, opset=14)
    x = other.input("input", ["N", 16, 12, 12])
    onnx.save_model(other.build([other.conv(other.relu(other.conv(x, 16, 32, 1)), 32, 16, 1, out="output")]),
                    work / "other.onnx")  # fmt: skip
    code = main(["build", str(work / "other.onnx"), "--int8", "--calib-cache", str(saved[0]),
                 "--backend", "cpu", "-o", str(work / "o.engine")])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and "another" in err and "Traceback" not in err


def test_retrained_weights_reuse_the_recorded_gains(work: Path, saved: tuple[Path, Any]) -> None:
    """Same graph, other weights: the fingerprint matches and the recorded gains are applied (a cache fits a
    graph, as TensorRT's does, not its weights)."""
    result = build_plan(work / "other_weights.onnx", _config(work, cache=saved[0]))
    assert (result.equalization or "").startswith("2 tensors rescaled")


def test_foreign_formats_hold_the_graph_as_given(work: Path, saved: tuple[Path, Any]) -> None:
    assert main(["calibrate", str(work / "m.onnx"), "--calib", str(work / "calib.npz"), "--format", "tensorrt",
                 "-o", str(work / "trt.cache")]) == 0  # fmt: skip
    text = (work / "trt.cache").read_text()
    assert text.startswith("TRT-") and ".equalized" not in text
    result = build_plan(work / "m.onnx", _config(work, cache=work / "trt.cache"))
    assert (result.equalization or "").startswith("not applied")
    equalised = load_cache(saved[0])
    with pytest.raises(CalibrationError, match="--no-equalize"):
        save_cache(work / "x.cache", equalised, format="tensorrt")
    assert not (work / "x.cache").exists()
    save_cache(work / "y.cache", replace(equalised, equalization=None, amax={"t": 1.0}), format="tensorrt")
