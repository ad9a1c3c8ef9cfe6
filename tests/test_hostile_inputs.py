"""Issue #15: hostile input through the CLI, plan files, the API and the service. Each test makes the bad
file, path or value, and checks the clean error (or the right behaviour) and that nothing was lost."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import signal
import socket
import stat
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hostile_files import (
    model_with_external_data,
    model_with_if_branch,
    png_header_only,
    relu_model,
    sealed_plan,
    split_plan,
    start_service,
)
from model_files import tiny_model_with_images
from PIL import Image

import trtopt
from trtopt.build import BuildConfig, build_plan
from trtopt.calib import CalibConfig, load_cache
from trtopt.cli.main import main
from trtopt.data import DataConfig, PreprocessConfig
from trtopt.data.images import UnreadableFileError, read_image, read_image_bytes
from trtopt.errors import CalibrationError, DataError, ModelError, PlanError, ShapeError, TrtoptError
from trtopt.frontend import graph_from_onnx, load_model, parse_shapes, require_static_shapes
from trtopt.frontend.writer import check_output, write_atomic
from trtopt.plan import read_plan, write_plan
from trtopt.plan.format import plan_from_bytes
from trtopt.verify import VerifyConfig
from trtopt.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tiny_model_with_images(tmp_path_factory.mktemp("hostile"), 6, model="m.onnx", images="imgs")
    config = BuildConfig(backend="cpu", data=DataConfig(sources=(str(root / "imgs"),)),
                         preprocess=PreprocessConfig(preset="imagenet"), calib=CalibConfig(save_cache=root / "c.json"),
                         verify=VerifyConfig(samples=2))  # fmt: skip
    write_plan(build_plan(root / "m.onnx", config).plan, root / "p.engine")
    return root


def _from_cache(cache: Path, **stages: Any) -> BuildConfig:
    return BuildConfig(backend="cpu", calib=CalibConfig(cache=cache), verify=VerifyConfig(samples=1), **stages)


def _cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


# --- data loss ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "{d}/m.onnx", "-o", "{d}/m.onnx"],
        ["calibrate", "{d}/m.onnx", "--calib", "{d}/imgs", "-o", "{d}/m.onnx"],
        ["optimize", "{d}/m.onnx", "-o", "{d}/m.onnx"],
        ["export", "{d}/p.engine", "--section", "onnx", "-o", "{d}/p.engine"],
        ["build", "{d}/m.onnx", "--int8", "--calib-cache", "{d}/c.json", "-o", "{d}/c.json"],
        ["build", "{d}/m.onnx", "--int8", "--calib", "{d}/imgs", "--save-cache", "{d}/x.bin", "-o", "{d}/x.bin"],
    ],
    ids=["build-onto-model", "calibrate-onto-model", "optimize-onto-model", "export-onto-plan",
         "build-onto-cache", "save-cache-is-output"],  # fmt: skip
)
def test_output_that_is_an_input_is_refused_and_nothing_changes(work, capsys, argv) -> None:  # type: ignore[no-untyped-def]
    before = {p: p.read_bytes() for p in work.iterdir() if p.is_file()}
    code, text = _cli(capsys, *[a.format(d=work) for a in argv])
    assert code == 2 and "Traceback" not in text
    assert "same file" in text or "both name" in text
    assert {p: p.read_bytes() for p in work.iterdir() if p.is_file()} == before


def test_devices_fifos_and_folders_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, kind in ((fifo, "FIFO"), (Path("/dev/null"), "device"), (tmp_path, "directory")):
        with pytest.raises(TrtoptError, match=kind):
            write_atomic(target, b"x")
    assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_symlink_is_followed_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "real.bin").write_bytes(b"old")
    (tmp_path / "link.bin").symlink_to("real.bin")
    write_atomic(tmp_path / "link.bin", b"new")
    assert (tmp_path / "link.bin").is_symlink() and (tmp_path / "real.bin").read_bytes() == b"new"


def test_files_get_the_mode_open_would_give(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "new.bin", b"x")
        (tmp_path / "kept.bin").write_bytes(b"x")
        os.chmod(tmp_path / "kept.bin", 0o604)
        write_atomic(tmp_path / "kept.bin", b"y")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.bin").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "kept.bin").stat().st_mode) == 0o604


def test_unwritable_output_fails_before_calibration(work, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import trtopt.calib.stage

    monkeypatch.setattr(trtopt.calib.stage, "calibrate_graph", lambda *a, **k: pytest.fail("calibrated anyway"))
    (work / "afile").write_bytes(b"")
    cache = work / "early.json"
    code, text = _cli(capsys, "build", work / "m.onnx", "--int8", "--calib", work / "imgs", "--save-cache", cache,
                      "-o", work / "afile" / "p.engine")  # fmt: skip
    assert code == 2 and "Cannot write" in text and not cache.exists()


def test_sigterm_removes_the_temporary_file(tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import trtopt.frontend.writer as writer

    def terminated_during_rename(src: Any, dst: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    onnx.save_model(build_model("tiny_cnn", seed=1), tmp_path / "m.onnx")
    monkeypatch.setattr(writer.os, "replace", terminated_during_rename)
    code, text = _cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "out.onnx")
    assert code == 143 and "Terminated" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_interrupt_after_a_write_says_what_was_written(tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import trtopt.cli.optimize_cmd as optimize_cmd

    onnx.save_model(build_model("tiny_cnn", seed=1), tmp_path / "m.onnx")
    monkeypatch.setattr(optimize_cmd, "_print_tables", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    code, text = _cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx")
    assert code == 130 and "o.onnx" in text and "nothing was written" not in text
    assert onnx.load(tmp_path / "o.onnx").graph.node


# --- tracebacks -----------------------------------------------------------------------------------------


def test_error_texts_are_never_markup(capsys) -> None:  # type: ignore[no-untyped-def]
    from trtopt.cli.console import print_error

    print_error(TrtoptError("Cannot read 'a[/]b' or 'dog[red].jpg'.", fix="pip install 'trtopt[gpu]'"))
    text = capsys.readouterr().err
    assert "a[/]b" in text and "dog[red].jpg" in text and "trtopt[gpu]" in text


def test_path_with_markup_in_cli(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, text = _cli(capsys, "inspect", tmp_path / "x[/]y[red].onnx")
    assert code == 2 and "x[/]y[red].onnx" in text and "Traceback" not in text


@pytest.mark.parametrize(("offset", "length"), [(10**20, 4), (0, 10**15), (-5, 4), (8, 16)])
def test_external_data_out_of_range(tmp_path: Path, offset: int, length: int) -> None:
    with pytest.raises(ModelError, match="w.bin"):
        load_model(model_with_external_data(tmp_path, offset=offset, length=length))


def test_absurd_shapes_and_their_hint() -> None:
    with pytest.raises(ShapeError, match="out of range"):
        parse_shapes(["input:99999999999999999999x3x32x32"])
    graph = graph_from_onnx(relu_model(["N", 3, "H", "W"]))
    with pytest.raises(ShapeError) as info:
        require_static_shapes(graph)
    suggested = info.value.fix.split("--shapes ")[1].split()[0]
    assert parse_shapes([suggested]) == {"x": (1, 3, 224, 224)}  # the hint parses: no literal N


def test_a_declared_size_of_zero_is_read_as_dynamic(caplog) -> None:  # type: ignore[no-untyped-def]
    """[0, 3, 0, 8]: ONNX Runtime runs the model as declared on no data at all; loaded, the zeros are dynamic
    sizes (with a warning), the batch stays dynamic and the other needs --shapes, as any dynamic size does."""
    import onnxruntime as ort

    declared = relu_model([0, 3, 0, 8])
    x = np.ones((2, 3, 4, 8), np.float32)
    with pytest.raises(Exception, match="dimensions"):
        ort.InferenceSession(declared.SerializeToString()).run(None, {"x": x})
    with caplog.at_level(logging.WARNING):
        model = load_model(declared.SerializeToString()).model
    assert "declares size 0 in dimension(s) [0, 2]" in caplog.text
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert [d.HasField("dim_value") for d in dims] == [False, True, False, True]
    with pytest.raises(ShapeError, match=r"dimension\(s\) \[2\]"):
        require_static_shapes(graph_from_onnx(model))
    (y,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x - 2})
    assert np.array_equal(y, np.zeros_like(x))


@pytest.mark.parametrize(("dtype", "fix"), [(onnx.TensorProto.BFLOAT16, "a Cast to bfloat16 as its first node"),
                                            (onnx.TensorProto.INT32, ".npy/.npz arrays with the input's dtype")])
def test_an_image_input_of_another_type_says_what_can_feed_it(work, capsys, dtype, fix) -> None:  # type: ignore[no-untyped-def]
    """numpy has int32 (arrays can feed it) but no bfloat16 (nothing can): each error says what works."""
    model = relu_model([1, 3, 8, 8])
    model.graph.input[0].type.tensor_type.elem_type = dtype
    model.graph.output[0].type.tensor_type.elem_type = dtype
    onnx.save(model, work / "typed.onnx")
    assert main(["build", str(work / "typed.onnx"), "--int8", "--calib", str(work / "imgs"), "-o",
                 str(work / "typed.engine")]) == 2  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert f"has dtype {onnx.helper.tensor_dtype_to_string(dtype).split('.')[-1].lower()};" in err and fix in err
    assert not (work / "typed.engine").exists()


def test_labels_binary_short_or_empty(work, capsys) -> None:  # type: ignore[no-untyped-def]
    (work / "bin.txt").write_bytes(bytes(range(256)))
    (work / "short.txt").write_text("cat\ndog\n")
    (work / "empty.txt").write_text("\n\n")
    for name, message in (("bin.txt", "UTF-8"), ("short.txt", "name 2 classes"), ("empty.txt", "empty")):
        code, text = _cli(capsys, "build", work / "m.onnx", "--labels", work / name, "-o", work / "l.engine")
        assert code == 2 and message in text and "Traceback" not in text
    assert not (work / "l.engine").exists()


def test_bench_batch_too_large_for_memory(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import trtopt.memory
    from trtopt.cli.bench_cmd import random_inputs
    from trtopt.plan import TensorSpec

    monkeypatch.setattr(trtopt.memory, "available_bytes", lambda: 2**30)
    with pytest.raises(TrtoptError, match="needs about"):
        random_inputs([TensorSpec("x", (-1, 3, 224, 224), "float32")], 100_000)


def test_engine_misuse_is_a_clean_error(work) -> None:  # type: ignore[no-untyped-def]
    engine = trtopt.Engine.load(work / "p.engine")
    with pytest.raises(ShapeError, match=r"empty|\[0, 3"):  # fixed batch 1 here; dynamic plans say "empty"
        engine(np.zeros((0, 3, 32, 32), np.float32))
    for bad in (None, "cat.jpg", 5):
        with pytest.raises(DataError, match="list of images"):
            engine.preprocess(bad)
    with pytest.raises(TrtoptError, match="--threads"):
        trtopt.Engine.load(work / "p.engine", threads=-1)
    engine.close()
    engine.close()
    with pytest.raises(TrtoptError, match="closed"):
        engine(np.zeros((1, 3, 32, 32), np.float32))


@pytest.mark.parametrize(("op", "domain"), [("Foo", ""), ("NoSuchContribOp", "com.microsoft")])
def test_subgraph_ops_are_checked_like_the_main_graph(tmp_path, capsys, op, domain) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "if.onnx"
    onnx.save_model(model_with_if_branch(op, domain), path)
    for argv in (["inspect", path], ["build", path, "-o", tmp_path / "p.engine"]):
        code, text = _cli(capsys, *argv)
        assert code == 2 and "subgraph 'then'" in text and "Traceback" not in text
    assert not (tmp_path / "p.engine").exists()


# --- memory and time bombs ------------------------------------------------------------------------------


def test_strip_images_are_skipped_with_the_reason(work, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    Image.new("RGB", (30000, 1)).save(tmp_path / "strip.png")
    Image.new("RGB", (64, 64), "white").save(tmp_path / "fine.png")
    code, text = _cli(capsys, "run", work / "p.engine", tmp_path / "strip.png", tmp_path / "fine.png", "--json")
    assert code == 0
    skipped = json.loads(text[text.index("{"):])["summary"]["skipped"]
    assert [Path(s["path"]).name for s in skipped] == ["strip.png"] and "aspect ratio" in skipped[0]["reason"]


@pytest.mark.parametrize(("width", "height"), [(100_000, 100_000), (10_000, 1), (1, 30_000)])
def test_bomb_headers_are_refused_before_decoding(tmp_path: Path, width: int, height: int) -> None:
    data = png_header_only(width, height)
    (tmp_path / "bomb.png").write_bytes(data)
    for read in (lambda: read_image(tmp_path / "bomb.png"), lambda: read_image_bytes(data)):
        with pytest.raises(UnreadableFileError, match="pixels"):
            read()


def test_resize_plan_is_bounded() -> None:
    from trtopt.data import PreprocessSpec, preprocess_images

    with pytest.raises(UnreadableFileError, match="resized to"):
        preprocess_images([Image.new("RGB", (90, 1))], PreprocessSpec(crop=224, resize=8000))


def test_model_too_large_for_memory(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    onnx.save_model(relu_model([1, 3, 60000, 60000]), tmp_path / "big.onnx")
    code, text = _cli(capsys, "build", tmp_path / "big.onnx", "-o", tmp_path / "p.engine")
    assert code == 2 and "GiB" in text and "needs about" in text


@pytest.fixture(scope="module")
def service(work):  # type: ignore[no-untyped-def]
    httpd = start_service(work / "p.engine", request_timeout=1.0)
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _raw(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        (b"Content-Length: abc\r\n", b"", b"400"),
        (b"Content-Length: -5\r\n", b"", b"400"),
        (b"Content-Length: 999999999999\r\n", b"", b"413"),
        (b"Content-Length: 100\r\n", b"short", b"408"),  # the client announced more than it sends
        (b"Transfer-Encoding: chunked\r\n", b"0\r\n\r\n", b"411"),
    ],
    ids=["not-a-number", "negative", "too-large", "short-body", "chunked"],
)
def test_service_refuses_bad_requests(service, headers, body, status) -> None:  # type: ignore[no-untyped-def]
    answer = _raw(service, b"POST /predict HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + body)
    assert answer.split(b" ")[1] == status


def test_service_refuses_bombs_and_still_answers(service) -> None:  # type: ignore[no-untyped-def]
    for data in (png_header_only(100_000, 100_000), png_header_only(10_000, 1)):
        head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        answer = _raw(service, head + data)
        assert answer.split(b" ")[1] == b"400" and b"pixels" in answer
    image = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(image, "PNG")
    head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(image.getvalue())}\r\n\r\n".encode()
    assert _raw(service, head + image.getvalue()).split(b" ")[1] == b"200"


# --- plan files are input -------------------------------------------------------------------------------


def _edited(work: Path, edit: Any) -> bytes:
    header, sections = split_plan((work / "p.engine").read_bytes())
    result = edit(header, sections)
    return sealed_plan(header, sections) if result is None else result


def _set(path: list[Any], value: Any) -> Any:
    def edit(header: dict[str, Any], sections: list[bytes]) -> None:
        target = header
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        lambda h, s: h.update(sections=[]) or sealed_plan(h, []),  # no 'onnx' section
        _set(["metadata", "labels"], 5),
        _set(["metadata", "preprocess", "resize"], 100000),
        _set(["metadata", "preprocess", "crop"], [60000, 60000]),
        _set(["inputs", 0, "shape"], [1, 3, 60000, 10**12]),
        _set(["inputs", 0, "dtype"], "object"),
        _set(["sections", 0, "size"], 10**15),
        _set(["sections", 0, "sha256"], "0" * 64),
        _set(["metadata", "verification"], [1, 2]),
        _set(["metadata", "thresholds"], {"x": "big"}),
        _set(["backend"], {"x": 1}),
        lambda h, s: sealed_plan(h, [b"\x08\x0a" * 50 for _ in s]),  # garbage ONNX with the sizes kept
        lambda h, s: sealed_plan(h, s, raw_header=b"[" * 100_000 + b"]" * 100_000),
        lambda h, s: sealed_plan(h, s, raw_header=json.dumps({"backend": "cpu", "deep": _nested(40)}).encode()),
        lambda h, s: sealed_plan(h, s, raw_header=b"\xff\xfe not json"),
    ],
    ids=["no-onnx", "labels-5", "resize-100000", "crop-60000", "shape-huge", "dtype-object", "size-1e15",
         "section-digest", "verification-list", "threshold-str", "backend-dict", "garbage-onnx", "deep-json",
         "deep-metadata", "binary-header"],  # fmt: skip
)
def test_crafted_plans_are_plan_errors(work, edit) -> None:  # type: ignore[no-untyped-def]
    """Refused as reading the plan, or (a section its backend's runner needs, which the backends know) as it loads."""
    data = _edited(work, edit)
    with pytest.raises(PlanError) as info:
        trtopt.Engine(plan_from_bytes(data, "crafted.engine"))
    assert info.value.fix


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_plan_onnx_with_external_data_is_refused(work) -> None:  # type: ignore[no-untyped-def]
    def edit(header: dict[str, Any], sections: list[bytes]) -> bytes:
        model = onnx.load_model_from_string(sections[0])
        tensor = model.graph.initializer[0]
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "/etc/passwd"
        sections[0] = model.SerializeToString()
        header["sections"][0].update(size=len(sections[0]), sha256=hashlib.sha256(sections[0]).hexdigest())
        return sealed_plan(header, sections)

    with pytest.raises(PlanError, match="external"):
        plan_from_bytes(_edited(work, edit))


def test_unknown_metadata_is_kept(work) -> None:  # type: ignore[no-untyped-def]
    data = _edited(work, _set(["metadata", "future_record"], {"a": [1, 2, {"b": "c"}]}))
    plan = plan_from_bytes(data)
    assert plan.metadata.extra["future_record"] == {"a": [1, 2, {"b": "c"}]}
    assert plan.metadata.to_dict()["future_record"] == {"a": [1, 2, {"b": "c"}]}  # written back as read
    verification = read_plan(work / "p.engine").metadata.verification
    assert verification is not None and verification.isa


# --- silent wrong results -------------------------------------------------------------------------------


def test_big_endian_input_gives_the_right_answer_and_nan_warns(work, caplog) -> None:  # type: ignore[no-untyped-def]
    engine = trtopt.Engine.load(work / "p.engine")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(engine(x.astype(">f4")), engine(x))
    with caplog.at_level(logging.WARNING, logger="trtopt.engine"):
        engine(np.full_like(x, 3e38))  # finite values whose sum overflows: no warning
        assert "NaN or infinite" not in caplog.text
        for bad in (np.nan, -np.inf):
            caplog.clear()
            x[0, 0, 0, 0] = bad
            engine(x)
            assert "holds 1 NaN or infinite" in caplog.text


def test_the_finite_check_reads_float16_bits_exactly(caplog) -> None:  # type: ignore[no-untyped-def]
    """float16 inputs are checked through their bits (numpy's float16 min / max are slow): the largest finite
    values and negative zero pass; NaN, +inf and -inf anywhere, in a strided view too, warn."""
    from trtopt.engine import _checked_array

    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float16)
    x[0, 0, 0, :3] = [65504, -65504, -0.0]
    with caplog.at_level(logging.WARNING, logger="trtopt.engine"):
        _checked_array("x", x)
        _checked_array("x", x[:, ::2, :, ::3])
        assert "NaN or infinite" not in caplog.text
        for bad in (np.nan, np.inf, -np.inf):
            caplog.clear()
            y = x.copy()
            y[1, 2, 7, 6] = bad
            _checked_array("y", y[:, ::2, :, ::3])
            assert "input 'y' holds 1 NaN or infinite" in caplog.text


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_finite_check_of_float32_and_float64_is_exact(dtype: type, caplog) -> None:  # type: ignore[no-untyped-def]
    """float32 and float64 inputs are checked in one pass (a sum of squares) where that sum is finite, and again
    where it is not: values whose squares overflow pass, NaN and either infinity anywhere warn, strided views too."""
    from trtopt.engine import _checked_array

    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(dtype)
    x[0, 0, 0, :2] = [np.finfo(dtype).max, -np.finfo(dtype).max]  # squares overflow: the second check decides
    with caplog.at_level(logging.WARNING, logger="trtopt.engine"):
        _checked_array("x", x)
        _checked_array("x", x[:, ::2])
        assert "NaN or infinite" not in caplog.text
        for bad in (np.nan, np.inf, -np.inf):
            for view in (lambda a: a, lambda a: a[:, ::2]):
                caplog.clear()
                y = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(dtype)
                y[1, 2, 7, 6] = bad
                _checked_array("y", view(y))
                assert "input 'y' holds 1 NaN or infinite" in caplog.text


@pytest.mark.parametrize("bad", ["huge", "tiny", "short-means"])
def test_absurd_caches_are_refused(work, tmp_path, bad) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads((work / "c.json").read_text())
    name = next(iter(doc["thresholds"]))
    if bad == "short-means":
        name = next(iter(doc["channel_means"]))
        doc["channel_means"][name] = doc["channel_means"][name][:1]
    else:
        doc["thresholds"][name] = 1e30 if bad == "huge" else 1e-30
    (tmp_path / "c.json").write_text(json.dumps(doc))
    load_cache(tmp_path / "c.json")  # readable; it is the build that refuses it
    with pytest.raises(CalibrationError, match="wrong length" if bad == "short-means" else "outside"):
        build_plan(work / "m.onnx", _from_cache(tmp_path / "c.json"))


def test_exclude_that_matches_nothing_warns(work, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.WARNING, logger="trtopt.quant.placement"):
        build_plan(work / "m.onnx", _from_cache(work / "c.json", quant=trtopt.quant.QuantConfig(exclude=("Cnov",))))
    assert "'Cnov' matches no node" in caplog.text


@pytest.mark.parametrize(
    ("option", "value"),
    [("--threads", "-1"), ("--min-channels", "-5"), ("--opt-level", "99"), ("--workspace", "-1"), ("--batch", "0")],
)
def test_out_of_range_numbers_are_refused(work, capsys, option, value) -> None:  # type: ignore[no-untyped-def]
    command = ["run", work / "p.engine", work / "imgs"] if option == "--threads" else ["build", work / "m.onnx",
                                                                                       "-o", work / "n.engine"]
    code, text = _cli(capsys, *command, option, value)
    assert code == 2 and option in text and "Traceback" not in text


def test_check_output_probes_the_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(TrtoptError, match="Cannot write"):
        check_output(tmp_path / "file" / "x.engine")
    assert check_output(tmp_path / "new" / "x.engine") == tmp_path / "new" / "x.engine"
