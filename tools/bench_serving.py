#!/usr/bin/env python3
"""Serving the demo plan: throughput and p50/p99 latency against concurrent clients, in three ways.

    python tools/bench_serving.py [--concurrency 1 4 16] [--seconds 5] [--out docs/benchmarks/serving.md]

- **in-process Engine**: client threads call `engine(engine.preprocess([jpeg_bytes]))` on one shared Engine
  (1 intra-op thread per call): the floor any service adds to.
- **stdlib example**: examples/http_service.py in its own process (1 intra-op thread, at most 4 inferences at
  a time), one HTTP POST per photo.
- **Triton**: Triton 2.51.0 from nvidia-pytriton (tools/triton_env.py) serving the plan exported with
  `trtopt export --triton` as a Python-backend model, 2 instances of 1 intra-op thread each, max_batch_size 8,
  with dynamic batching off and on (--queue-delay-us), over HTTP and gRPC with tritonclient. "mean batch" is
  the batch size Triton executed on average (nv_inference_count / nv_inference_exec_count).

Every request is one encoded photo from calib_data/ (decoded and preprocessed by the server, as the plan
says). Clients are closed loops (send, wait, send again) on threads of this process, so they share the
machine's CPUs with the server: on a 2-core machine the numbers are per replica of that size, client cost
included, and noisy (the section records the load average).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_setup import CALIB_DIR, DEMO_MODEL  # noqa: E402
from benchlib import emit, header_lines, load_average  # noqa: E402
from triton_env import TRITON_VERSION, find_server, stub_env  # noqa: E402
from triton_server import TritonServer, free_ports  # noqa: E402

import trtopt  # noqa: E402

Call = Callable[[bytes], Any]


@dataclass(frozen=True)
class System:
    name: str
    batching: str
    make_call: Callable[[], Call]
    counts: Callable[[], tuple[float, float]] | None = None  # Triton's (samples, executions) so far


@dataclass
class Point:
    system: str
    batching: str
    clients: int
    throughput: float  # requests (= images) per second
    p50_ms: float
    p99_ms: float
    mean_batch: float | None = None


def measure(
    make_call: Callable[[], Call], photos: list[bytes], clients: int, seconds: float, warmup: float
) -> tuple[float, float, float]:
    """Closed-loop clients for warmup + seconds; latencies of requests that started after the warmup."""
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + seconds
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []

    def client(index: int) -> None:
        call, i = make_call(), index
        try:
            while (now := time.perf_counter()) < stop_at:
                call(photos[i % len(photos)])
                i += clients
                if now >= measure_from:
                    latencies[index].append(time.perf_counter() - now)
        except BaseException as exc:  # reported below: a benchmark must not count failures as answers
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}")
    done = [x for per_client in latencies for x in per_client]
    return len(done) / max(time.perf_counter() - measure_from, 1e-9), done


def work_split(plan: Path, photos: list[bytes]) -> tuple[float, float]:
    """Median ms per photo, on one thread, of what every server does per request: decode + preprocess, and
    inference at batch 1 (interleaved, so load from other jobs falls on both alike)."""
    engine = trtopt.Engine.load(plan, threads=1)
    pre, infer = [], []
    for data in photos:
        t0 = time.perf_counter()
        x = engine.preprocess([data])
        t1 = time.perf_counter()
        engine(x)
        pre.append(t1 - t0)
        infer.append(time.perf_counter() - t1)
    engine.close()
    return 1000 * statistics.median(pre), 1000 * statistics.median(infer)


def engine_calls(plan: Path) -> Callable[[], Call]:
    engine = trtopt.Engine.load(plan, threads=1)
    return lambda: lambda data: engine(engine.preprocess([data]))


def stdlib_calls(url: str) -> Callable[[], Call]:
    def make() -> Call:
        def call(data: bytes) -> Any:
            request = urllib.request.Request(f"{url}/predict", data=data, method="POST")
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())

        return call

    return make


def triton_calls(url: str, model: str, protocol: str) -> Callable[[], Call]:
    module: Any = __import__(f"tritonclient.{protocol}", fromlist=["InferInput"])

    def make() -> Call:
        client = module.InferenceServerClient(url)

        def call(data: bytes) -> Any:
            images = module.InferInput("IMAGE", [1, 1], "BYTES")
            images.set_data_from_numpy(np.array([[data]], dtype=object))
            return client.infer(model, [images]).as_numpy("logits")

        return call

    return make


def start_stdlib(plan: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_ports(1)[0]
    command = [
        sys.executable,
        str(ROOT / "examples" / "http_service.py"),
        str(plan),
        "--port",
        str(port),
        "--threads",
        "1",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("examples/http_service.py did not answer /health within 60 s")


def batch_counts(server: TritonServer, model: str) -> tuple[float, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("nv_inference_count", "nv_inference_exec_count"):
            if line.startswith(name + "{") and f'model="{model}"' in line:
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["nv_inference_count"], values["nv_inference_exec_count"]


def export_models(plan: Path, repo: Path, env: Path, args: argparse.Namespace) -> None:
    from trtopt.serving.triton import TritonOptions, export_triton

    common = {"instances": args.instances, "threads": 1, "max_batch": 8, "python_env": str(env)}
    export_triton(plan, repo, TritonOptions(name="batching_off", dynamic_batching=False, **common))  # type: ignore[arg-type]
    export_triton(plan, repo, TritonOptions(name="batching_on", queue_delay_us=args.queue_delay_us, **common))  # type: ignore[arg-type]


def systems(plan: Path, work: Path, stack: contextlib.ExitStack, args: argparse.Namespace) -> list[System]:
    """Start the servers (closed by `stack`) and return every (system, batching) to measure."""
    process, url = start_stdlib(plan)
    stack.callback(lambda: (process.terminate(), process.wait(timeout=30)))
    dist = find_server()
    export_models(plan, work / "repo", stub_env(work / "stub-env", dist), args)
    server = stack.enter_context(TritonServer(dist, work / "repo", work))
    found = [
        System("in-process Engine", "-", engine_calls(plan)),
        System("stdlib example (HTTP)", "-", stdlib_calls(url)),
    ]
    for model, batching in (("batching_off", "off"), ("batching_on", "on")):
        for protocol, address in (("http", server.http_url), ("grpc", server.grpc_url)):
            name = f"Triton ({'HTTP' if protocol == 'http' else 'gRPC'})"
            counts = functools.partial(batch_counts, server, model)
            found.append(System(name, batching, triton_calls(address, model, protocol), counts))
    return found


def run_all(plan: Path, work: Path, photos: list[bytes], args: argparse.Namespace) -> list[Point]:
    """Every point `--rounds` times, round-robin over the systems, so that load from other jobs on a shared
    machine falls on all of them alike; per point: median throughput, latency percentiles over all rounds."""
    with contextlib.ExitStack() as stack:
        measured = systems(plan, work, stack, args)
        runs: dict[tuple[int, int], list[tuple[float, list[float], float | None]]] = {}
        for round_ in range(args.rounds):
            for k, system in enumerate(measured):
                for clients in args.concurrency:
                    before = system.counts() if system.counts else None
                    rate, latencies = measure(system.make_call, photos, clients, args.seconds, args.warmup)
                    after = system.counts() if system.counts else None
                    batch = (after[0] - before[0]) / max(after[1] - before[1], 1) if before and after else None
                    runs.setdefault((k, clients), []).append((rate, latencies, batch))
                    print(f"round {round_ + 1}: {system.name} {system.batching} x{clients}: {rate:.1f}/s",
                          file=sys.stderr, flush=True)  # fmt: skip
    return [point(measured[k], clients, results) for (k, clients), results in runs.items()]


def point(system: System, clients: int, results: list[tuple[float, list[float], float | None]]) -> Point:
    latencies = sorted(x for _, lat, _ in results for x in lat)
    batches = [b for _, _, b in results if b is not None]
    p50, p99 = (1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))] for q in (0.5, 0.99))
    rate = statistics.median(r for r, _, _ in results)
    return Point(system.name, system.batching, clients, rate, p50, p99, statistics.mean(batches) if batches else None)


def table(points: list[Point], concurrency: list[int]) -> list[str]:
    head = (
        "| system | dynamic batching | "
        + " | ".join(f"{c} client{'s' if c > 1 else ''}: req/s, p50 / p99 ms" for c in concurrency)
        + " |"
    )
    lines = [head, "|---|---|" + "---:|" * len(concurrency)]
    rows: dict[tuple[str, str], dict[int, Point]] = {}
    for p in points:
        rows.setdefault((p.system, p.batching), {})[p.clients] = p
    for (system, batching), by_clients in rows.items():
        cells = []
        for c in concurrency:
            p = by_clients[c]
            batch = f", batch {p.mean_batch:.1f}" if p.mean_batch is not None else ""
            cells.append(f"{p.throughput:.1f}, {p.p50_ms:.0f} / {p.p99_ms:.0f}{batch}")
        lines.append(f"| {system} | {batching} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", type=Path, help="a CPU plan of an image model (default: build the demo plan)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per point and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all points (round-robin)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each point")
    parser.add_argument("--instances", type=int, default=2, help="Triton model instances (1 intra-op thread each)")
    parser.add_argument("--queue-delay-us", type=int, default=2000, help="dynamic batching: max queue delay")
    parser.add_argument("--photos", type=int, default=64, help="calib_data/ photos to cycle through")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    photos = [p.read_bytes() for p in sorted(CALIB_DIR.glob("*.jpg"))[: args.photos]]
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        plan = args.plan or build_demo_plan(work)
        split = work_split(plan, photos)
        points = run_all(plan, work, photos, args)
    lines = [
        "## Serving: throughput and latency against concurrent clients (in-process, stdlib HTTP, Triton)",
        "",
        *header_lines("tools/bench_serving.py", sys.argv[1:]),
        f"- server: Triton {TRITON_VERSION} (nvidia-pytriton 0.7.0), Python backend running the plan through "
        f"trtopt.Engine, {args.instances} instances x 1 intra-op thread, max_batch_size 8, queue delay "
        f"{args.queue_delay_us} us when batching; stdlib example: 1 intra-op thread, up to 4 inferences at once",
        f"- workload: {len(photos)} calib_data/ JPEGs (256 px short side) sent one per request, closed-loop clients "
        f"on threads of the benchmark process, {args.warmup:g} s warm-up + {args.seconds:g} s per point, "
        f"{args.rounds} rounds round-robin over all points (req/s: median of the rounds; p50/p99: over all "
        f"rounds' requests; batch: mean); 1-minute "
        f"load average {load_before} before, {load_average()} after (the machine is shared: expect noise)",
        "",
        *table(points, args.concurrency),
        "",
        f"Per photo on one thread, in-process (median over the {len(photos)} photos): decode + preprocess "
        f"{split[0]:.1f} ms, inference {split[1]:.1f} ms: the work every system above does per request.",
        "",
    ]
    emit("\n".join(lines), args.out)


def build_demo_plan(work: Path) -> Path:
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data.config import DataConfig
    from trtopt.plan import write_plan

    result = build_plan(DEMO_MODEL, BuildConfig(backend="cpu", data=DataConfig(sources=(str(CALIB_DIR),))))
    return write_plan(result.plan, work / "demo.engine")


if __name__ == "__main__":
    main()
