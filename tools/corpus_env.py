"""The side environments the export corpus is made in: TensorFlow + tf2onnx, PyTorch + torchvision, Paddle +
paddle2onnx, each pinned and in its own virtual environment under `$TRTOPT_CORPUS_ENV` (default
`~/.cache/trtopt/corpus-env/<name>`), never in trtopt's: the frameworks pin numpy and protobuf against each other
and are hundreds of MB, and trtopt itself needs none of them.

    python tools/corpus_env.py [NAME ...]      # create (once; cached) and print where each is

CPU-only wheels where the registry has them (`tensorflow-cpu`). PyPI's torch pulls its CUDA libraries (about 3 GB,
a few minutes); its `+cpu` builds are not on PyPI, and torchvision's PyPI wheel does not load its operators with
a `+cpu` torch ("operator torchvision::nms does not exist"), so the PyPI pair is pinned. paddle2onnx imports
`packaging` without declaring it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Sequence
from pathlib import Path

REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "tf": ("tensorflow-cpu==2.21.0", "tf2onnx==1.17.0"),
    "torch": ("torch==2.14.1", "torchvision==0.29.1", "onnx", "onnxscript", "onnx2torch==1.5.15"),
    "paddle": ("paddlepaddle==3.3.1", "paddle2onnx==2.1.0", "packaging"),
}
_STAMP = "trtopt-corpus-requirements.txt"


class EnvError(Exception):
    """A side environment could not be made; the message says why."""


def env_root() -> Path:
    return Path(os.environ.get("TRTOPT_CORPUS_ENV") or Path.home() / ".cache" / "trtopt" / "corpus-env")


def python_of(name: str) -> Path:
    return env_root() / name / "bin" / "python"


def is_ready(name: str) -> bool:
    """Whether env `name` exists with exactly the pinned requirements installed."""
    stamp = env_root() / name / _STAMP
    return python_of(name).exists() and stamp.is_file() and stamp.read_text() == _pins(name)


def _pins(name: str) -> str:
    if name not in REQUIREMENTS:
        raise EnvError(f"no side environment named {name!r}; known: {', '.join(REQUIREMENTS)}")
    return "\n".join(REQUIREMENTS[name]) + "\n"


def ensure(name: str) -> Path:
    """Create env `name` when it is missing or its pins changed; return its Python."""
    if is_ready(name):
        return python_of(name)
    folder = env_root() / name
    if not python_of(name).exists():
        venv.EnvBuilder(with_pip=True).create(folder)
    print(f"installing {' '.join(REQUIREMENTS[name])} into {folder} (once)", file=sys.stderr, flush=True)
    command = [str(python_of(name)), "-m", "pip", "install", "--disable-pip-version-check", "-q",
               *REQUIREMENTS[name]]
    result = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        tail = " ".join(result.stderr.strip().splitlines()[-3:])
        raise EnvError(f"pip could not install the {name!r} corpus environment: {tail or 'no reason given'}")
    (folder / _STAMP).write_text(_pins(name))
    return python_of(name)


def main(argv: Sequence[str] | None = None) -> int:
    names = list(argv if argv is not None else sys.argv[1:]) or list(REQUIREMENTS)
    try:
        for name in names:
            print(ensure(name))
    except EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
