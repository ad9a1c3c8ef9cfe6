"""Calibration / inference data sets: a folder, a file or a list of paths -> deterministic batches of feeds.

Files are taken in a fixed order (a folder recursively, sorted by relative path; a list in the order given),
so a run is reproducible. Images feed a single-input model through a `PreprocessSpec`; `.npy` / `.npz`
arrays feed any model (see `trtopt.data.arrays`). Hidden files and folders (a leading '.', e.g. macOS
``._photo.jpg`` resource forks) and files with other extensions are ignored.

Files are decoded and preprocessed ahead of the caller in a small thread pool (`batches(workers=...)`;
Pillow and numpy release the GIL while they decode and resize), at most two batches ahead, so decoding
overlaps whatever the caller does with the previous batch (calibration: ONNX Runtime). The samples,
their order and the files skipped do not depend on the number of workers.

Bad files never stop a run: a file that fails the cheap header check up front, or that fails to decode
later while batches are made, is logged as a warning, recorded in `Dataset.skipped` and replaced by the next
usable file. Data that *does not fit the model* (wrong shape or dtype) is a `DataError` instead, since
skipping it would silently calibrate on nothing.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtopt.data.arrays import ARRAY_EXTENSIONS, ArrayFile, array_file_from_path, has_batch_axis, load_arrays
from trtopt.data.files import EXPECTED as _EXPECTED
from trtopt.data.files import Source, collect_files
from trtopt.data.images import IMAGE_EXTENSIONS, check_image_header
from trtopt.data.input_spec import spec_for_input
from trtopt.data.inputs import InputInfo, unbatched_image
from trtopt.data.preprocess import PreprocessSpec, preprocess_file
from trtopt.errors import DataError, UnreadableFileError, format_shape

log = logging.getLogger(__name__)

# Threads that decode and preprocess files ahead of the caller (`Dataset.batches`).
DEFAULT_WORKERS = 4


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass(frozen=True)
class Batch:
    """Feeds for one model call (input name -> `[n, ...]` array) and the sample each row came from."""

    feeds: dict[str, np.ndarray]
    sources: list[str]
    padded: bool = False  # the last batch of a fixed-batch model, filled up by repeating its last sample
    whole: bool = False  # one whole feed: the model's inputs share no batch axis (`trtopt.data.arrays`)

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def feed_rows(self) -> int:
        """How many leading rows of the first feed hold real samples, the `rows` of a (feeds, rows) pair that
        calibration trims tensors of that leading size to: `len(self)`, or for a whole feed its full leading size
        (none of it is padding: a [3, H, W] image is one sample, not three rows of which one is real)."""
        if not self.whole:
            return len(self)
        first = next(iter(self.feeds.values()), None)
        return int(np.shape(first)[0]) if first is not None and np.ndim(first) else 1

    @property
    def rows(self) -> int | None:
        """How many leading rows of each output are real (the rest pad a fixed batch); None: all of them (an
        output's first dimension need not be the batch: a CTC head's is time)."""
        return len(self.sources) if self.padded else None


@dataclass(frozen=True)
class _ImageFile:
    path: Path
    samples: int = 1


_Item = _ImageFile | ArrayFile


class Dataset:
    """Validated samples for a model; iterate with `batches()`, as often as needed, in the same order.

    `len()` counts the samples that will be used. Files that passed the header check but fail to decode
    are found only while batching; `len()` and `skipped` are exact after one full pass.
    """

    def __init__(
        self,
        items: Sequence[_Item],
        inputs: Sequence[InputInfo],
        spec: PreprocessSpec | None,
        count: int | None,
        skipped: list[SkippedFile],
        start: int = 0,
    ) -> None:
        self.inputs = tuple(inputs)
        self.spec = spec
        self.count = count
        self.start = start
        self.skipped = skipped
        self._items = tuple(items)
        self._bad: set[Path] = set()

    def __len__(self) -> int:
        usable = max(0, sum(item.samples for item in self._items if item.path not in self._bad) - self.start)
        return usable if self.count is None else min(self.count, usable)

    def split_tail(self, tail: int) -> tuple[Dataset, Dataset]:
        """(all but the last `tail` samples, the last `tail` samples): the same files, read lazily, so a
        build can hold a few calibration samples back to check its plan on."""
        head = len(self) - tail
        if tail <= 0 or head <= 0:
            raise ValueError(f"cannot split {tail} of {len(self)} samples off")
        return self.head(head), self.head(tail, start=self.start + head)

    def head(self, count: int, *, start: int | None = None) -> Dataset:
        """`count` samples from `start` (None: this one's), the same files read lazily; a bad file is warned of once."""
        part = Dataset(self._items, self.inputs, self.spec, count, self.skipped, self.start if start is None else start)
        part._bad = self._bad
        return part

    @property
    def unit(self) -> str:
        """What messages call the samples: "images" when they come from image files, else "samples"."""
        return "images" if any(isinstance(item, _ImageFile) for item in self._items) else "samples"

    @property
    def fixed_batch(self) -> int | None:
        """The batch size the model fixes in its input shapes, or None when the batch is dynamic (1 for a
        model whose inputs share no batch dimension: it is fed one whole feed per call)."""
        if not has_batch_axis(self.inputs):
            return 1
        sizes = {info.shape[0] for info in self.inputs if info.shape}
        return sizes.pop() if len(sizes) == 1 and None not in sizes else None

    def batches(self, batch_size: int, *, workers: int | None = None) -> Iterator[Batch]:
        """Batches of `batch_size` samples (the last may be smaller), restarting from the first sample.

        A model with a fixed batch B gets batches of exactly B whatever `batch_size` says: the last one
        is padded by repeating its last sample, and `Batch.sources` lists only the real samples, so a
        caller keeps the first `len(batch)` rows of each output.

        `workers` threads decode and preprocess files ahead of the caller (None: up to 4, no more than the
        CPUs), two batches of files at most, so memory holds about two batches of samples plus one
        full-size image per worker. The batches are the same whatever the number of workers.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise DataError(
                f"Batch size must be a positive integer, received {batch_size!r}.", fix="Pass e.g. 8."
            )
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers <= 0):
            raise DataError(f"Worker count must be a positive integer, received {workers!r}.", fix="Pass e.g. 2.")
        workers = workers or min(DEFAULT_WORKERS, os.cpu_count() or 1)
        size = self.fixed_batch or batch_size
        return self._batches(size, workers, ahead=max(2 * size, workers))

    def _batches(self, batch_size: int, workers: int, ahead: int) -> Iterator[Batch]:
        rows: list[dict[str, np.ndarray]] = []
        sources: list[str] = []
        for row, source in self._samples(workers, ahead):
            rows.append(row)
            sources.append(source)
            if len(rows) == batch_size:
                yield self._batch(rows, sources)
                rows, sources = [], []
        if rows:
            yield self._batch(rows, sources)

    def _batch(self, rows: list[dict[str, np.ndarray]], sources: list[str]) -> Batch:
        if not has_batch_axis(self.inputs):
            return Batch(feeds=rows[0], sources=sources, whole=True)
        fixed = self.fixed_batch
        padded = fixed is not None and len(rows) < fixed
        if padded:
            rows = rows + [rows[-1]] * (fixed - len(rows))  # type: ignore[operator]
        feeds = {info.name: np.stack([row[info.name] for row in rows]) for info in self.inputs}
        return Batch(feeds=feeds, sources=sources, padded=padded)

    def _samples(self, workers: int, ahead: int) -> Iterator[tuple[dict[str, np.ndarray], str]]:
        """Samples in order, their files loaded `ahead` files ahead by `workers` threads; a file that fails
        is skipped when its turn comes, so `skipped` and the samples do not depend on timing."""
        limit = self.count
        produced = 0
        planned = self._planned()
        pending: deque[tuple[_Item, int, Future[dict[str, np.ndarray]]]] = deque()
        pending_samples = 0  # samples the pending files will give; no file is loaded beyond the count
        with ThreadPoolExecutor(workers, thread_name_prefix="trtopt-decode") as pool:
            try:
                while True:
                    while len(pending) < ahead and (limit is None or produced + pending_samples < limit):
                        item, offset = next(planned, (None, 0))
                        if item is None:
                            break
                        pending.append((item, offset, pool.submit(self._load, item)))
                        pending_samples += item.samples - offset
                    if not pending:
                        break
                    item, offset, future = pending.popleft()
                    pending_samples -= item.samples - offset
                    if item.path in self._bad:  # the same file listed twice, found bad in this pass
                        continue
                    try:
                        arrays = future.result()
                    except UnreadableFileError as exc:
                        self._skip(item.path, exc.what)
                        continue
                    except MemoryError:  # a file that decodes to more than this machine holds is a bad file too
                        self._skip(item.path, "out of memory reading or preprocessing it")
                        continue
                    take = item.samples - offset if limit is None else min(item.samples - offset, limit - produced)
                    for i in range(offset, offset + take):
                        # [i, ...]: a scalar input's samples stay 0-d arrays (a bare numpy scalar is no feed)
                        yield {name: array[i, ...] for name, array in arrays.items()}, self._source(item, i)
                        produced += 1
            finally:
                for *_, pending_future in pending:
                    pending_future.cancel()
        if produced == 0:
            raise _nothing_usable("none of the files could be decoded", self.skipped, [])

    def _planned(self) -> Iterator[tuple[_Item, int]]:
        """(file, samples of it before `start`) for each usable file that has samples after `start`."""
        passed = 0  # samples before `start`, skipped without decoding where a whole file lies before it
        for item in self._items:
            if item.path in self._bad:
                continue
            offset = min(item.samples, max(0, self.start - passed))
            passed += offset
            if offset < item.samples:
                yield item, offset

    @staticmethod
    def _source(item: _Item, index: int) -> str:
        return f"{item.path}[{index}]" if isinstance(item, ArrayFile) and item.batched else str(item.path)

    def _load(self, item: _Item) -> dict[str, np.ndarray]:
        if isinstance(item, ArrayFile):
            return load_arrays(item, self.inputs)
        assert self.spec is not None  # set by load_dataset whenever there are images
        return {self.inputs[0].name: preprocess_file(item.path, self.spec)[None]}

    def _skip(self, path: Path, reason: str) -> None:
        log.warning("Skipping %s: %s", path, reason)
        self._bad.add(path)
        self.skipped.append(SkippedFile(str(path), reason))


def load_dataset(
    source: Source,
    inputs: Sequence[InputInfo],
    spec: PreprocessSpec | None = None,
    count: int | None = None,
) -> Dataset:
    """Find, check and order the samples in `source` for a model with `inputs`.

    `spec=None` derives the image preprocessing from the (single) input with `spec_for_input`; `count=None`
    uses every usable sample, `count=N` the first N. Raises `DataError` for missing paths, folders without
    usable files, images for multi-input models and data that does not fit the inputs.
    """
    inputs = list(inputs)
    if not inputs:
        raise DataError("The model has no inputs to feed data to.", fix="Check the model file.")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count <= 0):
        raise DataError(f"Sample count must be a positive integer, received {count!r}.", fix="Pass e.g. 500.")
    files, ignored = collect_files(source)
    images = [f for f in files if f.suffix.lower() in IMAGE_EXTENSIONS]
    if images:
        spec = _image_spec(images, inputs, spec)
    items, skipped = _validate(files, inputs)
    if not items:
        raise _nothing_usable(f"no usable files in {_describe(source)}", skipped, ignored)
    available = sum(item.samples for item in items)
    if count is not None and count > available:
        log.warning(
            "Asked for %d samples but %s holds only %d usable; using all %d",
            count,
            _describe(source),
            available,
            available,
        )
    log.info(
        "Data set: %d samples from %d files in %s (%d skipped, %d ignored)",
        min(available, count or available),
        len(items),
        _describe(source),
        len(skipped),
        len(ignored),
    )
    return Dataset(items, inputs, spec, count, skipped)


def holds_only_arrays(source: Source) -> bool:
    """Whether `source` has data files and every one is an array (.npy/.npz), fed as it is: no image
    preprocessing applies to it. Raises `DataError` for missing paths, like `load_dataset`."""
    files, _ = collect_files(source)
    return bool(files) and all(f.suffix.lower() in ARRAY_EXTENSIONS for f in files)


def _image_spec(images: list[Path], inputs: list[InputInfo], spec: PreprocessSpec | None) -> PreprocessSpec:
    if len(inputs) > 1:
        names = ", ".join(info.name for info in inputs)
        raise DataError(
            f"The data has {len(images)} image file(s) (e.g. {images[0]}), but the model has {len(inputs)} "
            f"inputs ({names}); images can only feed a single-input model.",
            fix="Save each sample as an .npz with one array per input: np.savez(file, "
            + ", ".join(f"{info.name}=..." for info in inputs)
            + ").",
        )
    info = inputs[0]
    if spec is None:
        return spec_for_input(info.shape, info.dtype, name=info.name)
    sample = info.shape if unbatched_image(info.shape) else info.sample_shape  # [3, H, W]: one image per call
    fits = len(sample) == 3 and all(w is None or w == g for g, w in zip(spec.sample_shape, sample, strict=True))
    if not fits or np.dtype(spec.dtype) != info.dtype:
        raise DataError(
            f"The preprocessing makes samples of shape {list(spec.sample_shape)} ({spec.layout}, "
            f"{spec.dtype}), but input {info.name!r} takes {format_shape(sample)} "
            f"({info.dtype}) per sample.",
            fix="Derive the spec from the model with spec_for_input(), or fix its crop, layout and dtype.",
        )
    return spec


def _validate(files: list[Path], inputs: list[InputInfo]) -> tuple[list[_Item], list[SkippedFile]]:
    items: list[_Item] = []
    skipped: list[SkippedFile] = []
    for path in files:
        try:
            if path.suffix.lower() in IMAGE_EXTENSIONS:
                check_image_header(path)
                items.append(_ImageFile(path))
            else:
                items.append(array_file_from_path(path, inputs))
        except UnreadableFileError as exc:
            log.warning("Skipping %s: %s", path, exc.what)
            skipped.append(SkippedFile(str(path), exc.what))
    return items, skipped


def _nothing_usable(what: str, skipped: list[SkippedFile], ignored: list[Path]) -> DataError:
    found: list[str] = []
    if skipped:
        examples = "; ".join(s.reason for s in skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
        found.append(f"{len(skipped)} unreadable ({examples})")
    if ignored:
        suffixes = sorted({p.suffix.lower() or "(no extension)" for p in ignored})
        found.append(f"{len(ignored)} with other extensions ({', '.join(suffixes[:8])})")
    return DataError(
        f"Cannot build a data set: {what}. Found {' and '.join(found) or 'no files'}; expected {_EXPECTED}.",
        fix="Add readable data files, fix or remove the broken ones, or point to another folder.",
    )


def _describe(source: Source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return repr(str(source))
    return f"{len(source)} paths"


def sample_batches(dataset: Dataset, batch: int, count: int) -> list[tuple[dict[str, np.ndarray], int]]:
    """The first `count` samples of `dataset` as (feeds, rows) batches of `batch` samples (the last may be short)."""
    head = dataset.split_tail(len(dataset) - count)[0] if len(dataset) > count else dataset
    return [(b.feeds, b.feed_rows) for b in head.batches(batch)]
