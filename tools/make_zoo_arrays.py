#!/usr/bin/env python3
"""Make the .npz calibration sets of the zoo's non-image models in calib_arrays/ (committed; run this only to
remake them). Needs the cached silero-vad model (python tools/zoo.py fetch silero-vad): its LSTM state is
part of every feed, so the audio is run through the FP32 model to get the state each window really sees.

    python tools/make_zoo_arrays.py [--seed 0]

- silero_vad_16k.npz: `input` [N, 1, 576] and `state` [N, 2, 1, 128], a stack of N whole feeds (the model's
  inputs share no batch dimension: see trtopt/data/arrays.py). The audio is synthesised here: voiced
  syllables (a glottal pulse train at 90-240 Hz through three formant resonators), fricatives (filtered
  noise), pauses, and background noise at 5-30 dB SNR. Windows follow silero-vad's wrapper
  (silero_vad/utils_vad.py, OnnxWrapper): 512 new samples at 16 kHz after the previous window's last 64.
- magika.npz: `bytes` [N, 2048] int32, magika's features (magika/magika.py,
  _extract_features_from_seekable): the first 1024 bytes after stripping leading whitespace, padded at the
  end with 256, and the last 1024 after stripping trailing whitespace, padded at the front, for files of
  this repository (code, docs, data, images).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo  # noqa: E402

from trtopt.execution.ort_session import OrtSession  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RATE, WINDOW, CONTEXT = 16000, 512, 64


def resonate(signal: np.ndarray, freq: float, bandwidth: float) -> np.ndarray:
    """A two-pole resonator (a formant): y[n] = x[n] + a1 y[n-1] + a2 y[n-2]."""
    r = np.exp(-np.pi * bandwidth / RATE)
    a1, a2 = 2 * r * np.cos(2 * np.pi * freq / RATE), -r * r
    out = np.zeros_like(signal)
    for n in range(len(signal)):
        out[n] = signal[n] + a1 * (out[n - 1] if n > 0 else 0) + a2 * (out[n - 2] if n > 1 else 0)
    return out


def syllable(rng: np.random.Generator) -> np.ndarray:
    length = int(RATE * rng.uniform(0.12, 0.3))
    if rng.random() < 0.25:  # a fricative: noise high up
        return resonate(rng.normal(0, 1, length), rng.uniform(3000, 6000), 1500) * 0.02
    f0 = rng.uniform(90, 240) * (1 + 0.05 * np.sin(np.linspace(0, np.pi, length)))
    phase = np.cumsum(f0 / RATE)
    pulses = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
    voice = sum(resonate(pulses, rng.uniform(lo, hi), 90) for lo, hi in ((300, 800), (900, 2200), (2300, 3200)))
    return voice * np.hanning(length) / (np.abs(voice).max() + 1e-9)


def utterance(rng: np.random.Generator, seconds: float) -> np.ndarray:
    parts, total = [], 0
    while total < seconds * RATE:
        part = syllable(rng) if rng.random() < 0.75 else np.zeros(int(RATE * rng.uniform(0.1, 0.6)))
        parts.append(part)
        total += len(part)
    audio = np.concatenate(parts)[: int(seconds * RATE)] * rng.uniform(0.1, 0.6)
    noise = rng.normal(0, 1, len(audio)) * np.sqrt(np.mean(audio**2) / 10 ** (rng.uniform(5, 30) / 10))
    return (audio + noise).astype(np.float32)


def silero_feeds(rng: np.random.Generator, clips: int = 4, seconds: float = 2.0, every: int = 2) -> dict:
    path = zoo.cached_path("silero-vad")
    if path is None:
        raise SystemExit("silero-vad is not cached: run python tools/zoo.py fetch silero-vad")
    session = OrtSession(__import__("onnx").load(path))
    inputs, states, probs = [], [], []
    for _ in range(clips):
        audio, state = utterance(rng, seconds), np.zeros((2, 1, 128), np.float32)
        context = np.zeros(CONTEXT, np.float32)
        for i, start in enumerate(range(0, len(audio) - WINDOW + 1, WINDOW)):
            window = np.concatenate([context, audio[start : start + WINDOW]])[None]
            if i % every == 0:
                inputs.append(window)
                states.append(state)
            out = session.run({"input": window, "state": state})
            state, context = out["stateN"], window[0, -CONTEXT:]
            probs.append(float(out["output"].ravel()[0]))
    print(f"silero-vad: {len(inputs)} feeds, speech probability mean {np.mean(probs):.2f}, "
          f"{np.mean(np.array(probs) > 0.5):.0%} over 0.5", file=sys.stderr)
    return {"input": np.stack(inputs), "state": np.stack(states)}


def magika_features(data: bytes, size: int = 1024, pad: int = 256) -> np.ndarray:
    block = 4096
    whole = len(data) <= block
    beg = (data[:block].strip() if whole else data[:block].lstrip())[:size]
    end = (data[-block:].strip() if whole else data[-block:].rstrip())[-size:]
    begin = list(beg) + [pad] * (size - len(beg))
    ending = [pad] * (size - len(end)) + list(end)
    return np.array(begin + ending, np.int32)


def magika_feeds(count: int = 64) -> dict:
    patterns = ("trtopt/**/*.py", "docs/*.md", "*.md", "*.toml", "calib_data/*.jpg", "calib_text/*/*.jpg",
                "tests/data/*/*.jpg", "notebooks/*.ipynb", ".ci/run", "tools/*.py")
    files = sorted({p for pattern in patterns for p in ROOT.glob(pattern) if p.is_file()})
    step = max(1, len(files) // count)
    chosen = files[::step][:count]
    print(f"magika: {len(chosen)} files of this repository", file=sys.stderr)
    return {"bytes": np.stack([magika_features(p.read_bytes()) for p in chosen])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "calib_arrays")
    args = parser.parse_args(argv)
    args.out.mkdir(exist_ok=True)
    np.savez_compressed(args.out / "silero_vad_16k.npz", **silero_feeds(np.random.default_rng(args.seed)))
    np.savez_compressed(args.out / "magika.npz", **magika_feeds())
    return 0


if __name__ == "__main__":
    sys.exit(main())
