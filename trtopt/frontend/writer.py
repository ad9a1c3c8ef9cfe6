"""Atomic output: everything trtopt writes goes to a temporary file beside the target, then is renamed.

A crash, a full disk or Ctrl-C therefore never leaves a half-written model, plan or cache behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from trtopt.errors import TrtoptError

# Protobuf cannot serialise a message of 2 GiB or more; larger models keep their weights in a side file.
PROTOBUF_LIMIT = 2**31 - 1


@contextlib.contextmanager
def _temp_beside(path: Path) -> Iterator[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _os_errors_as_user_errors(target: Path) -> Iterator[None]:
    """A full disk or a vanished folder is the user's to fix: a clean message, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise TrtoptError(
            f"Could not write {str(target)!r}: {exc.strerror or exc}. Nothing was written.",
            fix="Check free disk space and permissions of the output folder, then retry.",
        ) from exc


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` via a temporary file and a rename."""
    target = Path(path)
    _check_writable(target)
    with _os_errors_as_user_errors(target), _temp_beside(target) as tmp:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return target


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Save a model atomically; models over the protobuf limit get their weights in `<name>.data`."""
    target = Path(path)
    _check_writable(target)
    if model.ByteSize() < PROTOBUF_LIMIT:
        return write_atomic(target, model.SerializeToString())
    with _os_errors_as_user_errors(target):
        _save_with_external_data(model, target)
    return target


def _save_with_external_data(model: onnx.ModelProto, target: Path) -> None:
    data_name = target.name + ".data"
    # onnx.save_model moves the weights out of the message it is given: save a copy, not the caller's.
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with _temp_beside(target.with_name(data_name)) as tmp_data, _temp_beside(target) as tmp_model:
        tmp_data.unlink()
        onnx.save_model(
            copy, tmp_model, save_as_external_data=True, all_tensors_to_one_file=True, location=tmp_data.name
        )
        # The model refers to its weights by file name: rewrite the reference to the final name.
        saved = onnx.load_model(tmp_model, load_external_data=False)
        for tensor in onnx.external_data_helper._get_all_tensors(saved):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = data_name
        tmp_model.write_bytes(saved.SerializeToString())
        os.replace(tmp_data, target.with_name(data_name))
        os.replace(tmp_model, target)


def _check_writable(target: Path) -> None:
    if target.is_dir():
        raise TrtoptError(
            f"Output path {str(target)!r} is a directory.", fix="Give a file name, e.g. out/model.onnx."
        )
    parent = target.parent if str(target.parent) else Path(".")
    if parent.exists() and not os.access(parent, os.W_OK):
        raise TrtoptError(
            f"Cannot write to folder {str(parent)!r} (permission denied).",
            fix="Choose an output path in a folder you can write to.",
        )
