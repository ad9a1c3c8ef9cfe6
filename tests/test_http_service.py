"""The README's service example: start it on localhost, send real photos concurrently, check answers."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import trtopt

ROOT = Path(__file__).resolve().parents[1]


def _load_example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("http_service", ROOT / "examples" / "http_service.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def server(demo_plan: Path):  # type: ignore[no-untyped-def]
    httpd = _load_example().make_server(trtopt.Engine.load(demo_plan), "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_health(server: str) -> None:
    with urllib.request.urlopen(f"{server}/health", timeout=30) as response:
        assert json.loads(response.read()) == {"status": "ok", "backend": "cpu", "inputs": ["input"]}


def test_concurrent_predictions_are_right(server: str) -> None:
    photos = {
        "skimage_chelsea.jpg": {"tabby", "tiger cat", "Egyptian cat"},
        "skimage_coffee.jpg": {"espresso", "cup", "coffee mug"},
    }
    jobs = [name for name in photos for _ in range(6)]
    heldout = ROOT / "tests" / "data" / "heldout"
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda n: _post(f"{server}/predict", (heldout / n).read_bytes()), jobs))
    for name, (status, body) in zip(jobs, answers, strict=True):
        assert status == 200
        labels = [p["label"] for p in body["top"]]
        assert len(labels) == 5 and photos[name] & set(labels), (name, labels)
    first = {n: a for n, a in zip(jobs, answers, strict=True)}
    assert all(a == first[n] for n, a in zip(jobs, answers, strict=True))  # same photo, same answer


def test_bad_requests_get_400(server: str) -> None:
    status, body = _post(f"{server}/predict", b"this is not an image")
    assert status == 400 and "not a readable image" in body["error"]
    status, body = _post(f"{server}/nowhere", b"x")
    assert status == 404
