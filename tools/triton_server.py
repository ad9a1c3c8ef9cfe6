"""Start and stop a local Triton Inference Server (from tools/triton_env.py) for tests and benchmarks.

    with TritonServer(find_server(), repo, workdir) as server:
        server.http_url, server.grpc_url, server.metrics_url

It listens on 127.0.0.1 only, on three free ports, with the repository's configurations taken as written
(`--disable-auto-complete-config`: a config that Triton would have to complete is an error) and every
model required to load (`--exit-on-error`, `--strict-readiness`). Start waits for /v2/health/ready within
a timeout; when the server exits or the timeout passes, the error carries the end of its log. Stop sends
SIGTERM to the server's process group (the server and its Python stubs), waits, then SIGKILLs it; the
child also gets SIGTERM should this process die first (prctl PR_SET_PDEATHSIG, as PyTriton does).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from triton_env import ServerDist

START_TIMEOUT = 120.0  # seconds: loading a model starts a stub process and the plan's runtime
STOP_TIMEOUT = 20.0


class ServerError(RuntimeError):
    """The server did not come up (or went down); the message ends with its log."""


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now (bound to port 0 together, then released)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class TritonServer:
    def __init__(
        self,
        dist: ServerDist,
        repo: Path,
        workdir: Path,
        *,
        timeout: float = START_TIMEOUT,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.dist, self.repo, self.workdir, self.timeout, self.extra_args = dist, repo, workdir, timeout, extra_args
        self.log_path = workdir / "tritonserver.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        backends = self.dist.backend_directory(self.workdir / "backends")
        for attempt in range(3):  # a port taken between free_ports() and the server's bind: try new ones
            self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
            self._launch(backends)
            try:
                self._wait_ready()
                return
            except ServerError as exc:
                self.stop()
                if attempt == 2 or "already in use" not in str(exc):
                    raise

    def _launch(self, backends: Path) -> None:
        args = [
            str(self.dist.binary), f"--model-repository={self.repo}", f"--backend-directory={backends}",
            "--http-address=127.0.0.1", f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false", "--disable-auto-complete-config", "--exit-on-error=true",
            "--strict-readiness=true", "--exit-timeout-secs=10", "--log-verbose=0",
            f"--cache-directory={self.workdir / 'caches'}", *self.extra_args,
        ]  # fmt: skip
        libs = [str(self.dist.libs), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libs)}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=self.workdir, start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise ServerError(f"tritonserver exited with code {self.process.returncode}.\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise ServerError(f"tritonserver was not ready within {self.timeout:.0f} s.\n{self.log_tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # the stubs share the server's group: none may outlive it
            os.killpg(process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no server log)"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text.splitlines()[-lines:])
