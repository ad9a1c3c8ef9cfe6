#!/usr/bin/env python3
"""Hold-out round 8, second model: a character tagger (Russian morpheme segmentation) that nothing in trtopt was
tuned on, judged by the tags it gives each letter.

    python tools/bench_tagger.py fetch          # pip download slovorez's wheel; check licence and sha256
    python tools/bench_tagger.py run [--count 64] [--held-out 512] [--out FILE.md]

Model (slovorez 0.1.0, MIT: `slovorez/models/slovorez-test/`): a Keras model converted by tf2onnx with Keras's
mixed precision, so float16 inside and out: int32 letter ids [words, letters] -> an embedding, five 1-D
convolutions written as Conv2D between Unsqueeze and Squeeze, their biases added after the Squeeze, ReLU, and a
last convolution and Softmax giving 27 BIES morpheme tags per letter as float16. The wheel's own dictionary
(`base_dict.json`, 95,912 words) gives the words, shuffled with a fixed seed: `--count` calibrate, the next
`--held-out` judge. Letters become ids as the package's `SlovorezTokenizer.encode_batch` does (its config's
vocabulary, unknown letters 1), padded with 0 to 24 letters (longer words are left out).

Plans are built as a user would (`trtopt build M.onnx --int8 --calib words.npz`), once with every default and
once with `--no-auto-exclude` (every layer INT8: what the build gave before its sensitivity search read the
top-class agreement). Judged on the held-out words: the share of their letters whose tag (argmax) is FP32's,
the share of words whose every letter keeps its tag, and the cosine of the tag probabilities; beside them ONNX
Runtime's `quantize_static` on the same words (QDQ, per-channel, after `quant_pre_process`).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import tempfile
import zipfile
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo  # noqa: E402
from bench_seq2seq import session  # noqa: E402
from bench_vad import _checked, _download, ort_quantized  # noqa: E402

WHEEL = ("slovorez", "0.1.0", "c67d66f9a8400722ed9cafc13e0e3861360db4013ccd4d198e5057e69acb77a5")
MEMBERS = {  # file of slovorez/models/slovorez-test/ -> sha256
    "slovorez-test.onnx": "a43bd07bcb4a0db221062edfec035a6d7d108b1ec1e17bbd92137b5102947629",
    "config.json": "ae6140e45689cc4ceea9a0913731fbebc6ad8658e37d872f3daee421c6ff7e90",
    "base_dict.json": "fe9af3f8489bb4d132b210665cb2ea80002543829157f5c20d07453b3f9521ff",
}  # fmt: skip
LETTERS, SEED, UNKNOWN = 24, 0, 1


def folder() -> Path:
    return zoo.cache_dir() / "tagger-holdout"


def fetch() -> None:
    """The model, its config and dictionary, and the licence, from the cp311 manylinux wheel (the only one)."""
    name, version, _ = WHEEL
    folder().mkdir(parents=True, exist_ok=True)
    target = ("--python-version", "3.11", "--platform", "manylinux2014_x86_64")
    with (
        tempfile.TemporaryDirectory(prefix="trtopt-tagger-") as tmp,
        zipfile.ZipFile(_download(WHEEL, Path(tmp), binary=True, target=target)) as wheel,
    ):
        licence = wheel.read(f"{name}-{version}.dist-info/licenses/LICENSE").decode()
        if not licence.startswith("MIT License"):
            raise SystemExit("error: slovorez's wheel is not MIT-licensed as recorded")
        for member, sha in MEMBERS.items():
            data = wheel.read(f"slovorez/models/slovorez-test/{member}")
            (folder() / member).write_bytes(_checked(data, sha, member))
        (folder() / "LICENSE").write_text(licence)
    print(f"fetched into {folder()}", file=sys.stderr)


def words(count: int, held_out: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(calibration, held-out) feeds: letter ids [words, LETTERS] as int32, 0 after each word."""
    config = json.loads((folder() / "config.json").read_text())
    vocabulary = config["mapping"]["tokenizer_vocab"]
    found = sorted(w for w in json.loads((folder() / "base_dict.json").read_text()) if len(w) <= LETTERS)
    random.Random(SEED).shuffle(found)

    def feeds(part: list[str]) -> dict[str, np.ndarray]:
        ids = np.zeros((len(part), LETTERS), np.int32)
        for i, word in enumerate(part):
            ids[i, : len(word)] = [vocabulary.get(letter, UNKNOWN) for letter in word]
        return {"input_layer": ids}

    return feeds(found[:count]), feeds(found[count:count + held_out])


def scores(tags: np.ndarray, reference: np.ndarray, ids: np.ndarray) -> dict[str, float]:
    """Letters whose tag is FP32's, words whose every letter's is, and the cosine of the probabilities."""
    letters = ids != 0
    same = tags.argmax(-1) == reference.argmax(-1)
    a, b = tags.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
    return {"letters": float(same[letters].mean()), "words": float(np.all(same | ~letters, axis=1).mean()),
            "cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))}  # fmt: skip


def build(model: Path, calib: Path, plan: Path, *flags: str) -> dict[str, Any] | int:
    """The build summary (--json), or the exit code of a refused build."""
    from trtopt.cli.main import main as trtopt_main

    out = io.StringIO()
    with redirect_stdout(out):
        code = trtopt_main(["build", str(model), "--int8", "--calib", str(calib), "-o", str(plan), "--json", *flags])
    return json.loads(out.getvalue()) if code == 0 else code


def run(count: int, held_out: int, workdir: Path) -> list[dict[str, Any]]:
    from trtopt.engine import Engine

    model = folder() / "slovorez-test.onnx"
    calib, held = words(count, held_out)
    np.savez(workdir / "calib.npz", **calib)
    reference = session(model)(held)["output_0"]
    rows = []
    variants = (("trtopt default", ()), ("trtopt, every layer INT8 (--no-auto-exclude)", ("--no-auto-exclude",)))
    for name, flags in variants:
        summary = build(model, workdir / "calib.npz", workdir / "plan.engine", *flags)
        if isinstance(summary, int):
            rows.append({"plan": name, "refused": summary})
            continue
        with Engine.load(workdir / "plan.engine") as engine:
            tags = engine.infer(held)["output_0"]
        rows.append({"plan": name, "summary": summary, **scores(tags, reference, held["input_layer"])})
    quantized = ort_quantized(model, {k: v[:, None] for k, v in calib.items()}, workdir)
    if isinstance(quantized, str):
        rows.append({"plan": "ORT quantize_static", "refused": quantized})
    else:
        rows.append({"plan": "ORT quantize_static", **scores(session(quantized)(held)["output_0"], reference,
                                                             held["input_layer"])})  # fmt: skip
    return rows


def report(rows: list[dict[str, Any]], count: int, held_out: int, argv: list[str]) -> str:
    from bench_optimizer import machine_lines

    lines = [
        "## Hold-out round 8: a character tagger (slovorez's morpheme segmenter, float16 tf2onnx; CPU)",
        "",
        *machine_lines(argv),
        f"- data: slovorez 0.1.0's own dictionary, shuffled (seed {SEED}): {count} calibration words, then"
        f" {held_out} held-out words of up to {LETTERS} letters",
        "",
        "| plan | layers kept float (why) | held-out letters tagged as FP32 | words tagged as FP32 "
        "| cosine of the tag probabilities |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['plan']} | refused: {r['refused']} | | | |")
            continue
        floats = r.get("summary", {}).get("float_layers", {})
        kept = "; ".join(f"{k.rsplit('/', 2)[-2]} ({v.split(' (')[0]})" for k, v in floats.items()) or "none"
        lines.append(f"| {r['plan']} | {kept if 'summary' in r else '–'} | {r['letters']:.2%} | {r['words']:.1%} "
                     f"| {r['cosine']:.5f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["fetch", "run"])
    parser.add_argument("--count", type=int, default=64, help="calibration words (default 64)")
    parser.add_argument("--held-out", type=int, default=512, help="held-out words (default 512)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    args = parser.parse_args(argv)
    if args.action == "fetch":
        fetch()
        return 0
    if not all((folder() / member).is_file() for member in MEMBERS):
        print("error: the model is not fetched; run python tools/bench_tagger.py fetch", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="trtopt-tagger-") as tmp:
        rows = run(args.count, args.held_out, Path(tmp))
    text = report(rows, args.count, args.held_out, ["tools/bench_tagger.py", *argv])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
