"""Atomic output: everything trtopt writes goes to a temporary file beside the target, then is renamed.

A crash, a full disk, Ctrl-C or SIGTERM therefore never leaves a half-written model, plan or cache behind
(the CLI turns SIGTERM into an interrupt, so the temporary file is removed as well). What the target may be:

* a regular file (replaced, keeping its permission bits) or a new name (created with the mode a plain
  ``open()`` gives: ``0o666`` less the umask, not ``mkstemp``'s 0600);
* a **symlink is followed**: the file it points to is replaced atomically and the link stays a link;
* a directory, a device (``/dev/null``), a FIFO or a socket is refused before anything is written.

`check_output` runs the same checks, plus a real write probe in the folder, so the CLI can refuse a bad
``-o`` before hours of calibration instead of after.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from trtopt.errors import TrtoptError
from trtopt.frontend.weightless import serialized_size

# Protobuf cannot serialise a message of 2 GiB or more; larger models keep their weights in a side file.
PROTOBUF_LIMIT = 2**31 - 1

# The last files written completely (after the rename), so the CLI can say what an interrupted or failed
# command left behind. Bounded: a long-running process writes many.
_WRITTEN: collections.deque[Path] = collections.deque(maxlen=32)


def written_paths() -> tuple[Path, ...]:
    """The files completely written since `forget_written()` (at most the last 32), in order."""
    return tuple(_WRITTEN)


def forget_written() -> None:
    """Start a new record (the CLI does at the start of each command)."""
    _WRITTEN.clear()


@contextlib.contextmanager
def _temp_beside(path: Path) -> Iterator[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        try:
            os.fchmod(fd, _final_mode(path))
        finally:
            os.close(fd)
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _final_mode(path: Path) -> int:
    """The permission bits a plain `open(path, "w")` would leave: an existing file keeps its own, a new one
    gets 0o666 less the umask."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(path.stat().st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (/proc), else set and restored."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _os_errors_as_user_errors(target: Path) -> Iterator[None]:
    """A full disk or a vanished folder is the user's to fix: a clean message, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise TrtoptError(
            f"Could not write {str(target)!r}: {exc.strerror or exc}. Nothing was written to it.",
            fix=write_fix(exc),
        ) from exc


def write_fix(exc: OSError) -> str:
    """How to fix a failed write: a file-size limit (`ulimit -f`) reads like a full disk otherwise."""
    if exc.errno == errno.EFBIG:
        return "This process may not write files that large (its file-size limit, `ulimit -f`): raise the limit."
    return "Check free disk space and permissions of the output folder, then retry."


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` via a temporary file and a rename."""
    target = _real_target(Path(path))
    with _os_errors_as_user_errors(target), _temp_beside(target) as tmp:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    _WRITTEN.append(target)
    return target


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Save a model atomically; models over the protobuf limit get their weights in `<name>.data`."""
    target = _real_target(Path(path))
    if serialized_size(model) < PROTOBUF_LIMIT:
        return write_atomic(target, model.SerializeToString())
    with _os_errors_as_user_errors(target):
        _save_with_external_data(model, target)
    _WRITTEN.append(target)
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


def check_output(path: str | os.PathLike[str], *, inputs: tuple[Path, ...] = (), option: str = "-o") -> Path:
    """Refuse an output path before any slow work: a folder, a device / FIFO / socket, the same file as one
    of `inputs` (which writing would destroy), or a folder this process cannot create a file in (probed
    with a real temporary file, since `os.access` is wrong for root and read-only file systems)."""
    target = _real_target(Path(path), option)
    for source in inputs:
        if _same_file(target, source):
            raise TrtoptError(
                f"{option} {str(path)!r} is the same file as the input {str(source)!r}; writing it would "
                "destroy the input.",
                fix=f"Give {option} a new file name.",
            )
    folder = _existing_ancestor(target.parent)
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise TrtoptError(
            f"Cannot write {option} {str(path)!r}: folder {str(folder)!r} refuses new files "
            f"({exc.strerror or exc}). Nothing was done.",
            fix=f"Choose a {option} path in a folder you can write to.",
        ) from None
    return target


def _same_file(target: Path, source: Path) -> bool:
    try:
        return target.exists() and source.exists() and os.path.samefile(target, source)
    except OSError:
        return False


def _existing_ancestor(folder: Path) -> Path:
    folder = folder if str(folder) else Path(".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _real_target(target: Path, option: str = "Output path") -> Path:
    """The file that will be replaced: symlinks followed; folders, devices, FIFOs and sockets refused."""
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    if target.is_dir():
        raise TrtoptError(
            f"{option} {str(target)!r} is a directory.", fix="Give a file name, e.g. out/model.onnx."
        )
    with contextlib.suppress(OSError):
        mode = target.stat().st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
            raise TrtoptError(
                f"{option} {str(target)!r} is {kind}, not a regular file; trtopt writes files atomically "
                "(temporary file, then rename), which would replace it.",
                fix="Write to a regular file and copy it where it must go.",
            )
    parent = _existing_ancestor(target.parent)
    if not os.access(parent, os.W_OK):
        raise TrtoptError(
            f"Cannot write to folder {str(parent)!r} (permission denied).",
            fix="Choose an output path in a folder you can write to.",
        )
    return target
