#!/usr/bin/env python3
"""Make the .npz sets of the hold-out check's non-image models in calib_arrays/ (committed; run this only to
remake them). Needs the cached lore-detect model (python tools/bench_holdout.py fetch).

    python tools/make_holdout_arrays.py

- lore_process.npz: the feeds of LORE's second stage (lineless-table-rec 0.0.8, `lore_process.onnx`):
  `slct_logi_feat` [N, K, 256] float32 and `dets` [N, K, 8] int64, N samples along the inputs' batch axis, K = 64
  cells per page. They are what the FP32 first stage (`lore_detect.onnx`) gives on document pages, decoded
  the way the package does (lineless_table_rec/process.py, `DetProcess` and `ctdet_4ps_decode`, itself after
  CenterNet, github.com/xingyizhou/CenterNet): sigmoid of the heat map's first channel, 3x3 max-pool peaks,
  the top K; `dets` are the 8 corner coordinates (centre minus the `wh` offsets, on the 192x192 output grid);
  `slct_logi_feat` is `ax` at the centre plus `cr` summed over the 4 corners. Two differences, said here:
  K is fixed at 64 (the package keeps the cells scoring >= 0.15, a number that varies per page), and corner
  indices outside the grid are clipped to it (the package would index out of range or wrap).
  The pages: the 16 of `calib_text/pages` first, then 16 rendered by `tools/make_text_calib.py --seed 2`
  (bench_zoo evaluates an .npz on its last samples, so those are never calibrated on; held-out text sets
  use seed 1).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_holdout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZE, K = 768, 64
MEAN = np.array([0.408, 0.447, 0.470], np.float32)  # lineless_table_rec/main.py, on BGR channels
STD = np.array([0.289, 0.274, 0.278], np.float32)


def lore_input(path: Path) -> np.ndarray:
    """The package's preprocessing: longest side to 768, image at the top left, black around it, BGR."""
    image = Image.open(path).convert("RGB")
    scale = SIZE / max(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
    canvas = np.zeros((SIZE, SIZE, 3), np.float32)
    canvas[: image.height, : image.width] = np.asarray(image, np.float32)[:, :, ::-1]
    return ((canvas / 255.0 - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)


def decode(hm: np.ndarray, wh: np.ndarray, ax: np.ndarray, cr: np.ndarray, reg: np.ndarray) -> tuple:
    """The top K cells of one page: (features [K, 256], corners [K, 8] int64)."""
    heat = 1 / (1 + np.exp(-np.clip(hm[0, 0].astype(np.float64), -60, 60)))
    height, width = heat.shape
    padded = np.pad(heat, 1)
    peak = np.max([padded[i : i + height, j : j + width] for i in range(3) for j in range(3)], axis=0)
    flat = np.where(peak == heat, heat, 0).ravel()
    inds = np.argsort(-flat, kind="stable")[:K]
    ys, xs = (inds // width).astype(np.float32), (inds % width).astype(np.float32)

    def at(feature: np.ndarray, where: np.ndarray) -> np.ndarray:
        return feature[0].reshape(feature.shape[1], -1)[:, where].T

    offset = at(reg, inds)
    xs, ys = xs + offset[:, 0], ys + offset[:, 1]
    sides = at(wh, inds)
    corners = np.stack([(xs if i % 2 == 0 else ys) - sides[:, i] for i in range(8)], axis=1)
    flat_corners = corners[:, 0::2] + width * np.round(corners[:, 1::2])
    flat_corners = np.clip(np.round(flat_corners).astype(np.int64), 0, height * width - 1)
    features = at(ax, inds) + sum(at(cr, flat_corners[:, c]) for c in range(4))
    return features.astype(np.float32), corners.astype(np.int32).astype(np.int64)


def main() -> int:
    model = bench_holdout.cached(next(m for m in bench_holdout.HOLDOUT if m.name == "lore-detect"))
    if model is None:
        raise SystemExit("lore-detect is not cached: run python tools/bench_holdout.py fetch")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory(prefix="trtopt-holdout-arrays-") as tmp:
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_text_calib.py"), "--out", tmp, "--lines", "0",
                        "--pages", "16", "--seed", "2"], check=True, capture_output=True, cwd=ROOT)  # fmt: skip
        shipped = sorted((ROOT / "calib_text" / "pages").glob("*.jpg"))[:16]  # the set held 16 pages when made
        pages = shipped + sorted(Path(tmp, "pages").glob("*"))
        feeds = []
        for page in pages:
            hm, _, wh, ax, cr, reg = session.run(None, {"input": lore_input(page)})
            feeds.append(decode(hm, wh, ax, cr, reg))
    out = ROOT / "calib_arrays" / "lore_process.npz"
    np.savez(out, slct_logi_feat=np.stack([f for f, _ in feeds]), dets=np.stack([d for _, d in feeds]))
    print(f"wrote {out.relative_to(ROOT)}: {len(feeds)} feeds of {K} cells", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
