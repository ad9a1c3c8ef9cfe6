#!/usr/bin/env python3
"""Hold-out round 5: Silero VAD, a streaming audio model nothing in trtopt was tuned on, on real speech.

    python tools/bench_vad.py fetch          # pip download silero-vad and pysptk's sdist; check licences and sha256
    python tools/bench_vad.py run [--out FILE.md]

Models (silero-vad 6.2.3, MIT): `silero_vad_16k_op15.onnx` (audio [batch, 576], LSTM state [2, batch, 128] with
the batch in the middle, the sample rate as an int64 scalar read by `If` nodes, a two-output `If` around the
decoder's LSTM cell) and `silero_vad_16k_sequence.onnx` (a [chunks, 576] sequence through an LSTM op, h and c
[1, 1, 128]). Speech: CMU ARCTIC's `arctic_a0007.wav` (16 kHz, 4 s), shipped in pysptk 1.0.1's sdist under the
ARCTIC licence ("free for use for any purpose", kept with its notice; nothing is committed here).

The model runs as a stream: each call reads 64 samples of context and the next 512, and the state the previous
call wrote (silero-vad's `OnnxWrapper` does the same). Two streams are made from the one utterance: calibration
is its first half, held-out its second half, each mixed with its own white noise at SNRs of 20, 10 and 0 dB and
followed by noise alone, so that both speech and non-speech chunks occur. The FP32 model runs each stream to get
the state every chunk sees; those (chunk, state, rate) triples are the `.npz` feeds. The plan is built as a user
would (`trtopt build --int8 --calib feeds.npz`, every default) and judged on the held-out feeds: cosine of each
output with FP32, the largest change of speech probability, and how often the speech decision at silero-vad's
default threshold (0.5) flips.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import wave
import zipfile
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo  # noqa: E402

SILERO = ("silero-vad", "6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8")
MODELS = {  # name -> (member of the wheel, sha256)
    "silero-op15": ("silero_vad/data/silero_vad_16k_op15.onnx",
                    "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49"),
    "silero-sequence": ("silero_vad/data/silero_vad_16k_sequence.onnx",
                        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85"),
}  # fmt: skip
PYSPTK = ("pysptk", "1.0.1", "78b1c9338bf795a41cdc3ff03fcd4699c401c323f54630bb71a19710078d0b3f")
SPEECH = ("pysptk-1.0.1/pysptk/example_audio_data/arctic_a0007.wav",
          "1b850392f8c87ee2efe5a686523f1bab61d2a38d59bc43d1127e17e406f9e57d")  # fmt: skip
RATE, CONTEXT, CHUNK, THRESHOLD = 16000, 64, 512, 0.5
SNRS_DB = (20.0, 10.0, 0.0)


def folder() -> Path:
    return zoo.cache_dir() / "vad-holdout"  # beside the zoo's own silero-vad (the OpenVINO export), not in it


def _download(package: tuple[str, str, str], dest: Path, binary: bool, target: tuple[str, ...] = ()) -> Path:
    """`package` (name, version, sha256) from PyPI into `dest`/name, checked by pip; `target`: pip's
    --python-version/--platform flags, for a wheel built for one interpreter only (slovorez: cp311)."""
    name, version, digest = package
    dest = dest / name
    dest.mkdir()
    (dest / "req.txt").write_text(f"{name}=={version} --hash=sha256:{digest}\n")
    kind = ["--only-binary=:all:"] if binary else []  # pysptk has no wheel; forcing sources would build numpy
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, *target, "--require-hashes", "-q",
               "--disable-pip-version-check", "-d", str(dest), "-r", str(dest / "req.txt")]  # fmt: skip
    if subprocess.run(command).returncode != 0:
        raise SystemExit(f"error: pip could not download {name}=={version}; check the connection to PyPI")
    (found,) = [p for p in dest.iterdir() if p.name != "req.txt"]
    return found


def _checked(data: bytes, digest: str, what: str) -> bytes:
    if hashlib.sha256(data).hexdigest() != digest:
        raise SystemExit(f"error: {what} is not the file this benchmark was made with (sha256 differs)")
    return data


def fetch() -> None:
    folder().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trtopt-vad-") as tmp:
        with zipfile.ZipFile(_download(SILERO, Path(tmp), binary=True)) as wheel:
            licence = wheel.read("silero_vad-6.2.3.dist-info/licenses/LICENSE").decode()
            if not licence.startswith("MIT License"):
                raise SystemExit("error: silero-vad's wheel is not MIT-licensed as recorded")
            for name, (member, digest) in MODELS.items():
                (folder() / f"{name}.onnx").write_bytes(_checked(wheel.read(member), digest, member))
            (folder() / "SILERO-LICENSE").write_text(licence)
        with tarfile.open(_download(PYSPTK, Path(tmp), binary=False)) as sdist:
            read = lambda member: sdist.extractfile(member).read()  # noqa: E731
            (folder() / "arctic_a0007.wav").write_bytes(_checked(read(SPEECH[0]), SPEECH[1], SPEECH[0]))
            (folder() / "ARCTIC-COPYING").write_bytes(read(str(Path(SPEECH[0]).with_name("COPYING"))))
    print(f"fetched into {folder()}", file=sys.stderr)


def speech() -> np.ndarray:
    with wave.open(io.BytesIO((folder() / "arctic_a0007.wav").read_bytes())) as f:
        assert f.getframerate() == RATE and f.getnchannels() == 1 and f.getsampwidth() == 2
        return np.frombuffer(f.readframes(f.getnframes()), np.int16).astype(np.float32) / 32768.0


def stream(voice: np.ndarray, seed: int) -> np.ndarray:
    """The utterance at each SNR, then as much noise alone, one after the other."""
    rng = np.random.default_rng(seed)
    power = float(np.mean(voice[np.abs(voice) > 0.02] ** 2))
    parts = []
    for snr in SNRS_DB:
        noise = rng.standard_normal(len(voice)).astype(np.float32) * np.sqrt(power / 10 ** (snr / 10))
        parts.append(voice + noise)
    parts.append(rng.standard_normal(len(voice)).astype(np.float32) * np.sqrt(power / 10 ** (SNRS_DB[1] / 10)))
    return np.clip(np.concatenate(parts), -1.0, 1.0).astype(np.float32)


def chunks(audio: np.ndarray) -> np.ndarray:
    """[n, 576]: each 512-sample chunk with the 64 samples before it (zeros before the first)."""
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
    count = len(audio) // CHUNK
    return np.stack([padded[i * CHUNK : i * CHUNK + CONTEXT + CHUNK] for i in range(count)])


def op15_feeds(model: Path, audio: np.ndarray) -> dict[str, np.ndarray]:
    """Stacks of whole feeds, the state each chunk sees when FP32 runs the stream."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    state, inputs, states = np.zeros((2, 1, 128), np.float32), [], []
    for chunk in chunks(audio):
        inputs.append(chunk[None])
        states.append(state)
        _, state = session.run(None, {"input": chunk[None], "state": state, "sr": np.array(RATE, np.int64)})
    n = len(inputs)
    return {"input": np.stack(inputs), "state": np.stack(states), "sr": np.full(n, RATE, np.int64)}


def sequence_feeds(model: Path, audio: np.ndarray, length: int = 8) -> dict[str, np.ndarray]:
    """Windows of `length` chunks with the h/c the FP32 model carries into each."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    h = c = np.zeros((1, 1, 128), np.float32)
    inputs, hs, cs = [], [], []
    all_chunks = chunks(audio)
    for start in range(0, len(all_chunks) - length + 1, length):
        window = all_chunks[start : start + length]
        inputs.append(window)
        hs.append(h)
        cs.append(c)
        _, h, c = session.run(None, {"input": window, "h": h, "c": c})
    return {"input": np.stack(inputs), "h": np.stack(hs), "c": np.stack(cs)}


def evaluate(model: Path, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
             feeds: dict[str, np.ndarray], prob: str) -> dict[str, Any]:  # fmt: skip
    """Held-out figures of `run` (one feed -> outputs by name) against the FP32 `model`, feed by feed."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    ref: dict[str, list[np.ndarray]] = {n: [] for n in names}
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for i in range(len(next(iter(feeds.values())))):
        feed = {k: v[i, ...] for k, v in feeds.items()}
        out = run(feed)
        for name, value in zip(names, session.run(None, feed), strict=True):
            ref[name].append(value.ravel())
            got[name].append(np.asarray(out[name]).ravel())
    cosines = {}
    for name in names:
        a, b = np.concatenate(ref[name]).astype(np.float64), np.concatenate(got[name]).astype(np.float64)
        cosines[name] = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    p, q = np.concatenate(ref[prob]) > THRESHOLD, np.concatenate(got[prob]) > THRESHOLD
    change = float(np.abs(np.concatenate(ref[prob]) - np.concatenate(got[prob])).max())
    return {"cosine": cosines, "max_prob_change": change, "chunks": int(p.size), "speech_chunks": int(p.sum()),
            "flips": int((p != q).sum())}


def ort_quantized(model: Path, calib: dict[str, np.ndarray], workdir: Path) -> Path | str:
    """ONNX Runtime's own path on the same feeds: quant_pre_process, then quantize_static (QDQ, per-channel
    QInt8 weights, QUInt8 activations, MinMax), as tools/zoo_variants.py's ort_build; or why it failed."""
    from bench_setup import pre_process
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter(range(len(next(iter(calib.values())))))

        def get_next(self) -> dict[str, np.ndarray] | None:
            i = next(self.rows, None)
            return None if i is None else {k: v[i, ...] for k, v in calib.items()}

    out = workdir / f"{model.stem}.ort.onnx"
    try:
        pre_process(model, workdir / f"{model.stem}.pre.onnx", skip_symbolic_shape=True)
        quantize_static(str(workdir / f"{model.stem}.pre.onnx"), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the table says why instead of stopping
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return out


def run_one(name: str, workdir: Path) -> dict[str, Any]:
    from trtopt.cli.main import main as trtopt_main

    model = folder() / f"{name}.onnx"
    voice = speech()
    half = len(voice) // 2
    make = op15_feeds if name == "silero-op15" else sequence_feeds
    calib, held = make(model, stream(voice[:half], seed=0)), make(model, stream(voice[half:], seed=1))
    np.savez(workdir / f"{name}-calib.npz", **calib)
    plan = workdir / f"{name}.engine"
    out = io.StringIO()
    started = time.perf_counter()
    with redirect_stdout(out):
        code = trtopt_main(["build", str(model), "--int8", "--calib", str(workdir / f"{name}-calib.npz"),
                            "-o", str(plan), "--json"])  # fmt: skip
    seconds = time.perf_counter() - started
    if code != 0:
        return {"model": name, "built": False, "exit": code}
    summary = json.loads(out.getvalue())
    import onnxruntime as ort

    from trtopt.engine import Engine

    prob = "output" if name == "silero-op15" else "speech_probs"
    with Engine.load(plan) as engine:
        ours = evaluate(model, engine.infer, held, prob)
    theirs = ort_quantized(model, calib, workdir)
    if isinstance(theirs, Path):
        session = ort.InferenceSession(str(theirs), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        theirs = evaluate(model, lambda feed: dict(zip(names, session.run(None, feed), strict=True)), held, prob)
    return {"model": name, "built": True, "seconds": seconds, "summary": summary, "calib_feeds": len(calib["input"]),
            "held_feeds": len(held["input"]), **ours, "ort": theirs}  # fmt: skip


def report(rows: list[dict[str, Any]], argv: list[str]) -> str:
    from bench_optimizer import machine_lines

    lines = [
        "## Hold-out round 5: Silero VAD on real speech (CPU)",
        "",
        *machine_lines(argv),
        "- data: CMU ARCTIC arctic_a0007.wav (pysptk 1.0.1 sdist), first half for calibration, second half held out,"
        " each at SNR 20/10/0 dB then noise alone; the FP32 model's own states",
        "",
        "| model | trtopt build (every default) | INT8 layers / float | verified (feeds) | held-out feeds "
        "| worst output cosine | max speech-probability change | decision flips at 0.5 (speech chunks) "
        "| INT8 / FP32 time | ORT quantize_static: worst cosine, max change, flips |",
        "|---|---|---:|---|---:|---|---:|---|---:|---|",
    ]
    lines += [_row(r) for r in rows]
    return "\n".join(lines) + "\n"


def _row(r: dict[str, Any]) -> str:
    if not r.get("built"):
        return f"| {r['model']} | refused (exit {r['exit']}) | | | | | | | | |"
    s, cos = r["summary"], r["cosine"]
    v, worst = s["verification"], min(cos, key=cos.get)
    cells = [
        r["model"],
        f"{r['seconds']:.1f} s, {s['calibration']['method']} on {s['calibration']['samples']} of "
        f"{r['calib_feeds']} feeds",
        f"{s['int8_layers']} / {len(s['float_layers'])}",
        f"ref vs FP32 {v['reference_vs_fp32']['cosine']:.5f}, kernels vs ref {v['kernels_vs_reference']['cosine']:.5f}"
        f" ({v['samples']})",
        str(r["held_feeds"]),
        f"{worst} {cos[worst]:.5f}",
        f"{r['max_prob_change']:.4f}",
        f"{r['flips']} of {r['chunks']} ({r['speech_chunks']})",
        f"{s['speed']['ratio']:.2f}x",
        _ort_cell(r["ort"]),
    ]
    return "| " + " | ".join(cells) + " |"


def _ort_cell(ort: dict[str, Any] | str) -> str:
    if isinstance(ort, str):
        return f"failed: {ort}"
    cos = ort["cosine"]
    worst = min(cos, key=cos.get)
    return f"{worst} {cos[worst]:.5f}, {ort['max_prob_change']:.4f}, {ort['flips']} of {ort['chunks']}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["fetch", "run"])
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    args = parser.parse_args(argv)
    if args.action == "fetch":
        fetch()
        return 0
    if not all((folder() / f"{n}.onnx").is_file() for n in MODELS) or not (folder() / "arctic_a0007.wav").is_file():
        print("error: models or speech not fetched; run python tools/bench_vad.py fetch", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="trtopt-vad-") as tmp:
        rows = [run_one(name, Path(tmp)) for name in MODELS]
    text = report(rows, ["tools/bench_vad.py", *argv])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
