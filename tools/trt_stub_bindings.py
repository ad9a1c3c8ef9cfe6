"""Make the real TensorRT Python bindings importable on a machine without TensorRT (CI, CPU laptops).

NVIDIA publishes the pybind11 bindings alone on PyPI as a small wheel (`tensorrt-cu13-bindings`, module
``tensorrt_bindings/tensorrt.so``); the native libraries it links (``libnvinfer.so.<major>``,
``libnvonnxparser.so.<major>``, ``libnvinfer_plugin.so.<major>``) come only from NVIDIA's own index. The
module imports just nine C symbols from them (``nm -D --undefined-only tensorrt.so``), and calls none of them
at import. So this script:

1. downloads the bindings wheel with pip (``pip download --no-deps``) into a cache outside the repository,
   ``$TRTOPT_CACHE_DIR/tensorrt-bindings/<version>/`` (default ``~/.cache/trtopt``), and unpacks it;
2. builds three stub libraries with those SONAMEs and symbols using the system C compiler (``$CC`` or
   ``cc``), next to ``tensorrt.so``, where its ``$ORIGIN`` rpath finds them. Each stub prints
   ``trtopt stub: native TensorRT function <name>() called`` and aborts: no native TensorRT code exists here,
   so reaching one means the Python layer accepted the call;
3. writes ``tensorrt.py``, which makes ``import tensorrt`` return the bindings module (what NVIDIA's
   ``tensorrt`` meta-package does on a real install);
4. checks ``import tensorrt`` in a fresh interpreter and marks the folder ready.

With the folder on ``sys.path``, every class, enum, property and method of the real API can be
introspected, and pybind11 checks argument names, counts and types against the real overloads before any
native code runs: tests/test_tensorrt_real_bindings.py is built on that.

    python tools/trt_stub_bindings.py                 # prepare every version, print "<version> <folder>"
    python tools/trt_stub_bindings.py --version 11.4.0.106

Exit status 0 when the TensorRT 11 bindings are ready; 2 with the reason on stderr when not (no C compiler,
no network, no wheel for this Python). A TensorRT 10 wheel missing for this Python is reported and skipped.
Nothing is installed into the running environment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bindings:
    """One bindings wheel on PyPI: pip requirement and TensorRT version."""

    package: str
    version: str
    required: bool  # False: skipped (reported) when no wheel exists for the running Python

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


BINDINGS = (
    Bindings("tensorrt-cu13-bindings", "11.4.0.106", required=True),
    Bindings("tensorrt-cu12-bindings", "10.13.3.9.post1", required=False),
)

# The C symbols tensorrt.so imports, by the library that exports them (same nine in 10.13 and 11.4).
STUB_SYMBOLS = {
    "nvinfer": (
        "createInferBuilder_INTERNAL",
        "createInferRuntime_INTERNAL",
        "createInferRefitter_INTERNAL",
        "getPluginRegistry",
        "getBuilderPluginRegistry",
    ),
    "nvonnxparser": ("createNvOnnxParser_INTERNAL", "createNvOnnxParserRefitter_INTERNAL", "getNvOnnxParserVersion"),
    "nvinfer_plugin": ("initLibNvInferPlugins",),
}
STUB_MESSAGE = "trtopt stub: native TensorRT function {name}() called"
ALIAS = "import sys\n\nimport tensorrt_bindings\n\nsys.modules[__name__] = tensorrt_bindings\n"
READY = "READY"


class SetupError(Exception):
    """Why the bindings cannot be prepared here (printed, exit status 2)."""


def cache_root() -> Path:
    base = os.environ.get("TRTOPT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "trtopt")
    return Path(base) / "tensorrt-bindings"


def prepare(bindings: Bindings, root: Path) -> Path:
    """The folder to put on sys.path for `import tensorrt` (cached: built once per version)."""
    site = root / bindings.version
    if (site / READY).is_file():
        return site
    compiler = _compiler()
    with tempfile.TemporaryDirectory(prefix="trtopt-bindings-") as tmp:
        staging = Path(tmp) / "site"
        _unpack(_download(bindings, Path(tmp)), staging)
        _build_stubs(compiler, bindings.major, staging / "tensorrt_bindings", Path(tmp))
        (staging / "tensorrt.py").write_text(ALIAS)
        _check_import(staging, bindings.version)
        (staging / READY).write_text(bindings.version + "\n")
        if site.exists():
            shutil.rmtree(site)
        site.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(site))
    return site


def _compiler() -> str:
    name = os.environ.get("CC", "cc")
    path = shutil.which(name)
    if path is None:
        raise SetupError(f"no C compiler: {name!r} is not on PATH (set CC, or install gcc) to build the stubs")
    return path


def _download(bindings: Bindings, into: Path) -> Path:
    requirement = f"{bindings.package}=={bindings.version}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", requirement]
    result = subprocess.run([*command, "-d", str(into)], capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise SetupError(f"pip could not fetch {requirement} for Python {sys.version.split()[0]}: {detail}")
    return wheels[0]


def _unpack(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith("tensorrt_bindings/")]
        archive.extractall(site, members)
    if not (site / "tensorrt_bindings" / "tensorrt.so").is_file():
        raise SetupError(f"{wheel.name} has no tensorrt_bindings/tensorrt.so")


def _build_stubs(compiler: str, major: int, into: Path, tmp: Path) -> None:
    for library, symbols in STUB_SYMBOLS.items():
        source = tmp / f"{library}_stub.c"
        source.write_text(_stub_source(symbols))
        target = into / f"lib{library}.so.{major}"
        command = [compiler, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{target.name}", "-o", str(target), str(source)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SetupError(f"{Path(compiler).name} failed to build {target.name}: {result.stderr.strip()}")


def _stub_source(symbols: tuple[str, ...]) -> str:
    lines = ["#include <stdio.h>", "#include <stdlib.h>", ""]
    for name in symbols:
        message = STUB_MESSAGE.format(name=name)
        lines.append(f'void *{name}(void) {{ fputs("{message}\\n", stderr); abort(); }}')
    return "\n".join(lines) + "\n"


def _check_import(site: Path, version: str) -> None:
    code = "import tensorrt; print(tensorrt.__version__)"
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=site)
    if result.returncode != 0 or result.stdout.strip() != version:
        tail = (result.stderr.strip().splitlines() or [result.stdout.strip()])[-1]
        raise SetupError(f"`import tensorrt` failed with the stub libraries: {tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="append", help="only this TensorRT version (repeatable)")
    args = parser.parse_args(argv)
    chosen = [b for b in BINDINGS if not args.version or b.version in args.version]
    if not chosen:
        known = ", ".join(b.version for b in BINDINGS)
        print(f"unknown --version {args.version}; known: {known}", file=sys.stderr)
        return 2
    status = 0
    for bindings in chosen:
        try:
            print(bindings.version, prepare(bindings, cache_root()), flush=True)
        except SetupError as exc:
            required = bindings.required or bool(args.version)
            outcome = "not ready" if required else "skipped"
            print(f"TensorRT {bindings.version} bindings {outcome}: {exc}", file=sys.stderr)
            status = 2 if required else status
    return status


if __name__ == "__main__":
    sys.exit(main())
