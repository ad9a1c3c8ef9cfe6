"""A small HTTP inference service around `trtopt.Engine`, with the standard library only.

    python examples/http_service.py plan.engine --port 8080
    curl --data-binary @cat.jpg http://127.0.0.1:8080/predict

POST /predict with an image as the body answers JSON: the top-5 classes with probabilities. GET
/health answers {"status": "ok", ...}. One Engine is loaded at start and shared by every request
thread (ThreadingHTTPServer runs one thread per connection): Engine validates each call and its
runner is safe to call concurrently (see trtopt/engine.py). Bad requests get a 400 with the reason.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image, UnidentifiedImageError

import trtopt
from trtopt.classify import top_k

MAX_BODY = 20 * 2**20  # refuse uploads over 20 MiB


def make_server(engine: trtopt.Engine, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """A server bound to (host, port); port 0 picks a free one (see `server.server_address`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path != "/health":
                return self._send(404, {"error": f"no route {self.path}; use POST /predict or GET /health"})
            self._send(200, {"status": "ok", "backend": engine.backend, "inputs": [t.name for t in engine.inputs]})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/predict":
                return self._send(404, {"error": f"no route {self.path}; POST an image to /predict"})
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                return self._send(400, {"error": f"send an image body of 1 byte to {MAX_BODY} bytes, got {length}"})
            try:
                image = Image.open(io.BytesIO(self.rfile.read(length)))
                image.load()
            except (UnidentifiedImageError, OSError) as exc:
                return self._send(400, {"error": f"the body is not a readable image ({exc})"})
            try:
                logits = engine(engine.preprocess([image]))
            except trtopt.TrtoptError as exc:
                return self._send(400, {"error": str(exc)})
            top = [p.__dict__ for p in top_k(logits, 5, engine.labels)[0]]
            self._send(200, {"top": top})

        def log_message(self, format: str, *args: Any) -> None:  # route to logging, not stderr
            logging.getLogger("trtopt.service").info(format, *args)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return ThreadingHTTPServer((host, port), Handler)


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
