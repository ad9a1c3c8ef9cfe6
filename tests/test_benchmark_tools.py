"""Smoke tests for the benchmark scripts (tools/bench_accuracy.py, tools/bench_latency.py and
tools/make_benchmarks.py): tiny runs that must produce the expected tables with finite numbers.
No timing thresholds, and no time is checked above zero once rounded: a tiny run's times mean nothing on a
shared machine, and on a fast CPU a tiny model's milliseconds print as 0.00. Exactness is checked as each CPU
kind promises it (trtopt.backend.cpu.isa): u8u8 kernels everywhere, u8s8 ones only with VNNI or AMX."""

from __future__ import annotations

import importlib
import math
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "efficientnet_lite0.onnx"
NUMBER = re.compile(
    r"^\*{0,2}(-?\d+(?:\.\d+)?)(?:%(?: \(\d+\.\d-\d+\.\d%\))?|x| ms| s| s / \d+\.\d+ GiB)?\*{0,2}$"
)  # a percentage may carry its 95% interval: "95.0% (90.4-97.4%)"


# A guard against a hung tool, not a time limit on it: under a load of 7 on 2 cores (two benchmarks beside
# `.ci/run`) four of these tools took over 120 s and failed a suite that passes on a quiet machine.
HANG_GUARD = 600


def run_tool(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_tool_here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], script: str, *args: str) -> str:
    """`main(args)` of tools/<script> in this process: its stdout. The tool then builds as every build in the suite
    does (tests/conftest.py: a CPU INT8 plan stays INT8 and times itself in a few rounds), without the seconds a fresh
    interpreter costs, and `bench_setup.run_isolated` runs each build here too: a fresh process per build only keeps
    each peak memory its own, and no test reads a peak's size. The tools' scripts start as commands in the tests
    that keep run_tool."""

    def here(fn, *fn_args):  # type: ignore[no-untyped-def]
        return fn(*fn_args), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux

    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    tool = importlib.import_module(Path(script).stem)
    for module in (importlib.import_module("bench_setup"), tool):
        if hasattr(module, "run_isolated"):
            monkeypatch.setattr(module, "run_isolated", here)
    capsys.readouterr()
    assert tool.main(list(args)) == 0
    return capsys.readouterr().out


def table_rows(markdown: str, header_start: str) -> list[list[str]]:
    """The body cells of the markdown table whose header row starts with `header_start`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def numbers(cells: list[str]) -> list[float]:
    """Every numeric cell (percent, ms, x, s, 's / GiB'), '–' (not applicable) skipped."""
    values = []
    for cell in cells:
        if cell == "–":
            continue
        match = NUMBER.match(cell)
        assert match, f"not a number: {cell!r}"
        values.extend(float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", cell))
    return values


def check_header(markdown: str, script: str) -> None:
    keys = ("- date: ", "- machine: ", "- versions: Python", "onnxruntime", "trtopt", f"- command: `python {script}")
    for key in keys:
        assert key in markdown, key


@pytest.mark.slow(seconds=35)
@pytest.mark.skipif(not DEMO.exists(), reason="needs models/efficientnet_lite0.onnx")
def test_bench_accuracy_tiny_run_reports_every_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "accuracy.md"
    stdout = run_tool_here(
        monkeypatch, capsys, "tools/bench_accuracy.py", "--count", "4", "--eval-count", "6", "--methods", "max",
        "--ort", "minmax", "--ort-raw", "minmax", "--ort-reduce-range", "--u8u8", "--u8s8", "max", "--out", str(out),
    )
    assert out.read_text() == stdout
    check_header(stdout, "tools/bench_accuracy.py")
    # --eval-count 6 from each of the two held-out folders: 12 held-out, + 4 calibration images in-sample
    rows = table_rows(stdout, "| variant | top-1 agree, held-out (12), 95% CI | top-1 agree, in-sample (16)")
    names = ["FP32 (ONNX Runtime)", "trtopt max", "trtopt max, u8s8 forced, run as stored", "ORT QDQ minmax",
             "ORT QDQ minmax, no pre-process"]  # fmt: skip
    assert [r[0] for r in rows] == names
    for row in rows:
        values = numbers(row[1:])
        assert values and all(math.isfinite(v) for v in values), row
    fp32, trtopt_max, _, ort_minmax, _ = rows
    fidelity = table_rows(stdout, "| variant | reference: top-1 agree (12) | kernels: top-1 agree (12)")
    assert [r[0] for r in fidelity] == names[1:]
    for row in fidelity:
        gap = float(row[3].strip("*").removesuffix(" points"))
        assert gap == pytest.approx(float(row[2].rstrip("%")) - float(row[1].rstrip("%")), abs=0.11), row  # rounding
    assert fp32[1].startswith("100.0% (") and fp32[7] == "–"
    share, low, high = (float(v) for v in re.findall(r"\d+\.\d", trtopt_max[1]))
    assert 0 <= low <= share <= high <= 100, trtopt_max[1]
    per_folder = table_rows(stdout, "| variant | `tests/data/heldout` (6) | `tests/data/heldout_more` (6) |")
    assert [r[0] for r in per_folder] == names[1:] and all(c.endswith("/6)") for r in per_folder for c in r[1:])
    assert trtopt_max[6] != "–", "labelled top-5 is reported for an ImageNet model"
    assert int(trtopt_max[8]) > 0 and int(ort_minmax[8]) > 0, "INT8 conv kernels counted"
    assert "CPU class `" in stdout, "every figure states the CPU class it was measured on"


@pytest.mark.slow(seconds=45)
@pytest.mark.skipif(not DEMO.exists(), reason="needs models/efficientnet_lite0.onnx")
def test_bench_accuracy_analysis_tiny_run_cross_validates_and_splits_the_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdout = run_tool_here(
        monkeypatch, capsys, "tools/bench_accuracy_analysis.py", "--count", "6", "--eval-count", "2", "--folds", "2",
        "--methods", "entropy", "max",
    )
    check_header(stdout, "tools/bench_accuracy_analysis.py")
    rows = table_rows(stdout, "| method | CV agreement, 95% CI | CV agreed |")
    assert [r[0] for r in rows] == ["entropy", "max"]
    for row in rows:
        assert row[2].endswith("/6") and row[5].endswith("/4"), row  # 6 cross-validated, 2 + 2 held-out
        assert all(math.isfinite(v) for v in numbers([row[1], row[3], row[4], row[6]])), row
        assert float(row[3]) > 0 and float(row[6]) > 0, "INT8 always moves the softmax a little"
    entropy, other = rows
    assert entropy[7:] == ["–", "–", "–"]
    only_entropy, only_max, p = int(other[7]), int(other[8]), float(other[9])
    agreed = [int(r[2].split("/")[0]) + int(r[5].split("/")[0]) for r in rows]
    assert agreed[0] - agreed[1] == only_entropy - only_max  # the paired counts explain the totals
    assert 0.0 < p <= 1.0
    split = table_rows(stdout, "| plan | in-sample agreement, 95% CI |")
    assert [r[0] for r in split] == [
        "entropy plan (INT8 weights and activations)", "same plan, activation Q/DQ removed (INT8 weights only)"
    ]
    full_kl, weights_kl = float(split[0][3]), float(split[1][3])
    assert 0 < weights_kl < full_kl, "float activations must remove part of the error"


def test_mcnemar_p_is_the_exact_two_sided_binomial_test() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from bench_accuracy_analysis import mcnemar_p
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(0, 5) == pytest.approx(2 / 32) and mcnemar_p(5, 0) == mcnemar_p(0, 5)
    assert mcnemar_p(1, 9) == pytest.approx(2 * 11 / 1024)


def test_bench_latency_tiny_run_on_zoo_model(tmp_path: Path) -> None:
    out = tmp_path / "latency.md"
    stdout = run_tool(
        "tools/bench_latency.py", "--model", "tiny_cnn", "--count", "4", "--batches", "1",
        "--iterations", "2", "--warmup", "1", "--out", str(out),
    )
    assert out.read_text() == stdout
    check_header(stdout, "tools/bench_latency.py")
    assert "1 intra-op thread(s)" in stdout
    rows = table_rows(stdout, "| batch | model | median | p90 | images/s | speed-up vs FP32 (paired) |")
    int8 = ["trtopt INT8", "ORT QDQ INT8", "ORT QDQ INT8, reduce_range", "ORT QDQ INT8, no pre-process"]
    assert [r[1] for r in rows] == ["FP32 (original)", *int8]
    for row in rows:
        values = numbers([row[0], *row[2:]])  # batch, then measured: times and rates, rounded (0.00 ms on a fast CPU)
        assert len(values) == 5 and values[0] == 1 and all(math.isfinite(v) and v >= 0 for v in values), row
    checked = table_rows(stdout, "| model | kernels vs its Q/DQ graph run as float math |")
    assert [r[0] for r in checked] == int8
    trtopt_error = float(re.search(r"relative error (\d+\.\d+)", checked[0][1]).group(1))  # type: ignore[union-attr]
    assert trtopt_error < 0.2, "trtopt's plan runs exactly on every CPU kind (u8s8 saturation shows as ~0.2-0.3)"


def test_bench_engine_times_the_api_against_its_bare_runner(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdout = run_tool_here(monkeypatch, capsys, "tools/bench_engine.py", "--model", "tiny_cnn", "--count", "4",
                           "--batches", "1", "--iterations", "3", "--warmup", "1")  # fmt: skip
    check_header(stdout, "tools/bench_engine.py")
    rows = table_rows(stdout, "| batch | Engine.infer: median ms | runner (bare session): median ms |")
    assert [r[0] for r in rows] == ["1"]  # tiny_cnn's batch is fixed at 1
    for row in rows:  # times (0.00 ms on a fast CPU), then the overhead and its interval, low <= median <= high
        assert all(math.isfinite(v) and v >= 0 for v in numbers(row[1:3])), row
        median, low, high = (float(v) for v in re.findall(r"[+-]\d+\.\d", row[3]))
        assert low <= median <= high, row


def test_bench_conv_kernels_tiny_run_times_every_shape_and_names_trtopts_choice() -> None:
    from trtopt.backend.cpu.builder import GEMM_MIN_K

    stdout = run_tool("tools/bench_conv_kernels.py", "--iterations", "1", "--warmup", "0")
    check_header(stdout, "tools/bench_conv_kernels.py")
    rows = table_rows(stdout, "| model | conv | K = C_in/group")
    assert len(rows) >= 10
    from trtopt.backend.cpu.isa import EXACT_U8S8, cpu_isa

    for row in rows:
        values = numbers([*row[2:9], row[10]])  # K, then measured times and ratios, rounded
        assert len(values) == 8 and values[0] > 0 and all(math.isfinite(v) and v >= 0 for v in values), row
        dense, k = "depthwise" not in row[1], int(row[2])
        assert row[9] == ("GEMM" if dense and k >= GEMM_MIN_K else "symmetric"), row
        sym, gemm, u8u8 = (float(v) for v in row[11:14])
        assert u8u8 <= 1, f"u8u8 kernels are exact on every CPU kind: {row}"
        if cpu_isa() in EXACT_U8S8 or not dense:
            assert sym <= 1 and gemm <= 1, f"u8s8 kernels are exact on {cpu_isa()} (and depthwise everywhere): {row}"


def test_bench_latency_refuses_other_batches_for_a_fixed_batch_model() -> None:
    done = subprocess.run(
        [sys.executable, "tools/bench_latency.py", "--model", "tiny_cnn", "--batches", "8", "--no-ort"],
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD,
    )
    assert done.returncode != 0 and "--batches 1" in done.stderr


@pytest.mark.slow(seconds=35)
@pytest.mark.skipif(not DEMO.exists(), reason="needs models/efficientnet_lite0.onnx")
def test_make_benchmarks_quick_assembles_sections_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    subprocess.run(
        [sys.executable, "tools/make_benchmarks.py", "--quick", "--only", "latency", "--out", str(out)],
        cwd=ROOT, check=True, capture_output=True, timeout=HANG_GUARD,
    )
    text = out.read_text()
    assert text.startswith("# Benchmarks") and "python tools/make_benchmarks.py" in text
    assert "--quick smoke run" in text
    section = (tmp_path / "docs" / "benchmarks" / "latency.md").read_text()
    assert section.strip() in text, "the section is copied verbatim"
    assert "- [latency](#latency-fp32-vs-int8-on-onnx-runtime-cpu-tiny_cnn)" in text  # the quick run's model
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "docs" / "benchmarks" / "latency.png").stat().st_size > 0
    assert "](docs/benchmarks/latency.png)" in text


@pytest.mark.slow
@pytest.mark.skipif(not DEMO.exists(), reason="needs models/efficientnet_lite0.onnx")
def test_bench_calibration_on_photos_compares_with_fp32_inference(tmp_path: Path) -> None:
    out = tmp_path / "calibration.md"
    stdout = run_tool(
        "tools/bench_calibration.py", "--photos", "400x300", "--counts", "8", "--methods", "fp32", "fp32-images",
        "trtopt-calibrate", "trtopt-entropy", "trtopt-entropy-full-decode", "--out", str(out),
    )  # fmt: skip
    assert out.read_text().strip() == stdout.strip() and "CPU class" in stdout and "photos of 400x300" in stdout
    rows = table_rows(stdout, "| method | inputs | wall time |")
    assert [r[0] for r in rows] == ["fp32", "fp32-images", "trtopt-calibrate", "trtopt-entropy",
                                    "trtopt-entropy-full-decode"]  # fmt: skip
    for row in rows:
        values = numbers([*row[1:5], row[5].removesuffix(" GiB"), row[6].removesuffix("x")])
        assert values[0] == 8 and values[4] > 0, row  # inputs, peak memory
        assert all(math.isfinite(v) and v >= 0 for v in values), row  # times, rounded to 0.1 s: 0.0 on a fast CPU
    assert rows[0][6] == "1.00x"
    draft = table_rows(stdout, "| tensors | median")
    assert len(draft) == 1 and int(draft[0][0]) > 10


@pytest.mark.skipif(not DEMO.exists(), reason="needs models/efficientnet_lite0.onnx")
def test_bench_calibration_profile_times_every_stage_at_one_and_two_threads() -> None:
    stdout = run_tool(
        "tools/bench_calibration_profile.py", "--count", "4", "--batch", "4", "--size", "320x240", "--repeat", "1"
    )
    assert "CPU class" in stdout and "photos of 320x240" in stdout
    rows = table_rows(stdout, "| stage | wall time |")
    names = [r[0] for r in rows]
    assert len(rows) == 11 and names[0].startswith("decode") and names[-1].startswith("counting")
    assert sum("1 thread" in n and "inference" in n for n in names) == 4
    assert sum("2 threads" in n for n in names) == 4
    for row in rows:
        values = numbers([row[1], row[2], row[3], row[4]])
        assert all(math.isfinite(v) and v >= 0 for v in values), row
    layout = re.search(r"has (\d+) `ReorderOutput` .* and (\d+) unfused `Add` .*, (\d+) and (\d+) with them", stdout)
    assert layout is not None, stdout[-2000:]
    bare_reorders, _, exposed_reorders, _ = (int(v) for v in layout.groups())
    assert exposed_reorders > bare_reorders  # the exposed tensors leave ONNX Runtime's blocked layout


def test_realistic_photos_are_camera_sized_jpegs_that_differ(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from PIL import Image
    from realistic_photos import make_photos

    paths = make_photos(tmp_path, 3, (300, 200))
    sizes = {Image.open(p).size for p in paths}
    assert sizes <= {(300, 200), (200, 300)} and all(Image.open(p).format == "JPEG" for p in paths)
    assert len({p.read_bytes() for p in paths}) == 3


@pytest.mark.slow(seconds=35)  # three INT8 builds of the demo model
@pytest.mark.skipif(not DEMO.exists(), reason="needs models/efficientnet_lite0.onnx")
def test_bench_sparsity_tiny_run_reports_layers_budgets_and_int8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sparsity.md"
    stdout = run_tool_here(monkeypatch, capsys, "tools/bench_sparsity.py", "--sens-count", "2", "--eval-count", "2",
                           "--budgets", "0.01", "--top", "1", "--int8-count", "8", "--no-int8-layers",
                           "--out", str(out))  # fmt: skip
    assert out.read_text() == stdout
    check_header(stdout, "tools/bench_sparsity.py")
    assert "CPU class `" in stdout and "owed to a GPU run" in stdout and "88.2% of the model's" in stdout
    layers = table_rows(stdout, "| layer | op | weight | MACs |")
    assert len(layers) == 2 and all(math.isfinite(float(r[6])) for r in layers)
    assert float(layers[0][6]) <= float(layers[1][6])  # least sensitive first, then most
    budgets = table_rows(stdout, "| variant | layers pruned |")
    assert [r[0] for r in budgets] == ["dense", "budget 1 - cos <= 0.01", "every eligible layer"]
    assert budgets[-1][1] == "33 of 33" and all(r[6] != "-" for r in budgets)  # every row built to INT8
    assert float(budgets[1][3]) <= 0.01 < float(budgets[2][3])


def test_bench_serving_measures_closed_loop_clients_and_tabulates() -> None:
    """tools/bench_serving.py's measurement and table, with a stand-in call (the servers are
    tests/test_triton_server.py's business)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from bench_serving import System, measure, point, table
    finally:
        sys.path.remove(str(ROOT / "tools"))
    seen: list[bytes] = []
    rate, latencies = measure(lambda: seen.append, [b"a", b"b", b"c"], clients=3, seconds=0.2, warmup=0.05)
    assert rate > 0 and latencies and all(x >= 0 for x in latencies)
    assert set(seen) == {b"a", b"b", b"c"}  # each client starts at its own photo and cycles through all
    system = System("stand-in", "on", lambda: seen.append)
    rows = table([point(system, 3, [(10.0, [0.010, 0.020], 2.0), (30.0, [0.030], 4.0)])], [3])
    assert rows[2] == "| stand-in | on | 20.0, 20 / 30, batch 3.0 |"  # median rate, pooled percentiles, mean batch


def test_bench_sparsity_on_a_zoo_model_missing_from_the_cache_says_skipped(tmp_path: Path) -> None:
    out = tmp_path / "sparsity.md"
    done = subprocess.run([sys.executable, "tools/bench_sparsity.py", "--model", "zoo:open-nsfw", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD,
                          env={**os.environ, "TRTOPT_ZOO_DIR": str(tmp_path / "empty")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    check_header(done.stdout, "tools/bench_sparsity.py")
    assert "**Skipped: `open-nsfw` is not in the zoo cache**" in done.stdout and out.read_text() == done.stdout
    assert "| layer |" not in done.stdout


def test_bench_sparsity_measures_a_classifier_on_its_logits() -> None:
    """The model without its final Softmax computes the Softmax's input: softmax of it is the original output."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    w = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"], axis=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", 3])],
        [onnx.numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from bench_sparsity import logits_model
    finally:
        sys.path.remove(str(ROOT / "tools"))
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    (probs,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    cut = logits_model(onnx.ModelProto.FromString(model.SerializeToString()))
    assert [o.name for o in cut.graph.output] == ["logits"] and "Softmax" not in {n.op_type for n in cut.graph.node}
    (logits,) = ort.InferenceSession(cut.SerializeToString()).run(None, {"x": x})
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(axis=1, keepdims=True), probs, rtol=1e-5, atol=1e-7)
    assert logits_model(cut) is cut  # no final Softmax: unchanged


def test_benchlib_times_interleaved_and_pairs_each_round_with_the_baseline() -> None:
    """tools/benchlib.py, what every benchmark times and heads its section with: the order rotates each round, the
    speed-up is the median of the rounds' ratios to the first call, and the header says what the CPU class
    promises on either kind (simulated: the class is a parameter)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from benchlib import Timings, cpu_class, interleaved
    finally:
        sys.path.remove(str(ROOT / "tools"))
    order: list[str] = []
    timings = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, warmup=1, iterations=3)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"] and timings.baseline == "a"
    assert [len(ms) for ms in timings.ms.values()] == [3, 3]
    paired = Timings(1, {"fp32": [2.0, 4.0, 8.0], "int8": [1.0, 4.0, 2.0]})
    assert paired.speedup("int8") == 2.0 and paired.speedup("fp32") == 1.0 and paired.p50("int8") == 2.0
    assert "`avx2`**: its u8s8 INT8 kernels saturate" in cpu_class("avx2")
    assert "`amx`**: its u8s8 INT8 kernels are exact" in cpu_class("amx")
    assert "`avx512_vnni`**: its u8s8 INT8 kernels are exact" in cpu_class("avx512_vnni")
    assert "exactness unknown" in cpu_class("arm64")


def test_compare_ort_plans_lists_the_optimised_ops_and_times_each_model(tmp_path: Path) -> None:
    import onnx

    from trtopt.zoo import build_model

    path = tmp_path / "tiny.onnx"
    onnx.save_model(build_model("tiny_cnn"), path)
    listed = run_tool("tools/compare_ort_plans.py", "ops", str(path), f"{path}:engine")
    assert listed.count(" nodes {") == 2 and "Conv" in listed
    timed = run_tool("tools/compare_ort_plans.py", "time", "--rounds", "2", str(path), f"same={path}:engine")
    rows = [line.split() for line in timed.splitlines()]
    assert [r[0] for r in rows] == ["FP32", "same"] and all(r[2] == "ms" and r[3].endswith("x") for r in rows)
