"""Data sets: discovery order, batching, re-iteration, count, bad files, .npy/.npz, multi-input models."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trtopt.data import Dataset, InputInfo, PreprocessSpec, input_infos_from_graph, load_dataset
from trtopt.errors import DataError, ShapeError

IMAGE_INPUT = [InputInfo("images", ["N", 3, 8, 8], np.float32)]
RAW = PreprocessSpec(crop=8)  # 0..255 floats: the red channel identifies the file


def _image(path: Path, value: int, size: tuple[int, int] = (10, 12)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (value, 0, 0)).save(path)
    return path


def _jpeg_truncated(path: Path) -> Path:
    noise = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path, quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _folder(root: Path, n: int) -> Path:
    for i in range(n):
        _image(root / f"img{i:02d}.png", 10 * i)
    return root


def _all(data: Dataset, batch_size: int = 64) -> tuple[np.ndarray, list[str]]:
    batches = list(data.batches(batch_size))
    name = data.inputs[0].name
    return np.concatenate([b.feeds[name] for b in batches]), [s for b in batches for s in b.sources]


def test_folder_order_is_recursive_sorted_and_ignores_other_files(tmp_path: Path) -> None:
    _image(tmp_path / "b.png", 40)
    _image(tmp_path / "a" / "z.bmp", 80)
    _image(tmp_path / "a" / "b.JPG", 120)  # lossy formats: compare with a tolerance
    _image(tmp_path / "c.webp", 160)
    _image(tmp_path / ".hidden" / "d.png", 200)
    _image(tmp_path / "._b.png", 240)
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "x.jpg").mkdir()  # a folder that merely looks like an image
    data = load_dataset(tmp_path, IMAGE_INPUT, RAW)
    arrays, sources = _all(data)
    assert [Path(s).relative_to(tmp_path).as_posix() for s in sources] == [
        "a/b.JPG",
        "a/z.bmp",
        "b.png",
        "c.webp",
    ]
    np.testing.assert_allclose(arrays[:, 0, 0, 0], [120, 80, 40, 160], atol=4)
    assert len(data) == 4 and data.skipped == []


def test_batches_are_full_except_the_last_and_reiterate_identically(tmp_path: Path) -> None:
    data = load_dataset(_folder(tmp_path, 5), IMAGE_INPUT, RAW)
    first = list(data.batches(2))
    assert [len(b) for b in first] == [2, 2, 1]
    assert first[0].feeds["images"].shape == (2, 3, 8, 8) and first[0].feeds["images"].dtype == np.float32
    again = list(data.batches(2))
    assert [b.sources for b in again] == [b.sources for b in first]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.feeds["images"], b.feeds["images"])
    with pytest.raises(DataError, match="Batch size"):
        data.batches(0)


def test_count_takes_the_first_samples_and_warns_when_too_large(tmp_path: Path, caplog) -> None:
    root = _folder(tmp_path, 5)
    data = load_dataset(root, IMAGE_INPUT, RAW, count=3)
    assert len(data) == 3
    assert [Path(s).name for s in _all(data, 2)[1]] == ["img00.png", "img01.png", "img02.png"]
    with caplog.at_level(logging.WARNING):
        data = load_dataset(root, IMAGE_INPUT, RAW, count=10)
    assert len(data) == 5 and "only 5" in caplog.text
    with pytest.raises(DataError, match="positive integer"):
        load_dataset(root, IMAGE_INPUT, RAW, count=0)


def test_default_spec_comes_from_the_model_input(tmp_path: Path) -> None:
    _image(tmp_path / "a.png", 255)
    data = load_dataset(tmp_path, IMAGE_INPUT, None)
    assert data.spec is not None and data.spec.crop_hw == (8, 8) and data.spec.scale == 255.0  # imagenet
    arrays, _ = _all(data)
    assert arrays[0, 0, 0, 0] == np.float32((1.0 - 0.485) / 0.229)


def test_bad_files_are_skipped_recorded_and_logged(tmp_path: Path, caplog) -> None:
    _image(tmp_path / "a.png", 10)
    (tmp_path / "b.jpg").write_bytes(np.random.default_rng(2).bytes(500))
    (tmp_path / "c.png").write_bytes(b"")
    _jpeg_truncated(tmp_path / "d.jpg")  # passes the header check; fails while batching
    _image(tmp_path / "e.png", 50)
    _image(tmp_path / "f.png", 60)
    with caplog.at_level(logging.WARNING):
        data = load_dataset(tmp_path, IMAGE_INPUT, RAW, count=3)
    assert [Path(s.path).name for s in data.skipped] == ["b.jpg", "c.png"]
    assert "b.jpg" in caplog.text
    batches = list(data.batches(2))
    assert [Path(s).name for b in batches for s in b.sources] == ["a.png", "e.png", "f.png"]  # d.jpg replaced
    assert [len(b) for b in batches] == [2, 1]
    assert [Path(s.path).name for s in data.skipped] == ["b.jpg", "c.png", "d.jpg"]
    assert "truncated" in data.skipped[-1].reason
    assert len(data) == 3
    list(data.batches(2))
    assert len(data.skipped) == 3  # found once, not again on the next pass


def test_all_bad_folder_says_what_was_found(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"garbage")
    (tmp_path / "b.png").write_bytes(b"")
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(DataError, match=r"2 unreadable.*1 with other extensions \(\.txt\).*expected images"):
        load_dataset(tmp_path, IMAGE_INPUT, RAW)


def test_all_truncated_folder_fails_while_batching(tmp_path: Path) -> None:
    _jpeg_truncated(tmp_path / "a.jpg")
    data = load_dataset(tmp_path, IMAGE_INPUT, RAW)
    with pytest.raises(DataError, match="none of the files could be decoded.*truncated"):
        list(data.batches(4))


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        (lambda p: p.mkdir(), "is empty"),
        (lambda p: None, "does not exist"),
        (lambda p: (p.mkdir(), (p / "a.csv").write_text("1,2")), r"no usable files.*\.csv"),
        (lambda p: (p.mkdir(), (p / ".DS_Store").write_text("x")), "is empty"),
    ],
    ids=["empty", "missing", "only-other-files", "only-hidden"],
)
def test_unusable_sources_are_clear_errors(tmp_path: Path, setup, match: str) -> None:
    root = tmp_path / "data"
    setup(root)
    with pytest.raises(DataError, match=match) as info:
        load_dataset(root, IMAGE_INPUT, RAW)
    assert "data" in str(info.value)


def test_single_file_and_list_of_paths(tmp_path: Path) -> None:
    one = _image(tmp_path / "one.png", 1)
    two = _image(tmp_path / "two.png", 2)
    folder = _folder(tmp_path / "more", 2)
    assert len(load_dataset(one, IMAGE_INPUT, RAW)) == 1
    _, sources = _all(load_dataset([two, str(one), folder], IMAGE_INPUT, RAW))
    assert [Path(s).name for s in sources] == ["two.png", "one.png", "img00.png", "img01.png"]
    (tmp_path / "x.csv").write_text("1")
    with pytest.raises(DataError, match=r"extension '\.csv'"):
        load_dataset([one, tmp_path / "x.csv"], IMAGE_INPUT, RAW)


def test_spec_that_does_not_fit_the_input(tmp_path: Path) -> None:
    _image(tmp_path / "a.png", 1)
    with pytest.raises(DataError, match=r"shape \[3, 16, 16\].*takes \[3, 8, 8\]"):
        load_dataset(tmp_path, IMAGE_INPUT, PreprocessSpec(crop=16))
    with pytest.raises(DataError, match="float16"):
        load_dataset(tmp_path, IMAGE_INPUT, PreprocessSpec(crop=8, dtype="float16"))


VECTOR = [InputInfo("x", [None, 4], np.float32)]


def test_npy_batches_and_single_samples(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.float32).reshape(3, 4))  # a batch of 3
    np.save(tmp_path / "b.npy", np.full(4, 7.0))  # one sample, float64: cast to float32
    data = load_dataset(tmp_path, VECTOR, None)
    assert len(data) == 4
    batches = list(data.batches(3))
    assert [len(b) for b in batches] == [3, 1]
    assert batches[0].feeds["x"].dtype == np.float32
    np.testing.assert_array_equal(batches[0].feeds["x"], np.arange(12).reshape(3, 4))
    assert batches[1].feeds["x"].tolist() == [[7.0] * 4]
    assert [Path(s).name for b in batches for s in b.sources] == ["a.npy[0]", "a.npy[1]", "a.npy[2]", "b.npy"]
    assert len(load_dataset(tmp_path, VECTOR, None, count=2)) == 2


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (
            np.zeros((2, 5), np.float32),
            r"bad\.npy.*shape \[2, 5\].*expects a stack of samples \[N, 4\] or one sample \[4\]",
        ),
        (np.zeros((2, 2, 4), np.float32), r"shape \[2, 2, 4\]"),
        (np.zeros((2, 4), np.int32), "dtype int32.*float32"),
    ],
)
def test_npy_that_does_not_fit_is_an_error(tmp_path: Path, array: np.ndarray, match: str) -> None:
    np.save(tmp_path / "bad.npy", array)
    with pytest.raises(DataError, match=match):
        load_dataset(tmp_path, VECTOR, None)


def test_integer_casts_check_the_range(tmp_path: Path) -> None:
    ids = [InputInfo("ids", [1, 3], np.int32)]
    np.save(tmp_path / "ok.npy", np.array([[1, 2, 3]], np.int64))
    assert list(load_dataset(tmp_path / "ok.npy", ids, None).batches(1))[0].feeds["ids"].dtype == np.int32
    np.save(tmp_path / "big.npy", np.array([[1, 2, 2**40]], np.int64))
    with pytest.raises(DataError, match="outside int32"):
        list(load_dataset(tmp_path / "big.npy", ids, None).batches(1))


def test_unreadable_arrays_are_skipped(tmp_path: Path) -> None:
    np.save(tmp_path / "good.npy", np.zeros((2, 4), np.float32))
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    whole = (tmp_path / "good.npy").read_bytes()
    (tmp_path / "short.npy").write_bytes(whole[:-8])
    data = load_dataset(tmp_path, VECTOR, None)
    assert len(data) == 2
    reasons = {Path(s.path).name: s.reason for s in data.skipped}
    assert set(reasons) == {"junk.npy", "junk.npz", "short.npy"}
    assert "truncated" in reasons["short.npy"] and "zip" in reasons["junk.npz"]


MULTI = [InputInfo("a", ["N", 3], np.float32), InputInfo("b", ["N", 2], np.int64)]


def test_npz_feeds_multi_input_models(tmp_path: Path) -> None:
    np.savez(
        tmp_path / "s0.npz", a=np.ones((3, 3), np.float32), b=np.zeros((3, 2), np.int64), extra=np.ones(1)
    )
    np.savez(tmp_path / "s1.npz", a=np.full(3, 2.0, np.float32), b=np.array([5, 6]))  # one sample each
    data = load_dataset(tmp_path, MULTI, None)
    assert len(data) == 4
    (batch,) = list(data.batches(8))
    assert batch.feeds["a"].shape == (4, 3) and batch.feeds["b"].shape == (4, 2)
    assert batch.feeds["b"].dtype == np.int64 and batch.feeds["b"][3].tolist() == [5, 6]
    assert [Path(s).name for s in batch.sources] == ["s0.npz[0]", "s0.npz[1]", "s0.npz[2]", "s1.npz"]


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        (
            {"a": np.ones((3, 3), np.float32)},
            r"input\(s\) \['b'\] are not among them.*np.savez\(file, a=..., b=...\)",
        ),
        ({"a": np.ones((3, 3), np.float32), "b": np.ones((2, 2), np.int64)}, "different numbers of samples"),
    ],
)
def test_npz_that_does_not_fit_is_an_error(tmp_path: Path, arrays: dict, match: str) -> None:
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(DataError, match=match):
        load_dataset(tmp_path, MULTI, None)


def test_single_input_accepts_npz_with_one_array_of_any_name(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", whatever=np.ones((2, 4), np.float32))
    assert len(load_dataset(tmp_path, VECTOR, None)) == 2


def test_multi_input_models_need_npz(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.ones((1, 3), np.float32))
    with pytest.raises(DataError, match=r"\.npy file.*2 inputs.*\.npz"):
        load_dataset(tmp_path, MULTI, None)
    _image(tmp_path / "img" / "x.png", 1)
    with pytest.raises(DataError, match=r"image file.*2 inputs \(a, b\).*\.npz"):
        load_dataset(tmp_path / "img", MULTI, None)


def test_input_infos_from_graph() -> None:
    gs = pytest.importorskip("onnx_graphsurgeon")
    x = gs.Variable("x", dtype=np.float32, shape=["batch", 3, 224, 224])
    ids = gs.Variable("ids", dtype=np.int64, shape=[1, -1])
    graph = gs.Graph(inputs=[x, ids])
    infos = input_infos_from_graph(graph)
    assert infos == [InputInfo("x", [None, 3, 224, 224], np.float32), InputInfo("ids", [1, None], np.int64)]
    graph.inputs.append(gs.Variable("y", dtype=np.float32, shape=None))
    with pytest.raises(ShapeError, match="--shapes y:"):
        input_infos_from_graph(graph)


def test_worker_count_changes_nothing_but_speed(tmp_path: Path, caplog) -> None:
    """Files decode ahead in a thread pool; samples, order and skipped files are the same for any count,
    with a truncated file in the middle, a count, and the held-back tail of `split_tail`."""
    root = _folder(tmp_path / "data", 11)
    _jpeg_truncated(root / "img05b.jpg")
    results = []
    for workers in (1, 2, 5):
        data = load_dataset(root, IMAGE_INPUT, RAW, count=9)
        head, tail = data.split_tail(3)
        batches = [list(d.batches(2, workers=workers)) for d in (data, head, tail)]
        results.append(([[(b.feeds["images"], b.sources) for b in run] for run in batches],
                        [s.path for s in data.skipped]))  # fmt: skip
    (first, skipped), others = results[0], results[1:]
    assert skipped == [str(root / "img05b.jpg")] and len(sum(first[0], ())) > 0
    for runs, bad in others:
        assert bad == skipped
        for run, expected in zip(runs, first, strict=True):
            assert [s for _, s in run] == [s for _, s in expected]
            for (got, _), (want, _) in zip(run, expected, strict=True):
                np.testing.assert_array_equal(got, want)
    assert [s for _, s in first[2]] == [[str(root / "img06.png"), str(root / "img07.png")], [str(root / "img08.png")]]


def test_no_file_is_decoded_beyond_the_count(tmp_path: Path, monkeypatch) -> None:
    import trtopt.data.dataset as dataset_module

    root = _folder(tmp_path / "data", 20)
    read: list[str] = []
    original = dataset_module.preprocess_file
    monkeypatch.setattr(dataset_module, "preprocess_file", lambda p, s: read.append(Path(p).name) or original(p, s))
    data = load_dataset(root, IMAGE_INPUT, RAW, count=5)
    assert sum(len(b) for b in data.batches(2, workers=4)) == 5
    assert sorted(read) == [f"img{i:02d}.png" for i in range(5)]
    with pytest.raises(DataError, match="Worker count"):
        data.batches(2, workers=0)


def test_array_files_are_read_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy parses .npy headers with ast.literal_eval, which CPython 3.11 cannot run in two threads at once
    (python/cpython#106905): every np.load of the dataset's reader pool runs under the module's lock."""
    import trtopt.data.arrays as arrays

    for i in range(6):
        np.savez(tmp_path / f"s{i}.npz", a=np.full((2, 3), i, np.float32), b=np.zeros((2, 2), np.int64))
    unlocked = []
    real_load = np.load

    def load(*args, **kwargs):  # type: ignore[no-untyped-def]
        unlocked.append(not arrays._READ_LOCK.locked())
        return real_load(*args, **kwargs)

    monkeypatch.setattr(arrays.np, "load", load)
    rows = sum(len(batch) for batch in load_dataset(tmp_path, MULTI, None).batches(4))
    assert rows == 12 and len(unlocked) == 6 and not any(unlocked)
