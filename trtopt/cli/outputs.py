"""Check every file a command will write before it does any slow work (issue #15).

An output must not be one of the command's inputs (`build m.onnx -o m.onnx` would replace the model with
a plan), two outputs must not be the same file (`--save-cache X -o X`), and each must be writable now,
not only after an hour of calibration. `trtopt.frontend.writer.check_output` does the per-file checks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

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
INPUTS = ("model", "plan", "calib", "calib_cache", "labels", "inputs", "data")


def check_cli_outputs(command: str, args: argparse.Namespace) -> None:
    """Raise `TrtoptError` for an output that is an input, a duplicate, or not writable."""
    inputs = _input_files(args)
    seen: dict[Path, str] = {}
    for name, option in OUTPUTS.get(command, {}).items():
        value = getattr(args, name, None)
        if value is None:
            continue
        target = check_output(value, inputs=inputs, option=option)
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
    return tuple(files)
