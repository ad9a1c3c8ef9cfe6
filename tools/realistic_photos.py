#!/usr/bin/env python3
"""Camera-sized JPEGs made from the shipped calibration photos, for benchmarks that must decode real sizes.

    python tools/realistic_photos.py DEST --count 512 [--size 2880x1920] [--quality 90]

calib_data/ holds real photos with a 256 px shorter side; a user calibrates on camera output. Each photo
is upscaled (bicubic) to --size (turned for portrait photos), given Gaussian grain (sigma 4 levels, like
sensor noise: without it the upscaled image is so smooth that its JPEG decodes unrealistically fast) and
saved as a baseline JPEG at --quality. Photos repeat past 154, mirrored on odd rounds and with other
grain, so every file differs. Nothing is downloaded; files go to DEST (use a temporary folder; never
commit them: about 1 MB each).
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CALIB_DIR = ROOT / "calib_data"
GRAIN_SIGMA = 4.0
SHIFTS = 97


def make_photos(dest: Path, count: int, size: tuple[int, int] = (2880, 1920), quality: int = 90) -> list[Path]:
    """`count` JPEGs of `size` (width, height; swapped for portrait sources) in `dest`; returns their paths."""
    sources = sorted(CALIB_DIR.glob("*.jpg"))
    dest.mkdir(parents=True, exist_ok=True)
    side = max(size) + SHIFTS
    grain = np.random.default_rng(0).normal(0.0, GRAIN_SIGMA, (side, side, 3)).astype(np.int16)

    def make(index: int) -> Path:
        path = dest / f"photo_{index:04d}.jpg"
        if path.is_file():
            return path
        image = Image.open(sources[index % len(sources)]).convert("RGB")
        if (index // len(sources)) % 2:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        width, height = size if image.width >= image.height else size[::-1]
        big = np.asarray(image.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
        top, left = (index * 7919) % SHIFTS, (index * 104729) % SHIFTS  # other grain for every file
        noise = grain[top : top + height, left : left + width]
        pixels = np.clip(big + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(path, quality=quality)
        return path

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(make, range(count)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--count", type=int, default=128)
    parser.add_argument("--size", default="2880x1920", help="WIDTHxHEIGHT of a landscape photo")
    parser.add_argument("--quality", type=int, default=90)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    paths = make_photos(args.dest, args.count, (width, height), args.quality)
    total = sum(p.stat().st_size for p in paths) / 2**20
    print(f"wrote {len(paths)} photos of {width}x{height} ({total:.0f} MiB) to {args.dest}")


if __name__ == "__main__":
    main()
