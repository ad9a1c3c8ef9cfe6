#!/usr/bin/env python3
"""A local Triton Inference Server for tests and benchmarks: the one PyPI's `nvidia-pytriton` wheel ships.

    python tools/triton_env.py            # install it (once; cached), print where it is
    python tools/triton_env.py --check    # only say whether it is there and usable

`nvidia-pytriton==0.7.0` bundles Triton 2.51.0's `tritonserver`, `libtritonserver` (in the wheel's
`nvidia_pytriton.libs`) and the Python backend with one stub per Python version (its CHANGELOG, and
`pytriton/utils/distribution.py` for the layout). It pins numpy<2, so it lives in its own virtual
environment, `$TRTOPT_CACHE_DIR/triton-venv` (default `~/.cache/trtopt`), never in trtopt's: only its
files are used, by path. Nothing else of Triton installs from PyPI (no TensorRT or ONNX Runtime backend).

The Python backend runs `model.py` in a stub process linked against one libpython, and that stub is
built against numpy 1.x: with numpy 2 in its environment it misreads tensors (a BYTES input of n bytes
arrives as n/4 elements). So the model's packages come from this same numpy<2 venv, which also gets
what `trtopt.Engine` imports to serve a plan (onnx, onnx-graphsurgeon, onnxruntime, pillow), pinned to
the versions of the environment that installs it so both compute alike; trtopt itself is not installed.
A model names its packages' environment in EXECUTION_ENV_PATH: a folder with `bin/activate`, which the
backend sources before it starts the stub with `<env>/lib` first on LD_LIBRARY_PATH (python_backend README,
"Creating Custom Execution Environments"; src/stub_launcher.cc of r24.10). The embedded interpreter then
finds `python3` first on PATH, reads the `pyvenv.cfg` beside it and takes that venv's site-packages
(CPython's getpath; PyTriton relies on the same by putting its environment's bin first on PATH,
pytriton/server/triton_server.py). `stub_env` makes such a folder: a venv without pip, on the server venv's
Python, whose `.pth` file adds the trtopt source under test and the server venv's site-packages, with that
Python's libpython linked into its lib/.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PYTRITON = "nvidia-pytriton==0.7.0"
TRITON_VERSION = "2.51.0"


class Unavailable(Exception):
    """The local server cannot run here; the message says why and how to fix it."""


SERVING_DEPS = ("onnx", "onnx-graphsurgeon", "onnxruntime", "pillow")  # what Engine imports to serve a plan


@dataclass(frozen=True)
class ServerDist:
    """Paths into the installed server venv."""

    venv: Path
    site: Path  # its site-packages
    python_version: str  # X.Y of its Python: the stub that must run

    @property
    def root(self) -> Path:
        return self.site / "pytriton" / "tritonserver"

    @property
    def libs(self) -> Path:
        return self.site / "nvidia_pytriton.libs"

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        return self.root / "python_backend_stubs" / self.python_version / "triton_python_backend_stub"

    def backend_directory(self, into: Path) -> Path:
        """A --backend-directory whose python backend has the stub for the venv's Python."""
        python = into / "python"
        python.mkdir(parents=True, exist_ok=True)
        for item in (self.root / "backends" / "python").iterdir():
            if item.is_file():
                shutil.copy2(item, python / item.name)
        shutil.copy2(self.stub, python / "triton_python_backend_stub")
        return into


def cache_root() -> Path:
    base = os.environ.get("TRTOPT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "trtopt")
    return Path(base)


def venv_dir() -> Path:
    return Path(os.environ.get("TRTOPT_TRITON_VENV") or cache_root() / "triton-venv")


def find_server() -> ServerDist:
    """The installed server, checked usable; else `Unavailable` with the reason."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise Unavailable(f"nvidia-pytriton's server is for x86_64 Linux; this is {sys.platform} {platform.machine()}")
    libc = platform.libc_ver()
    if libc[0] == "glibc" and tuple(int(p) for p in libc[1].split(".")[:2]) < (2, 35):
        raise Unavailable(f"nvidia-pytriton's server needs glibc 2.35 or newer; this has {libc[1]}")
    sites = [s for s in sorted(venv_dir().glob("lib/python3*/site-packages")) if (s / "pytriton").is_dir()]
    missing = (
        [d for d in SERVING_DEPS if not list(sites[0].glob(f"{d.replace('-', '_')}-*.dist-info"))] if sites else []
    )
    if not sites or missing:
        what = f"{PYTRITON}" + (f" ({', '.join(missing)} missing)" if missing else "")
        raise Unavailable(f"no complete Triton server venv at {venv_dir()}: run `python tools/triton_env.py` to "
                          f"install {what}")  # fmt: skip
    dist = ServerDist(venv_dir(), sites[0], sites[0].parent.name.removeprefix("python"))
    if not dist.binary.is_file() or not dist.stub.is_file():
        raise Unavailable(f"{PYTRITON} in {venv_dir()} has no server or no stub for Python {dist.python_version}")
    if libpython(dist) is None:
        raise Unavailable(
            f"the Python of {venv_dir()} has no shared libpython{dist.python_version}, which the stub needs"
        )
    return dist


def libpython(dist: ServerDist) -> Path | None:
    """The shared library of the venv's Python (the stub links against libpythonX.Y.so.1.0)."""
    name = f"libpython{dist.python_version}.so.1.0"
    query = "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')"
    found = subprocess.run([str(dist.venv / "bin" / "python"), "-c", query], capture_output=True, text=True)
    for folder in (found.stdout.strip(), "/usr/lib/x86_64-linux-gnu", "/usr/lib"):
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def stub_env(into: Path, dist: ServerDist) -> Path:
    """An execution environment (EXECUTION_ENV_PATH) in which the stub imports the server venv's packages
    and the trtopt that is imported here (see the module docstring)."""
    import trtopt

    if not (into / "bin" / "activate").is_file():
        python = str(dist.venv / "bin" / "python")
        subprocess.run([python, "-m", "venv", "--without-pip", str(into)], check=True, capture_output=True)
    packages = into / "lib" / f"python{dist.python_version}" / "site-packages"
    paths = [str(Path(trtopt.__file__).resolve().parents[1]), str(dist.site)]
    (packages / "trtopt_stub_env.pth").write_text("".join(f"{p}\n" for p in paths), encoding="utf-8")
    found = libpython(dist)
    if found is not None and not (into / "lib" / found.name).exists():
        (into / "lib" / found.name).symlink_to(found)
    return into


def version_mismatches(dist: ServerDist) -> list[str]:
    """SERVING_DEPS whose version in the server venv differs from this environment's (then the served plan
    may compute differently from the same plan run here)."""
    from importlib import metadata

    mismatches = []
    for name in SERVING_DEPS:
        try:
            here = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        found = metadata.distributions(path=[str(dist.site)])
        there = [d.version for d in found if d.metadata["Name"].lower().replace("_", "-") == name]
        if there and there[0] != here:
            mismatches.append(f"{name} {there[0]} (here {here})")
    return mismatches


def install() -> Path:
    """Create the server's own venv with the pinned wheel and the serving dependencies (idempotent)."""
    from importlib import metadata

    target = venv_dir()
    python = target / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    pins = []
    for name in SERVING_DEPS:
        try:
            pins.append(f"{name}=={metadata.version(name)}")  # compute as the installing environment does
        except metadata.PackageNotFoundError:
            pins.append(name)
    command = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", PYTRITON, *pins]
    subprocess.run(command, check=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check, install nothing")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            install()  # a no-op in seconds when all is there; re-pins when this environment's versions moved
        dist = find_server()
    except Unavailable as exc:
        print(f"unavailable: {exc}")
        return 1
    stale = version_mismatches(dist)
    if stale:
        print(f"unavailable: the server venv's {', '.join(stale)} differ from this environment's")
        return 1
    print(f"Triton {TRITON_VERSION} server: {dist.binary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
