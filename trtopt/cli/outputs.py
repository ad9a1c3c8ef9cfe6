"""Check every file a command will write before it does any slow work (issue #15).

An output must not be one of the command's inputs (`build m.onnx -o m.onnx` would replace the model with
a plan), two outputs must not be the same file (`--save-cache X -o X`), and each must be writable now,
not only after an hour of calibration. `trtopt.frontend.writer.check_output` does the per-file checks.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import onnx

from trtopt.errors import TrtoptError
from trtopt.frontend.writer import check_output

# Per command: argument name -> option as the user typed it. Only files, not folders (--plot-dir).
OUTPUTS: dict[str, dict[str, str]] = {
    "build": {"output": "-o", "save_cache": "--save-cache"},
    "calibrate": {"output": "-o"},
    "optimize": {"output": "-o"},
    "sparsify": {"output": "-o"},
    "export": {"output": "-o"},
    "bench": {"plot": "--plot"},
}
# Arguments that name files a command reads (a single path or a list). --timing-cache is read *and*
# updated on purpose, so it is not listed.
INPUTS = ("model", "plan", "calib", "calib_cache", "labels", "inputs", "data", "verify_data")


def check_cli_outputs(command: str, args: argparse.Namespace) -> None:
    """Raise `TrtoptError` for an output that is an input, a file the run reads (a model's external data, an
    image or array in a data folder), a duplicate, or not writable."""
    inputs = _input_files(args)
    folders = tuple(p for p in inputs if p.is_dir())
    seen: dict[Path, str] = {}
    for name, option in OUTPUTS.get(command, {}).items():
        value = getattr(args, name, None)
        if value is None:
            continue
        target = check_output(value, inputs=inputs, option=option)
        _refuse_read_file(target, folders, option, str(value))
        key = target.resolve()
        if key in seen:
            raise TrtoptError(
                f"{seen[key]} and {option} both name {str(value)!r}; one would overwrite the other.",
                fix=f"Give {option} a different file name.",
            )
        seen[key] = option


def _input_files(args: argparse.Namespace) -> tuple[Path, ...]:
    files: list[Path] = []
    for name in INPUTS:
        value = getattr(args, name, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if item is None:
                continue
            path = Path(item)
            files.append(path)
            if path.suffix.lower() == ".onnx":
                files += [path.with_suffix(".json"), path.with_name(path.name + ".data")]  # sidecars
                files += external_data_files(path)
    return tuple(files)


def external_data_files(model: Path) -> list[Path]:
    """The files a model's tensors keep their data in (`location` of its external data), where it names any:
    writing one of them destroys the model's weights (`optimize m.onnx -o m.onnx.weights`)."""
    try:
        if not model.is_file():
            return []
        proto = onnx.load_model(str(model), load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable model is refused by the loader, with its own message
        return []
    found = []
    for tensor in onnx.external_data_helper._get_all_tensors(proto):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value and "\x00" not in entry.value:
                found.append(model.parent / entry.value)
    return found


def _refuse_read_file(target: Path, folders: tuple[Path, ...], option: str, given: str) -> None:
    """Refuse `target` where it is a file inside a data folder the run reads (`--calib DIR -o DIR/a.jpg`), by
    path or by identity (a link in the folder to the target)."""
    if not target.exists():
        return
    try:
        identity = (target.stat().st_dev, target.stat().st_ino)
    except OSError:
        return
    resolved = target.resolve()
    for folder in folders:
        inside = resolved.is_relative_to(folder.resolve())
        if inside or identity in _identities(folder):
            raise TrtoptError(
                f"{option} {given!r} is a file the run reads from {str(folder)!r}; writing it would destroy that "
                "input while it is read.",
                fix=f"Give {option} a path outside the data folder.",
            )


def _identities(folder: Path) -> set[tuple[int, int]]:
    found = set()
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            info = path.stat()
            found.add((info.st_dev, info.st_ino))
    return found
