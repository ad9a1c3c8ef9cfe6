"""A small HTTP inference service around `trtopt.Engine`, with the standard library only.

    python examples/http_service.py plan.engine --port 8080
    curl --data-binary @cat.jpg http://127.0.0.1:8080/predict

POST /predict with an image as the body answers JSON: the top-5 classes with probabilities. GET
/health answers {"status": "ok", ...}. One Engine is loaded at start and shared by every request
thread (ThreadingHTTPServer runs one thread per connection): Engine validates each call and its
runner is safe to call concurrently (see trtopt/engine.py).

It is meant to be copied, so it is bounded against hostile clients (issues #15 and #46):
- time: REQUEST_TIMEOUT seconds for the request line and headers (a client that sends one header line every
  few seconds is dropped), and as long again for the body (408; a slow drip cannot stretch it);
- memory: a body of at most MAX_BODY bytes with a valid Content-Length (else 400 / 411 / 413), and at most
  BODY_BUDGET bytes of bodies held at once (503 past it); an image's size is read from its header before
  anything is decoded, and one of more than MAX_PIXELS pixels is refused (400: a 280 KB PNG can hold 88 M
  pixels, 833 MB decoded); images are decoded only inside one of MAX_WORKERS inference slots, so at most
  MAX_WORKERS x MAX_PIXELS pixels are ever decoded at once (503 when the slots stay busy);
- connections: at most MAX_CONNECTIONS open at once (the next get 503 at once; slow clients cost a thread
  each, not memory, so /health stays answerable under a slow-client flood), and a listen backlog of
  LISTEN_BACKLOG, so bursts of clients wait to be accepted instead of being reset.
Images go through trtopt's reader, which refuses decompression bombs and absurd sizes (400). Whatever else goes
wrong answers 500 and is logged; no request kills the server or leaves no answer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image

import trtopt
from trtopt.data.classes import top_k
from trtopt.data.images import read_image_bytes

MAX_BODY = 20 * 2**20  # refuse uploads over 20 MiB
REQUEST_TIMEOUT = 10.0  # seconds for the request line and headers, and again for the body
MAX_WORKERS = 4  # inferences (and image decodes) at once; more wait up to REQUEST_TIMEOUT, then get 503
MAX_PIXELS = 2**24  # 16.8 M pixels per image (4096 x 4096): about 50 MB decoded as RGB
BODY_BUDGET = 4 * MAX_BODY  # bytes of request bodies held at once, over every connection
MAX_CONNECTIONS = 256  # open connections (threads) at once
LISTEN_BACKLOG = 128  # connections the kernel queues before accept (socketserver's default is 5)
log = logging.getLogger("trtopt.service")


class BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on open connections: past it, a 503 and the socket is closed."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.request_queue_size = LISTEN_BACKLOG  # read at bind time, after a test or a user changed it
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class ByteBudget:
    """A counting budget of bytes: `acquire(n)` waits until n bytes are free (up to a timeout)."""

    def __init__(self, total: int) -> None:
        self.free = total
        self.changed = threading.Condition()

    def acquire(self, size: int, timeout: float) -> bool:
        with self.changed:
            if not self.changed.wait_for(lambda: self.free >= size, timeout=timeout):
                return False
            self.free -= size
            return True

    def release(self, size: int) -> None:
        with self.changed:
            self.free += size
            self.changed.notify_all()


def pixels_in(data: bytes) -> int | None:
    """Width x height from the image's header, without decoding it (None where Pillow cannot tell)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return int(image.width) * int(image.height)
    except Exception:  # not an image, or a bomb Pillow refuses to open: trtopt's reader says which, in detail
        return None


def make_server(engine: trtopt.Engine, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """A server bound to (host, port); port 0 picks a free one (see `server.server_address`)."""
    workers = threading.BoundedSemaphore(MAX_WORKERS)
    bodies = ByteBudget(BODY_BUDGET)

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT  # socket timeout for every read (StreamRequestHandler applies it)

        def handle_one_request(self) -> None:
            """One request, whose request line and headers must arrive within REQUEST_TIMEOUT in total: the socket
            timeout covers one read, and a client sending a header line every few seconds never trips it."""
            self.header_deadline = threading.Timer(REQUEST_TIMEOUT, self._drop)
            self.header_deadline.start()
            try:
                super().handle_one_request()
            finally:
                self.header_deadline.cancel()

        def _drop(self) -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self.header_deadline.cancel()
            if self.path != "/health":
                return self._send(404, {"error": f"no route {self.path}; use POST /predict or GET /health"})
            self._send(200, {"status": "ok", "backend": engine.backend, "inputs": [t.name for t in engine.inputs]})

        def do_POST(self) -> None:  # noqa: N802
            self.header_deadline.cancel()  # the body has its own deadline (_read_body)
            try:
                self._predict()
            except TimeoutError:
                self._send(408, {"error": f"the request took longer than {REQUEST_TIMEOUT:g} s"})
            except MemoryError:
                self._send(503, {"error": "out of memory for this request; try a smaller image"})
            except Exception:  # the answer must never be a dropped connection
                log.exception("unexpected error in POST %s", self.path)
                self._send(500, {"error": "internal error; see the service log"})

        def _predict(self) -> None:
            if self.path != "/predict":
                return self._send(404, {"error": f"no route {self.path}; POST an image to /predict"})
            if self.headers.get("Transfer-Encoding"):
                return self._send(411, {"error": "send the image with a Content-Length, not chunked"})
            raw = (self.headers.get("Content-Length") or "").strip()
            if not raw.isdigit():
                return self._send(400, {"error": f"Content-Length must be a byte count, got {raw[:40]!r}"})
            length = int(raw)
            if length > MAX_BODY:
                return self._send(413, {"error": f"the body is {length} bytes; the limit is {MAX_BODY}"})
            if length == 0:
                return self._send(400, {"error": f"send an image body of 1 byte to {MAX_BODY} bytes"})
            if not bodies.acquire(length, REQUEST_TIMEOUT):
                return self._send(503, {"error": "the service is busy receiving other images; retry shortly"})
            try:
                self._answer(self._read_body(length))
            finally:
                bodies.release(length)

        def _answer(self, body: bytes) -> None:
            pixels = pixels_in(body)
            if pixels is not None and pixels > MAX_PIXELS:
                return self._send(400, {"error": f"the image has {pixels:,} pixels; this service decodes at most "
                                                 f"{MAX_PIXELS:,} per image"})  # fmt: skip
            if not workers.acquire(timeout=REQUEST_TIMEOUT):
                return self._send(503, {"error": "the service is busy; retry shortly"})
            try:  # decoded inside the slot: at most MAX_WORKERS images in memory at once
                image = read_image_bytes(body, "in the request body")
                logits = engine(engine.preprocess([image]))
            except trtopt.TrtoptError as exc:
                return self._send(400, {"error": f"the body is not a readable image ({exc})"})
            finally:
                workers.release()
            top = [p.__dict__ for p in top_k(logits, 5, engine.labels)[0]]
            self._send(200, {"top": top})

        def _read_body(self, length: int) -> bytes:
            """Exactly `length` bytes within REQUEST_TIMEOUT in total (a slow drip cannot stretch it)."""
            deadline = time.monotonic() + REQUEST_TIMEOUT
            chunks, received = [], 0
            while received < length:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(length - received, 2**16))
                if not chunk:
                    raise TimeoutError  # the client closed before sending what it announced
                chunks.append(chunk)
                received += len(chunk)
            return b"".join(chunks)

        def log_message(self, format: str, *args: Any) -> None:  # route to logging, not stderr
            log.info(format, *args)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status >= 400:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client went away: nothing left to answer
                self.close_connection = True

    return BoundedServer((host, port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a trtopt plan over HTTP.")
    parser.add_argument("plan", help="plan file from `trtopt build`")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads per inference")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    server = make_server(trtopt.Engine.load(args.plan, threads=args.threads), args.host, args.port)
    print(f"serving {args.plan} on http://{args.host}:{server.server_address[1]} (POST /predict)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
