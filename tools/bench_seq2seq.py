#!/usr/bin/env python3
"""Hold-out round 8: a character-level seq2seq model (token inputs, a GRU encoder, an attention decoder run
step by step in a beam search) that nothing in trtopt was tuned on, judged on its own task.

    python tools/bench_seq2seq.py fetch          # pip download arabic-name-romanizer; check licence and sha256
    python tools/bench_seq2seq.py run [--count 64] [--held-out 256] [--out FILE.md]

Models (arabic-name-romanizer 0.2.0, MIT; weights and name index derived from Wikidata, CC0, and the other
sources its THIRD_PARTY_NOTICES.md lists, kept with it): two transliterators, Arabic-script and Persian-script
names to Latin, each an `encoder.onnx` (int64 token ids and a bool padding mask [batch, src_len]; two `GRU`
ops) and a `decoder.onnx` (one step: the last token of the prefix, the encoder's memory and mask, the GRU state;
Gemm/Sigmoid/Tanh cells, attention as MatMul/Softmax, LogSoftmax over 160 or 148 characters).

Data: the wheel's own name index (`names.sqlite3`, table `units`: one name, its Latin spelling, country, role),
shuffled with a fixed seed; the first `--count` names calibrate, the next `--held-out` judge. Persian-script
countries (IR, AF, PK) go to the Persian model, the rest to the Arabic one. The index is what the models were
trained from, so held-out means held out from calibration, not unseen by the model.

Calibration feeds are made as the package runs its models: the encoder's `.npz` holds the token ids padded to
16 (`src`, `src_mask`); the decoder's holds the step inputs the package's FP32 beam search (width 2) gives it
on the calibration names, cut to the last prefix token (the only one the decoder reads), 256 steps drawn at
random. Both plans are built as a user would (`trtopt build --int8 --calib feeds.npz`, every default). Judged:
the package's beam search with the INT8 plans in place of ONNX Runtime, names transliterated exactly as FP32
does, and exact matches with the index's spelling; beside it ONNX Runtime's `quantize_static` on the same feeds.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sqlite3
import sys
import tempfile
import time
import zipfile
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo  # noqa: E402
from bench_vad import _checked, _download, ort_quantized  # noqa: E402

PACKAGE = ("arabic-name-romanizer", "0.2.0", "f70b89614d9b5866dcf911d098c5e45d2b1f559461f238e8c5259b731fcf2a7e")
SHA256 = {  # member of the wheel's resources/ -> sha256, as its CHECKSUMS.txt gives them
    "encoder.onnx": "f5d65df2189e5ec3929a3167d70de5f1f9eedd89dab964875039089581c5ec49",
    "decoder.onnx": "2365c42d362313c21748750eefebf3a61fd8045f73a98644176eca538200841a",
    "persian/encoder.onnx": "d299a54a99bd7f3463d710dd5636c2efdf5485808ff42468785624feb69ee686",
    "persian/decoder.onnx": "6cb38552dcddf92b92842a146a60a37d29ee5d07e02aabda7213f9c241eb7936",
    "names.sqlite3": "d475ffa773e08a8bbe79a0ccd48d79336a84b25bda76a6a38fd53089392c8be0",
}  # fmt: skip
MODELS = {"arabic": ("resources", "country NOT IN ('IR', 'AF', 'PK')"),
          "persian": ("resources/persian", "country IN ('IR', 'AF', 'PK')")}  # fmt: skip
WIDTH, DECODER_FEEDS, SEED = 16, 256, 0


def folder() -> Path:
    return zoo.cache_dir() / "seq2seq-holdout"


def fetch() -> None:
    """The package's Python modules (pure numpy: its vocabulary and beam search) and resources, checked."""
    target = folder() / "arabic_name_romanizer"
    with (
        tempfile.TemporaryDirectory(prefix="trtopt-seq2seq-") as tmp,
        zipfile.ZipFile(_download(PACKAGE, Path(tmp), binary=True)) as wheel,
    ):
        licence = wheel.read("arabic_name_romanizer-0.2.0.dist-info/licenses/LICENSE").decode()
        if not licence.startswith("MIT License"):
            raise SystemExit("error: arabic-name-romanizer's wheel is not MIT-licensed as recorded")
        for member in wheel.namelist():
            if member.startswith("arabic_name_romanizer/"):
                data = wheel.read(member)
                inside = member.removeprefix("arabic_name_romanizer/resources/")
                if inside in SHA256:
                    _checked(data, SHA256[inside], member)
                (folder() / member).parent.mkdir(parents=True, exist_ok=True)
                (folder() / member).write_bytes(data)
        for notice in ("LICENSE", "THIRD_PARTY_NOTICES.md"):
            (folder() / notice).write_bytes(wheel.read(f"arabic_name_romanizer-0.2.0.dist-info/licenses/{notice}"))
    print(f"fetched into {target}", file=sys.stderr)


def names(which: str, count: int, held_out: int) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """(calibration, held-out) rows of the index for one model: (arabic, latin, country, role)."""
    where = MODELS[which][1]
    index = folder() / "arabic_name_romanizer/resources/names.sqlite3"
    with sqlite3.connect(index) as db:
        rows = db.execute(f"SELECT arabic_key, latin, country, role FROM units WHERE {where} ORDER BY rowid").fetchall()
    random.Random(SEED).shuffle(rows)
    return rows[:count], rows[count:count + held_out]


class Backend:
    """The package's backend protocol (encode, step) over two callables; sources padded to `WIDTH`, the
    decoder fed the last prefix token."""

    def __init__(self, vocab: Any, encoder: Any, decoder: Any) -> None:
        self.pad, self.encoder, self.decoder, self.steps = vocab.pad_id, encoder, decoder, []

    def encode(self, src: np.ndarray, src_mask: np.ndarray) -> dict[str, np.ndarray]:
        src = np.pad(src, ((0, 0), (0, WIDTH - src.shape[1])), constant_values=self.pad)
        out = self.encoder({"src": src, "src_mask": src == self.pad})
        return {"memory": out["memory_out"], "src_mask": out["src_mask_out"], "hidden": out["hidden_out"]}

    def step(self, prefix: np.ndarray, state: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feed = {"prefix": prefix[:, -1:], **state}
        self.steps.append(feed)
        out = self.decoder(feed)
        return out["logprobs"], {**state, "hidden": out["hidden_out"]}


def session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    s = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names_ = [o.name for o in s.get_outputs()]
    return lambda feed: dict(zip(names_, s.run(None, feed), strict=True))


def transliterate(package: Any, model_dir: Path, backend: Backend, rows: list[tuple[str, ...]]) -> list[str]:
    meta = json.loads((model_dir / "meta.json").read_text())
    vocab = package.vocab.CharVocab.load(model_dir / "vocab.json")
    sources = [package.inference.encode_source_ids(vocab, a, c or None, r) for a, _, c, r in rows]
    found = package.inference.beam_search(backend, sources, vocab, meta["beam_width"], meta["max_tgt_len"],
                                          meta["length_alpha"])  # fmt: skip
    return [best[0][0] for best in found]


def run_one(which: str, count: int, held_out: int, workdir: Path) -> dict[str, Any]:
    from trtopt.cli.main import main as trtopt_main
    from trtopt.engine import Engine

    sys.path.insert(0, str(folder()))
    import arabic_name_romanizer.inference
    import arabic_name_romanizer.vocab

    package = arabic_name_romanizer
    model_dir = folder() / "arabic_name_romanizer" / MODELS[which][0]
    vocab = package.vocab.CharVocab.load(model_dir / "vocab.json")
    fits = lambda rows: [r for r in rows  # noqa: E731 - the plans take sources of up to WIDTH tokens
                         if len(package.inference.encode_source_ids(vocab, r[0], r[2] or None, r[3])) <= WIDTH]
    calib, held = (fits(rows) for rows in names(which, count, held_out))
    fp32 = Backend(vocab, session(model_dir / "encoder.onnx"), session(model_dir / "decoder.onnx"))
    transliterate(package, model_dir, fp32, calib)  # the decoder steps FP32's beam search takes on these names
    steps = {k: np.concatenate([s[k] for s in fp32.steps]) for k in fp32.steps[0]}
    pick = np.random.default_rng(SEED).choice(len(steps["prefix"]), min(DECODER_FEEDS, len(steps["prefix"])),
                                              replace=False)  # fmt: skip
    sources = [package.inference.encode_source_ids(vocab, a, c or None, r) for a, _, c, r in calib]
    src = np.full((len(sources), WIDTH), vocab.pad_id, np.int64)
    for i, s in enumerate(sources):
        src[i, : len(s)] = s
    feeds = {"encoder": {"src": src, "src_mask": src == vocab.pad_id},
             "decoder": {k: v[pick] for k, v in steps.items()}}  # fmt: skip
    work = workdir / which
    work.mkdir()
    row: dict[str, Any] = {"model": which, "calib": len(calib), "held": len(held), "builds": {}}
    plans = {}
    for part, feed in feeds.items():
        np.savez(work / f"{part}.npz", **feed)
        plans[part], out, started = work / f"{part}.engine", io.StringIO(), time.perf_counter()
        with redirect_stdout(out):
            code = trtopt_main(["build", str(model_dir / f"{part}.onnx"), "--int8", "--calib",
                                str(work / f"{part}.npz"), "-o", str(plans[part]), "--json"])  # fmt: skip
        if code != 0:
            return row | {"refused": f"{part}: exit {code}"}
        row["builds"][part] = json.loads(out.getvalue()) | {"seconds": time.perf_counter() - started}
    reference = transliterate(package, model_dir, Backend(vocab, fp32.encoder, fp32.decoder), held)
    with Engine.load(plans["encoder"]) as encoder, Engine.load(plans["decoder"]) as decoder:
        ours = transliterate(package, model_dir, Backend(vocab, encoder.infer, decoder.infer), held)
    row["trtopt"] = _scores(ours, reference, held)
    quantized = {}
    for part, feed in feeds.items():  # bench_vad's reader gives one row per call: one sample each, batch axis kept
        quantized[part] = ort_quantized(model_dir / f"{part}.onnx", {k: v[:, None] for k, v in feed.items()}, work)
    failed = [q for q in quantized.values() if isinstance(q, str)]
    ort = Backend(vocab, *(session(q) for q in quantized.values())) if not failed else None
    row["ort"] = failed[0] if ort is None else _scores(transliterate(package, model_dir, ort, held), reference, held)
    row["reference"] = _scores(reference, reference, held)
    return row


def _scores(found: list[str], reference: list[str], rows: list[tuple[str, ...]]) -> dict[str, float]:
    return {"same_as_fp32": float(np.mean([a == b for a, b in zip(found, reference, strict=True)])),
            "index_spelling": float(np.mean([a.lower() == r[1].lower() for a, r in zip(found, rows, strict=True)]))}


def report(rows: list[dict[str, Any]], argv: list[str]) -> str:
    from bench_optimizer import machine_lines

    lines = [
        "## Hold-out round 8: a seq2seq transliterator (token inputs, GRU encoder, beam-search decoder; CPU)",
        "",
        *machine_lines(argv),
        "- data: arabic-name-romanizer 0.2.0's own name index, shuffled (seed 0): calibration names, then held-out"
        " names; the decoder calibrated on the steps of FP32's beam search over the calibration names",
        "",
        "| model | names calib / held out | encoder: INT8 layers, verified ref vs FP32 | decoder: INT8 layers, "
        "verified ref vs FP32 | held-out names as FP32 (trtopt) | index spelling FP32 / trtopt | ORT quantize_static: "
        "as FP32, index spelling |",
        "|---|---:|---|---|---:|---|---|",
    ]
    return "\n".join(lines + [_row(r) for r in rows]) + "\n"


def _row(r: dict[str, Any]) -> str:
    if "refused" in r:
        return f"| {r['model']} | {r['calib']} / {r['held']} | refused ({r['refused']}) | | | | |"

    def built(part: str) -> str:
        s = r["builds"][part]
        return (f"{s['int8_layers']} INT8, {len(s['float_layers'])} float; cosine "
                f"{s['verification']['reference_vs_fp32']['cosine']:.5f} ({s['seconds']:.1f} s)")

    ort = r["ort"]
    ort_cell = f"failed: {ort}" if isinstance(ort, str) else f"{ort['same_as_fp32']:.1%}, {ort['index_spelling']:.1%}"
    return (f"| {r['model']} | {r['calib']} / {r['held']} | {built('encoder')} | {built('decoder')} | "
            f"{r['trtopt']['same_as_fp32']:.1%} | {r['reference']['index_spelling']:.1%} / "
            f"{r['trtopt']['index_spelling']:.1%} | {ort_cell} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["fetch", "run"])
    parser.add_argument("--count", type=int, default=64, help="calibration names per model (default 64)")
    parser.add_argument("--held-out", type=int, default=256, help="held-out names per model (default 256)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    args = parser.parse_args(argv)
    if args.action == "fetch":
        fetch()
        return 0
    if not (folder() / "arabic_name_romanizer/resources/names.sqlite3").is_file():
        print("error: the package is not fetched; run python tools/bench_seq2seq.py fetch", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="trtopt-seq2seq-") as tmp:
        rows = [run_one(which, args.count, args.held_out, Path(tmp)) for which in args.models]
    text = report(rows, ["tools/bench_seq2seq.py", *argv])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
