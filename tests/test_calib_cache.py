"""Calibration caches: trtopt JSON, TensorRT text and ONNX Runtime files, read, written, detected, checked."""

from __future__ import annotations

import json
import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtopt.calib import (
    Calibration,
    check_cache_matches,
    load_cache,
    model_fingerprint,
    save_cache,
    trt_scale_from_hex,
    trt_scale_to_hex,
)
from trtopt.calib.cache_formats import TRTOPT_VERSION
from trtopt.errors import CalibrationError

AMAX = {"input": 2.640000104904175, "conv1:0": 0.123456789, "relu/out": 6.0, "tiny": 1e-6}


def calibration(**fields: object) -> Calibration:
    defaults = dict(amax=AMAX, method="entropy", num_samples=512, fingerprint="ab" * 32,
                    data_description="imgs/")
    defaults.update(fields)
    return Calibration(**defaults)  # type: ignore[arg-type]


def f32(x: float) -> float:
    return float(np.float32(x))


def test_trtopt_json_round_trips_exactly(tmp_path) -> None:
    path = save_cache(tmp_path / "model.calib.json", calibration())
    doc = json.loads(path.read_text())
    assert doc["format"] == "trtopt-calibration" and doc["version"] == 1
    assert doc["data"] == {"description": "imgs/", "count": 512} and doc["method"] == "entropy"
    loaded = load_cache(path)
    assert loaded.amax == AMAX  # bit-exact floats
    assert (loaded.method, loaded.num_samples, loaded.fingerprint) == ("entropy", 512, "ab" * 32)
    assert loaded.data_description == "imgs/" and "trtopt" in (loaded.source or "")
    assert [p.name for p in tmp_path.iterdir()] == ["model.calib.json"]  # no temporary left behind


def test_trtopt_json_keeps_channel_means_and_reads_caches_without_them(tmp_path) -> None:
    means = {"input": np.array([0.1, -2.5, 1 / 3]), "relu/out": np.array([6.0])}
    loaded = load_cache(save_cache(tmp_path / "m.json", calibration(channel_means=means)))
    assert loaded.channel_means is not None and set(loaded.channel_means) == set(means)
    for name, values in means.items():
        assert loaded.channel_means[name].tolist() == values.tolist()  # bit-exact
    assert load_cache(save_cache(tmp_path / "old.json", calibration())).channel_means is None
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["channel_means"] = {"input": ["x"]}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="not a finite number"):
        load_cache(tmp_path / "bad.json")


def test_trtopt_json_from_a_newer_version_is_refused(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "trtopt-calibration", "version": TRTOPT_VERSION + 1, "thresholds": {}}))
    with pytest.raises(CalibrationError, match=f"version {TRTOPT_VERSION + 1}"):
        load_cache(path)


@pytest.mark.parametrize(
    ("scale", "hex_digits"),
    [(0.0078125, "3c000000"), (1.0, "3f800000"), (2.0, "40000000"), (0.5, "3f000000")],
)
def test_tensorrt_hex_is_big_endian_float32_of_the_scale(scale: float, hex_digits: str) -> None:
    assert trt_scale_to_hex(scale) == hex_digits
    assert trt_scale_from_hex(hex_digits) == scale


def test_tensorrt_cache_round_trip(tmp_path) -> None:
    path = save_cache(tmp_path / "calib.cache", calibration(amax={"a": 127 * 0.0078125, **AMAX}), "tensorrt",
                      trt_version="8601")
    lines = path.read_text().splitlines()
    assert lines[0] == "TRT-8601-EntropyCalibration2"
    assert lines[1] == "a: 3c000000"
    loaded = load_cache(path)
    assert loaded.method == "entropy" and loaded.fingerprint is None
    for name, t in AMAX.items():  # TensorRT stores float32 scales: T comes back as float32(T/127) * 127
        assert loaded.amax[name] == f32(t / 127) * 127
        assert loaded.amax[name] == pytest.approx(t, rel=1e-7)


@pytest.mark.parametrize(
    ("algorithm", "method"),
    [("EntropyCalibration2", "entropy"), ("EntropyCalibration", "entropy"),
     ("MinMaxCalibration", "max"), ("LegacyCalibration", "legacy")],
)
def test_tensorrt_cache_headers(tmp_path, algorithm: str, method: str) -> None:
    # As TensorRT 7 wrote it for MNIST (nvdla/sw documentation), with a TensorFlow-style name.
    text = (f"TRT-7202-{algorithm}\ndata: 3c008912\nconv1: 3c60dd38\n"
            "(Unnamed Layer* 4) [Fully Connected]_output: 3d65992f\nx:0: 3f800000\n")
    (tmp_path / "mnist.cache").write_text(text)
    loaded = load_cache(tmp_path / "mnist.cache")
    assert loaded.method == method
    assert loaded.amax["data"] == pytest.approx(struct.unpack(">f", bytes.fromhex("3c008912"))[0] * 127)
    assert loaded.amax["x:0"] == 127.0
    assert "(Unnamed Layer* 4) [Fully Connected]_output" in loaded.amax


def test_tensorrt_header_version_and_algorithm_are_options(tmp_path) -> None:
    path = save_cache(tmp_path / "c.cache", calibration(), "tensorrt", trt_version="100300",
                      trt_algorithm="MinMaxCalibration")
    assert path.read_text().splitlines()[0] == "TRT-100300-MinMaxCalibration"
    with pytest.raises(CalibrationError, match="not a number"):
        save_cache(tmp_path / "c.cache", calibration(), "tensorrt", trt_version="10.3")


def test_damaged_tensorrt_line_names_the_line(tmp_path) -> None:
    (tmp_path / "c.cache").write_text("TRT-8601-EntropyCalibration2\na: 3c000000\nb 3c000000\n")
    with pytest.raises(CalibrationError, match="line 3"):
        load_cache(tmp_path / "c.cache")


def _ort_tables(tmp_path, method_name: str = "MinMax") -> None:
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
    from onnxruntime.quantization.quant_utils import write_calibration_table

    ranges = {"a": (np.array(-1.5, np.float32), np.array(2.25, np.float32)),
              "b:0": (np.array(-0.7, np.float32), np.array(0.3, np.float32))}
    write_calibration_table(TensorsData(getattr(CalibrationMethod, method_name), ranges), dir=str(tmp_path))


def test_reads_the_files_onnxruntime_writes(tmp_path) -> None:
    _ort_tables(tmp_path)
    from_json = load_cache(tmp_path / "calibration.json")
    assert from_json.amax == {"a": 2.25, "b:0": f32(0.7)} and from_json.method == "onnxruntime:minmax"
    from_text = load_cache(tmp_path / "calibration.cache")  # ORT writes max(highest, lowest) there
    assert from_text.amax == {"a": 2.25, "b:0": f32(0.3)}
    assert load_cache(tmp_path).amax == from_json.amax  # a folder: its calibration.json
    with pytest.raises(CalibrationError, match="binary"):
        load_cache(tmp_path / "calibration.flatbuffers")


def test_reads_the_older_onnxruntime_json(tmp_path) -> None:
    legacy = {"a": [-1.0, 0.5], "b": {"lowest": -2, "highest": 3}}
    (tmp_path / "calibration.json").write_text(json.dumps(legacy))
    assert load_cache(tmp_path / "calibration.json").amax == {"a": 1.0, "b": 3.0}


def test_onnxruntime_reads_what_we_write(tmp_path) -> None:
    from onnxruntime.quantization.calibrate import TensorsData

    save_cache(tmp_path / "calibration.json", calibration(), "onnxruntime-json")
    ours = TensorsData.from_dict(json.loads((tmp_path / "calibration.json").read_text()))
    assert float(ours["relu/out"].range_value[1]) == 6.0 and float(ours["relu/out"].range_value[0]) == -6.0
    assert load_cache(tmp_path / "calibration.json").amax == {k: f32(v) for k, v in AMAX.items()}
    save_cache(tmp_path / "calibration.cache", calibration(), "onnxruntime-text")
    assert load_cache(tmp_path / "calibration.cache").amax == AMAX


def test_unrecognised_and_broken_files_say_what_was_expected(tmp_path) -> None:
    (tmp_path / "x.txt").write_text("hello world\nthis is not a cache\n")
    with pytest.raises(CalibrationError, match="first line is 'hello world'") as info:
        load_cache(tmp_path / "x.txt")
    assert "TRT-<version>-EntropyCalibration2" in (info.value.fix or "")
    (tmp_path / "t.json").write_text('{"format": "trtopt-calibration", "version": 1, "thresh')
    with pytest.raises(CalibrationError, match="not valid JSON"):
        load_cache(tmp_path / "t.json")
    with pytest.raises(CalibrationError, match="does not exist"):
        load_cache(tmp_path / "missing.cache")


def test_saving_refuses_non_positive_thresholds(tmp_path) -> None:
    with pytest.raises(CalibrationError, match="zero, negative or not finite"):
        save_cache(tmp_path / "c.json", calibration(amax={"a": 0.0}))
    assert not any(tmp_path.iterdir())


def test_check_cache_matches_lists_missing_tensors_and_a_foreign_fingerprint() -> None:
    cache = calibration()
    check_cache_matches(cache, ["input", "relu/out"], fingerprint="ab" * 32)  # extras are fine
    with pytest.raises(CalibrationError) as info:
        check_cache_matches(cache, ["input", "conv2_out", "pool"], fingerprint="cd" * 32)
    message = info.value.what
    assert "another model" in message and "2 of 3 tensors" in message and "'conv2_out'" in message
    assert "Recalibrate" in (info.value.fix or "")
    with pytest.raises(CalibrationError, match="zero, negative"):
        check_cache_matches(calibration(amax={"a": -1.0}), ["a"])


def _model(second_name: str = "y") -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], [second_name])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info(second_name, TensorProto.FLOAT, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_fingerprint_follows_structure_and_names_not_batch_size(tmp_path) -> None:
    base = model_fingerprint(_model())
    assert base == model_fingerprint(_model()) and len(base) == 64
    assert model_fingerprint(_model("z")) != base
    fixed = _model()
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    assert model_fingerprint(fixed) == base
    onnx.save(_model(), tmp_path / "m.onnx")
    assert model_fingerprint(tmp_path / "m.onnx") == base
