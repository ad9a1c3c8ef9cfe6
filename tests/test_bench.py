"""trtopt.bench's statistics (trtexec's percentile rule) and the `trtopt bench` command, with fakes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pytest

import trtopt
from trtopt.bench import measure, median, percentile, summarize
from trtopt.cli import bench_cmd
from trtopt.cli.main import main
from trtopt.errors import TrtoptError


def test_percentile_follows_trtexec_float32_rule() -> None:
    timings = [float(i) for i in range(1, 101)]  # 1..100 ms
    # exclude = int(float32(1 - 0.99) * 100) = 0 -> the maximum (float64 would give 1 -> 99).
    assert percentile(timings, 99) == 100.0
    assert percentile(timings, 90) == 90.0  # exclude = int((1 - 0.9f) * 100) = int(10.000002) = 10 -> t[89]
    assert percentile(timings, 0) == 1.0
    assert percentile(timings, 100) == 100.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) == float("inf")
    with pytest.raises(ValueError):
        percentile(timings, 101)


def test_median_averages_the_middle_pair() -> None:
    assert median([1.0, 2.0, 3.0]) == 2.0
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5


def test_summarize_throughput_is_samples_per_wall_second() -> None:
    result = summarize(8, [2.0, 1.0, 3.0, 2.0], wall_s=0.01)
    assert (result.p50_ms, result.min_ms, result.max_ms, result.mean_ms) == (2.0, 1.0, 3.0, 2.0)
    assert result.throughput == pytest.approx(8 * 4 / 0.01)


class FakeClock:
    """A timer that advances by the cost the fake model declares for each call."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_measure_uses_the_injected_timer_and_counts_calls() -> None:
    clock = FakeClock()
    calls: list[int] = []

    def fn(inputs: Mapping[str, np.ndarray]) -> None:
        batch = inputs["x"].shape[0]
        calls.append(batch)
        clock.now += 0.001 * batch  # 1 ms per sample

    results = measure(fn, lambda b: {"x": np.zeros((b, 3))}, [1, 4], warmup=2, iterations=5, timer=clock)
    assert calls == [1] * 7 + [4] * 7
    assert [r.batch for r in results] == [1, 4]
    assert results[1].p50_ms == pytest.approx(4.0) and results[1].p99_ms == pytest.approx(4.0)
    assert results[1].throughput == pytest.approx(1000.0)  # 4 samples per 4 ms


def test_measure_takes_latency_reported_by_the_function() -> None:
    """A float return value is the call's own (e.g. CUDA-event) latency in ms."""
    reported = iter([0.5, 1.5, 1.0])
    clock = FakeClock()

    def fn(_: object) -> float:
        clock.now += 0.01
        return next(reported)

    [result] = measure(fn, lambda b: {}, [2], warmup=0, iterations=3, timer=clock)
    assert (result.min_ms, result.p50_ms, result.max_ms) == (0.5, 1.0, 1.5)
    assert result.throughput == pytest.approx(2 * 3 / 0.03)


def test_measure_runs_at_least_min_seconds() -> None:
    clock = FakeClock()

    def fn(_: object) -> None:
        clock.now += 0.25

    [result] = measure(fn, lambda b: {}, [1], warmup=0, iterations=2, min_seconds=1.0, timer=clock)
    assert result.iterations == 4


@dataclass(frozen=True)
class Spec:
    name: str
    shape: tuple[int, ...]
    dtype: str


class FakeEngine:
    backend = "cpu"
    timing = "host"
    inputs = (Spec("x", (-1, 3, 4, 4), "float32"), Spec("ids", (-1, 2), "int64"))
    loaded: list[FakeEngine] = []

    def __init__(self) -> None:
        self.closed = False

    @classmethod
    def load(cls, path: object, *, threads: int | None = None, cuda_graph: bool = False) -> FakeEngine:
        cls.loaded.append(cls())
        return cls.loaded[-1]

    def __enter__(self) -> FakeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": feeds["x"].sum(axis=(1, 2, 3))}


def test_random_inputs_fill_the_dynamic_batch() -> None:
    feeds = bench_cmd.random_inputs(FakeEngine.inputs, 8)
    assert feeds["x"].shape == (8, 3, 4, 4) and feeds["x"].dtype == np.float32
    assert feeds["ids"].shape == (8, 2) and feeds["ids"].dtype == np.int64
    with pytest.raises(TrtoptError, match="fixed batch of 1"):
        bench_cmd.random_inputs([Spec("x", (1, 3), "float32")], 4)


def test_timing_function_uses_the_device_clock_the_runner_offers() -> None:
    """`trtopt bench` asks the engine how its runner times a call (`Engine.timing`), not which backend it is."""
    engine = FakeEngine()
    assert bench_cmd.timing_function(engine)[1] == "host"

    class TrtEngine(FakeEngine):
        backend = "tensorrt"
        timing = "cuda-events"

        def timed_infer(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
            return self.infer(feeds), 0.25

    fn, kind = bench_cmd.timing_function(TrtEngine())
    assert kind == "cuda-events" and fn(bench_cmd.random_inputs(FakeEngine.inputs, 1)) == 0.25


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(trtopt, "Engine", FakeEngine, raising=False)
    FakeEngine.loaded.clear()
    yield


def test_bench_command_json_and_plot(fake_engine: None, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "bench.png"
    plan = str(tmp_path / "plan.engine")
    code = main(["bench", plan, "--batch", "1,4", "--iterations", "3", "--warmup", "1",
                 "--json", "--plot", str(plot)])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "cpu" and report["timing"] == "host"
    assert [r["batch"] for r in report["results"]] == [1, 4]
    assert all(r["iterations"] == 3 for r in report["results"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [e.closed for e in FakeEngine.loaded] == [True]  # the engine's sessions/GPU memory are released


def test_bench_command_table(fake_engine: None, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["bench", str(tmp_path / "p.engine"), "--batch", "2", "--iterations", "2", "--warmup", "0"]) == 0
    )
    assert "samples/s" in capsys.readouterr().out


def test_bench_rejects_bad_batches() -> None:
    with pytest.raises(SystemExit):
        main(["bench", "p.engine", "--batch", "0,4"])
