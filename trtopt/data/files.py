"""The files a data source names: folders walked in order (hidden entries aside), files checked for a known
extension, and what is not a regular file kept out (a FIFO nobody writes to would hang the read, issue #46)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from trtopt.data.arrays import ARRAY_EXTENSIONS
from trtopt.data.images import IMAGE_EXTENSIONS
from trtopt.errors import DataError

log = logging.getLogger("trtopt.data.dataset")  # the name users see in warnings since before the split

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
EXPECTED = f"images ({', '.join(IMAGE_EXTENSIONS)}) or arrays (.npy, .npz)"


def collect_files(source: Source) -> tuple[list[Path], list[Path]]:
    """(files with a known extension, in order; files ignored for their extension)."""
    entries = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not entries:
        raise DataError("The data source is an empty list of paths.", fix="Pass a folder or files.")
    files: list[Path] = []
    for entry in entries:
        path = Path(entry)
        if path.is_dir():
            files.extend(_walk(path))
        elif path.exists() or path.is_symlink():
            if path.exists() and not _regular(path):
                raise DataError(
                    f"Data path {str(path)!r} is not a regular file (a FIFO, socket or device): reading it could "
                    "wait forever.",
                    fix=f"Pass {EXPECTED} saved as files.",
                )
            if not _known(path):
                raise DataError(
                    f"Data file {str(path)!r} has extension {path.suffix or '(none)'!r}, which trtopt "
                    "does not read.",
                    fix=f"Pass {EXPECTED}, or a folder of them.",
                )
            files.append(path)
        else:
            raise DataError(
                f"Data path {str(path)!r} does not exist.",
                fix=f"Pass an existing folder or file of {EXPECTED}.",
            )
    return [f for f in files if _known(f)], [f for f in files if not _known(f)]


def _walk(root: Path) -> list[Path]:
    """The files under `root` (hidden ones aside). A FIFO, socket or device among them is skipped with a warning:
    opening a FIFO nobody writes to waits forever (issue #46: `calibrate` and `run` hung on one)."""
    found: list[Path] = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        for path in (Path(folder) / name for name in names if not name.startswith(".")):
            if path.exists() and not _regular(path):
                log.warning("skipped %s: not a regular file (a FIFO, socket or device)", path)
            else:
                found.append(path)
    if not found:
        raise DataError(
            f"Data folder {str(root)!r} is empty (hidden files are ignored).",
            fix=f"Put {EXPECTED} in it, or pass another folder.",
        )
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return True  # unreadable files are reported where they are read, with their own message


def _known(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS + ARRAY_EXTENSIONS
