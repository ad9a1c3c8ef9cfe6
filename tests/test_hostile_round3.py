"""Issue #46 (hostile input, round 3), the findings fixed so far: files a run reads reached through indirect paths
(a model's external data, the images of a data folder) are never written; FIFOs in data folders neither hang a run
nor are read; numbers out of a consumer's range and a decoder that exits are clean errors, not tracebacks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import onnx
import pytest
from model_files import tiny_model_with_images

from trtopt.cli.main import main
from trtopt.zoo import build_model


def _cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def _contents(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """tiny.onnx with its weights in weights.bin, and 6 images in images/."""
    tiny_model_with_images(tmp_path, 6)
    onnx.save_model(build_model("tiny_cnn", seed=1), tmp_path / "tiny.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)  # fmt: skip
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["optimize", "{d}/tiny.onnx", "-o", "{d}/weights.bin"],
        ["build", "{d}/tiny.onnx", "-o", "{d}/weights.bin"],
        ["calibrate", "{d}/tiny.onnx", "--calib", "{d}/images", "-o", "{d}/images/img03.png"],
        ["build", "{d}/tiny.onnx", "--int8", "--calib", "{d}/images", "--save-cache", "{d}/images/img00.png",
         "-o", "{d}/p.engine"],
        ["build", "{d}/tiny.onnx", "--int8", "--calib", "{d}/images", "--verify-data", "{d}/images",
         "-o", "{d}/images/sub/../img01.png"],
    ],
    ids=["optimize-onto-external-data", "build-onto-external-data", "calibrate-onto-an-image",
         "save-cache-onto-an-image", "output-onto-a-verification-image"],  # fmt: skip
)
def test_a_file_the_run_reads_is_never_written(work: Path, capsys, argv) -> None:  # type: ignore[no-untyped-def]
    (work / "images" / "sub").mkdir()
    before = _contents(work)
    code, text = _cli(capsys, *[a.format(d=work) for a in argv])
    assert code == 2 and "Traceback" not in text, text
    assert "same file" in text or "a file the run reads" in text
    assert _contents(work) == before


def test_a_link_in_the_data_folder_to_the_output_is_refused(work: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    outside = work / "elsewhere.png"
    outside.write_bytes((work / "images" / "img00.png").read_bytes())
    os.symlink(outside, work / "images" / "linked.png")
    code, text = _cli(capsys, "calibrate", work / "tiny.onnx", "--calib", work / "images", "-o", outside)
    assert code == 2 and "a file the run reads" in text
    assert outside.read_bytes() == (work / "images" / "img00.png").read_bytes()


def test_a_fifo_in_a_data_folder_is_skipped_and_a_fifo_named_is_refused(work: Path, capsys, caplog) -> None:  # type: ignore[no-untyped-def]
    os.mkfifo(work / "images" / "pipe.png")  # opening it would wait for a writer forever
    code, text = _cli(capsys, "calibrate", work / "tiny.onnx", "--calib", work / "images", "-o", work / "c.json")
    assert code == 0 and (work / "c.json").is_file(), text
    assert "pipe.png: not a regular file" in caplog.text
    code, text = _cli(capsys, "calibrate", work / "tiny.onnx", "--calib", work / "images" / "pipe.png",
                      "-o", work / "d.json")  # fmt: skip
    assert code == 2 and "not a regular file" in text and not (work / "d.json").exists()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("model_fingerprint", "12345", "model_fingerprint of type int"),
    ("version", "9" * 5001, "is not a calibration cache trtopt reads"),  # beyond Python's 4300-digit limit
])
def test_a_cache_with_numbers_where_they_do_not_belong_is_refused(
    work: Path, capsys, field: str, value: str, message: str
) -> None:  # type: ignore[no-untyped-def]
    code, _ = _cli(capsys, "calibrate", work / "tiny.onnx", "--calib", work / "images", "-o", work / "c.json")
    assert code == 0
    doc = json.loads((work / "c.json").read_text())
    doc[field] = "NUMBER"
    (work / "bad.json").write_text(json.dumps(doc).replace('"NUMBER"', value))
    code, text = _cli(capsys, "build", work / "tiny.onnx", "--int8", "--calib-cache", work / "bad.json",
                      "-o", work / "p.engine")  # fmt: skip
    assert code == 2 and message in text and "Traceback" not in text and not (work / "p.engine").exists()


@pytest.fixture
def plan(work: Path, capsys) -> Path:  # type: ignore[no-untyped-def]
    code, text = _cli(capsys, "build", work / "tiny.onnx", "-o", work / "p.engine")
    assert code == 0, text
    return work / "p.engine"


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "{p}", "--min-seconds", "-5"], "--min-seconds must be a finite number"),
    (["bench", "{p}", "--min-seconds", "nan"], "--min-seconds must be a finite number"),
    (["export", "{p}", "--triton", "{d}/repo", "--max-batch", "99999999999"], "--max-batch is 99999999999"),
    (["export", "{p}", "--triton", "{d}/repo", "--preferred-batch", "4294967296"], "--preferred-batch is"),
])
def test_numbers_out_of_the_consumers_range_are_refused(work: Path, plan: Path, capsys, argv, message) -> None:  # type: ignore[no-untyped-def]
    code, text = _cli(capsys, *[a.format(p=plan, d=work) for a in argv])
    assert code == 2 and message in text and "Traceback" not in text
    assert not (work / "repo").exists()


def test_a_decoder_that_exits_makes_compare_fail(work: Path, plan: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bodies = {"at_import": "import sys\nsys.exit(0)\ndef decode(outputs):\n    return []\n",
              "when_called": "import sys\ndef decode(outputs):\n    sys.exit(0)\n"}
    for name, body in bodies.items():
        (work / f"{name}.py").write_text(body)
        code, text = _cli(capsys, "compare", work / "tiny.onnx", plan, "--data", work / "images",
                          "--decoder", f"{work / name}.py:decode")  # fmt: skip
        assert code != 0 and "sys.exit(0)" in text and "Traceback" not in text, (name, text)


def test_a_nul_byte_in_an_external_data_location_is_a_clean_error(work: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(str(work / "tiny.onnx"), load_external_data=False)
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "weights\x00.bin"
    onnx.save(model, str(work / "nul.onnx"))
    for command in (["inspect", work / "nul.onnx"], ["optimize", work / "nul.onnx", "-o", work / "o.onnx"]):
        code, text = _cli(capsys, *command)
        assert code == 2 and "not a file name inside the model's folder" in text and "Traceback" not in text
    assert not (work / "o.onnx").exists()


def test_a_plan_header_naming_outputs_its_model_lacks_is_refused(plan: Path) -> None:
    from hostile_files import sealed_plan, split_plan

    from trtopt.errors import PlanError
    from trtopt.plan import read_plan

    header, sections = split_plan(plan.read_bytes())
    header["outputs"][0]["name"] = "nope"
    plan.write_bytes(sealed_plan(header, sections))  # every checksum recomputed, as an editor would
    with pytest.raises(PlanError, match=r"makes outputs \['logits'\], the header lists \['nope'\]"):
        read_plan(plan)


def test_a_keyed_plan_refuses_forgery_and_other_keys(work: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """TRTOPT_PLAN_KEY at build signs the plan; at load it admits only plans that key signed (issue #46: a header
    rewritten with consistent checksums dropped the preprocessing and labels, and ran with exit 0)."""
    from hostile_files import sealed_plan, split_plan

    from trtopt.errors import PlanError
    from trtopt.plan import read_plan
    from trtopt.plan.signing import SIGNATURE_MAGIC

    monkeypatch.setenv("TRTOPT_PLAN_KEY", "build-server-key")
    code, text = _cli(capsys, "build", work / "tiny.onnx", "-o", work / "signed.engine")
    assert code == 0, text
    signed = (work / "signed.engine").read_bytes()
    assert signed[-40:-32] == SIGNATURE_MAGIC and read_plan(work / "signed.engine").outputs
    header, sections = split_plan(signed[:-40])
    header["metadata"]["labels"] = ["bison"] * 10 if header["metadata"].get("labels") is None else None
    forged = sealed_plan(header, sections)
    (work / "forged.engine").write_bytes(forged + signed[-40:])  # the old signature kept
    with pytest.raises(PlanError, match="does not verify"):
        read_plan(work / "forged.engine")
    (work / "unsigned.engine").write_bytes(forged)
    with pytest.raises(PlanError, match="is not signed"):
        read_plan(work / "unsigned.engine")
    monkeypatch.setenv("TRTOPT_PLAN_KEY", "another-key")
    with pytest.raises(PlanError, match="does not verify"):
        read_plan(work / "signed.engine")
    monkeypatch.delenv("TRTOPT_PLAN_KEY")
    assert read_plan(work / "signed.engine").outputs and read_plan(work / "unsigned.engine").outputs


# --- the HTTP service example under load: many clients, slow clients, bombs (loopback only, bounded) ---------


@pytest.fixture
def service(plan: Path):  # type: ignore[no-untyped-def]
    from hostile_files import start_service

    httpd = start_service(plan, request_timeout=1.0)
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _request(port: int, data: bytes, timeout: float = 20.0) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _png(size: int = 48) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), "red").save(buffer, "PNG")
    return buffer.getvalue()


def _post(port: int, body: bytes) -> bytes:
    return _request(port, f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


def test_slow_header_clients_are_dropped_and_health_keeps_answering(service) -> None:  # type: ignore[no-untyped-def]
    """30 clients that send a header line every 0.3 s (issue #46: they held their connections forever, and 70 of
    them made /health answer 503): each is dropped after the header deadline, and /health answers meanwhile."""
    import socket
    import time
    from concurrent.futures import ThreadPoolExecutor

    port = service.server_address[1]

    def slow_client() -> bool:
        """Whether the server dropped it before it had sent 100 header lines (30 s, 30 times the deadline)."""
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /predict HTTP/1.1\r\n")
            try:
                for i in range(100):
                    sock.sendall(f"X-Slow-{i}: 1\r\n".encode())
                    time.sleep(0.3)
            except OSError:
                return True  # the server closed the connection: what the test waits for
        return False

    with ThreadPoolExecutor(max_workers=30) as pool:
        slow = [pool.submit(slow_client) for _ in range(30)]
        time.sleep(0.5)
        health = [_request(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") for _ in range(5)]
        dropped = [f.result(timeout=120) for f in slow]
    assert all(answer.split(b" ")[1] == b"200" for answer in health)
    assert all(dropped)  # by the 1 s header deadline; no verdict on how soon, which is the machine's load


def test_many_clients_at_once_all_get_answers(service) -> None:  # type: ignore[no-untyped-def]
    """40 clients, 3 images each, at once (issue #46: with a backlog of 5, 11 of 160 requests were reset)."""
    from concurrent.futures import ThreadPoolExecutor

    port, body = service.server_address[1], _png()
    assert service.request_queue_size >= 128
    with ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda _: _post(port, body), range(120)))
    assert [a.split(b" ")[1] for a in answers] == [b"200"] * 120


def test_a_pixel_bomb_is_refused_before_it_is_decoded(service) -> None:  # type: ignore[no-untyped-def]
    """A PNG that declares 9400 x 9400 pixels (88 M, under Pillow's bomb limit; 833 MB decoded) is refused from
    its header, while valid requests go on being answered."""
    from hostile_files import png_header_only

    port = service.server_address[1]
    answer = _post(port, png_header_only(9400, 9400))
    assert answer.split(b" ")[1] == b"400" and b"88,360,000 pixels" in answer
    assert _post(port, _png()).split(b" ")[1] == b"200"


# --- writes that fail: a file-size limit (ulimit -f) stands in for a full disk --------------------------------


def _under_file_size_limit(*argv: Any, limit: int = 20_000) -> Any:
    import resource
    import signal
    import subprocess
    import sys

    def limit_writes() -> None:  # in the child: files stop at `limit` bytes, and writing past it fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return subprocess.run([sys.executable, "-m", "trtopt", *map(str, argv)], capture_output=True, text=True,
                          preexec_fn=limit_writes, timeout=300)  # fmt: skip


def test_a_triton_export_that_cannot_be_written_leaves_nothing(work: Path, plan: Path) -> None:
    done = _under_file_size_limit("export", plan, "--triton", work / "repo" / "deep")
    assert done.returncode == 2 and "ulimit -f" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (work / "repo").exists()  # not even the folders it created


def test_a_build_that_cannot_write_its_plan_says_why_and_keeps_the_old_one(work: Path, plan: Path) -> None:
    before = plan.read_bytes()
    done = _under_file_size_limit("build", work / "tiny.onnx", "-o", plan)
    assert done.returncode == 2 and "ulimit -f" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert plan.read_bytes() == before


def test_inspect_of_a_model_whose_weights_file_was_overwritten_is_a_clean_error(work: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """What the old `optimize -o weights.bin` left behind (issue #46): a weights file holding something else."""
    (work / "weights.bin").write_bytes(build_model("tiny_cnn", seed=2).SerializeToString()[:1000])
    for command in (["inspect", work / "tiny.onnx"], ["optimize", work / "tiny.onnx", "-o", work / "o.onnx"]):
        code, text = _cli(capsys, *command)
        assert code == 2 and "weights.bin" in text and "Traceback" not in text, text
