#!/usr/bin/env python3
"""FP32 sanity checks of the zoo's preprocessing: each cached model runs in ONNX Runtime on inputs made by
trtopt's own pipeline from the catalog's flags, and its output is decoded and checked to make sense.

    python tools/zoo_sanity.py [NAME ...]

Inputs are rendered here with the DejaVu fonts matplotlib ships (known text at a known place), or taken
from calib_text/ and calib_data/; the checks are the ones a person would make: the recogniser reads the
rendered words, the text detector's map is high on the text and low off it, the orientation models tell
upright from turned, the detectors find boxes. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo  # noqa: E402

from trtopt.cli.preprocess_args import add_preprocess_arguments, overrides_from_args  # noqa: E402
from trtopt.data import PreprocessSpec, preprocess_images, spec_for_input  # noqa: E402
from trtopt.execution.ort_session import OrtSession  # noqa: E402

Check = Callable[["Model"], str]


class Model:
    """A cached zoo model with its preprocessing spec (from the catalog's flags, as the CLI parses them)."""

    def __init__(self, entry: zoo.ZooModel, path: Path) -> None:
        self.entry, self.onnx = entry, onnx.load(path)
        self.session = OrtSession(self.onnx)
        first = self.onnx.graph.input[0]
        dims = [d.dim_value or d.dim_param for d in first.type.tensor_type.shape.dim]
        self.shape = tuple(entry.input_shape or dims)
        self.spec: PreprocessSpec | None = None
        if entry.preprocess:
            parser = argparse.ArgumentParser()
            add_preprocess_arguments(parser)
            args = parser.parse_args(list(entry.preprocess))
            elem = onnx.helper.tensor_dtype_to_np_dtype(first.type.tensor_type.elem_type)
            self.spec = spec_for_input(self.shape, elem, args.preset, name=first.name,
                                       overrides=overrides_from_args(args))

    def __call__(self, images: list[Image.Image]) -> list[np.ndarray]:
        assert self.spec is not None
        feeds = {self.onnx.graph.input[0].name: preprocess_images(images, self.spec)}
        names = [o.name for o in self.onnx.graph.output]
        outputs = [self.session.run({k: v[i : i + 1] for k, v in feeds.items()}) for i in range(len(images))]
        return [np.concatenate([o[n] for o in outputs]) for n in names]

    def metadata(self, key: str) -> list[str]:
        return next((p.value.split("\n") for p in self.onnx.metadata_props if p.key == key), [])


def font(size: int, name: str = "DejaVuSans.ttf") -> ImageFont.FreeTypeFont:
    import matplotlib

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name), size)


def line(text: str, size: int = 32, grey: bool = False) -> Image.Image:
    f = font(size)
    left, top, right, bottom = f.getbbox(text)
    img = Image.new("RGB", (right - left + 16, bottom - top + 12), (245, 245, 240))
    ImageDraw.Draw(img).text((8 - left, 6 - top), text, font=f, fill=(10, 10, 10))
    return img.convert("L").convert("RGB") if grey else img


def ctc_greedy(logits: np.ndarray, charset: list[str], blank: int = 0) -> str:
    best = logits.argmax(-1)
    chars = [charset[i] for j, i in enumerate(best) if i != blank and (j == 0 or i != best[j - 1]) and i < len(charset)]
    return "".join(chars)


WORDS = ["Invoice 2024", "HELLO WORLD", "trtopt 0.99", "Total: 58.20 EUR"]


def check_ppocr_rec(m: Model) -> str:
    charset = ["", *m.metadata("character"), " "]  # PaddleOCR: blank first, space last (use_space_char)
    (probs,) = m([line(w) for w in WORDS])
    read = [ctc_greedy(p, charset) for p in probs]
    ok = sum(r.replace(" ", "").lower() == w.replace(" ", "").lower() for r, w in zip(read, WORDS, strict=True))
    return _verdict(ok >= 3, f"read {read} for {WORDS}")


def check_ddddocr_ocr(m: Model) -> str:
    words = ["a7kx3", "mDKc", "2b9fq"]
    logits = [m([line(w, 40, grey=True)])[0][:, 0] for w in words]  # (T, 1, classes) per word
    segments = [len(ctc_greedy(t, [chr(0x100 + k) for k in range(t.shape[-1])])) for t in logits]
    lengths = [len(w) for w in words]
    return _verdict(segments == lengths, f"non-blank CTC segments {segments} for words of {lengths} characters "
                    "(the charset lives in the package's code, not the model: with it, the words read a7kx3, mDkc, "
                    "2b9fq)")


def check_text_detect(m: Model) -> str:
    page = Image.new("RGB", (640, 640), (250, 250, 248))
    draw = ImageDraw.Draw(page)
    draw.text((60, 200), "Calibration needs real text", font=font(36), fill=(0, 0, 0))
    (score,) = m([page])
    box = np.zeros(score.shape[2:], bool)
    box[195:245, 55:620] = True  # the line of text and a few pixels around it
    text = score[0, 0] > 0.3  # PaddleOCR's binarisation threshold (DBPostProcess thresh)
    inside, covered = (text & box).sum() / max(1, text.sum()), (text & box).sum() / box.sum()
    return _verdict(inside > 0.95 and covered > 0.15, f"{inside:.1%} of the pixels over 0.3 lie on the text line, "
                    f"covering {covered:.0%} of its box")


def check_orientation(m: Model) -> str:
    if m.entry.name == "ppocr-cls":
        up = [line(w) for w in WORDS]
        images, want = up + [i.rotate(180) for i in up], [0] * 4 + [1] * 4
    else:
        page = Image.open(sorted((zoo.CALIB_DIRS["pages"]).glob("*.jpg"))[0]).convert("RGB")
        # rotate() turns counter-clockwise; the labels (0, 90, 180, 270) name the clockwise turn
        images, want = [page.rotate(a, expand=True) for a in (0, 90, 180, 270)], [0, 3, 2, 1]
    (probs,) = m(images)
    got = probs.argmax(-1).tolist()
    return _verdict(sum(g == w for g, w in zip(got, want, strict=True)) >= len(want) - 1, f"classes {got}, "
                    f"expected {want}")


def check_classify(m: Model) -> str:
    folder = zoo.CALIB_DIRS["photos" if m.entry.name == "open-nsfw" else "pages"]
    (probs,) = m([Image.open(p).convert("RGB") for p in sorted(folder.glob("*.jp*g"))[:8]])
    probs = probs if np.allclose(probs.sum(-1), 1, atol=1e-3) else _softmax(probs)
    return _verdict(bool(np.isfinite(probs).all()), f"classes {probs.argmax(-1).tolist()}, mean p "
                    f"{np.round(probs.mean(0), 3).tolist()}")


def check_yolox(m: Model) -> str:
    page = Image.new("RGB", (300, 100), (240, 240, 235))
    ImageDraw.Draw(page).text((20, 20), "k 7 Q x", font=font(48), fill=(20, 20, 20))
    (pred,) = m([page])
    score = pred[0, :, 4] * pred[0, :, 5]
    return _verdict(int((score > 0.5).sum()) >= 3, f"{int((score > 0.5).sum())} anchors over 0.5 "
                    f"(4 characters drawn; before NMS), max {score.max():.2f}")


def check_layout(m: Model) -> str:
    pages = [Image.open(p).convert("RGB") for p in sorted(zoo.CALIB_DIRS["pages"].glob("*.jpg"))[:3]]
    outputs = m(pages)
    scores = np.concatenate(outputs[:4], axis=1)  # class scores per anchor, 4 strides
    names = m.metadata("character")
    found = {names[c]: int((scores[..., c] > 0.5).sum()) for c in range(scores.shape[-1])}
    found = {k: v for k, v in found.items() if v}
    return _verdict(bool({"text", "title", "table"} & set(found)), f"anchors over 0.5 (rapid-layout's threshold) "
                    f"per class on 3 pages: {found}")


def check_raw(m: Model) -> str:
    data = np.load(zoo.calib_path(m.entry))
    ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in m.onnx.graph.input}
    feeds = {k: data[k][0] if data[k][0].ndim == ranks[k] else data[k][:1] for k in data.files}  # a feed, a sample
    outputs = m.session.run(feeds)
    return _verdict(all(np.isfinite(v).all() for v in outputs.values()),
                    ", ".join(f"{k}: {np.asarray(v).ravel()[:3].round(3).tolist()}" for k, v in outputs.items()))


CHECKS: dict[str, Check] = {"ctc": check_ppocr_rec, "text-detect": check_text_detect, "orientation": check_orientation,
                            "classify": check_classify, "detect-yolox": check_yolox, "layout": check_layout,
                            "raw": check_raw}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _verdict(ok: bool, text: str) -> str:
    return ("ok    " if ok else "FAILED") + " " + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*")
    names = parser.parse_args(argv).names or [m.name for m in zoo.catalog()]
    failed = 0
    for name in names:
        path = zoo.cached_path(name)
        if path is None:
            print(f"{name:18s} skipped: not cached (python tools/zoo.py fetch {name})")
            continue
        model = Model(zoo.model_named(name), path)
        check = check_ddddocr_ocr if name == "ddddocr-ocr" else CHECKS[model.entry.task]
        verdict = check(model)
        failed += verdict.startswith("FAILED")
        print(f"{name:18s} {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
