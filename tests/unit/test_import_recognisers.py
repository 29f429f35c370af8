"""``llmman import``'s recognisers and naming (tiny synthetic GGUFs in other tools' real layouts).

Ollama's ``manifests``/``blobs`` tree, the Hugging Face hub cache, plain folders (split shards, mmproj),
llama.cpp's cache manifests, LM Studio's ``publisher/repository`` folders, a single file; the folders
each keyword means under each tool's variables.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.ggufgen import write_gguf, write_mmproj, write_split
from tests.user_stores import hf_cache, ollama_store

from llmman.config.model_dirs import model_dirs
from llmman.errors import NotFound
from llmman.store import mediatypes as mt
from llmman.store.imports import discover, discover_sources, sources_of
from llmman.store.imports.found import file_tag, local_name


@pytest.mark.parametrize(("filename", "tag"), [
    ("SmolLM2-135M-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("Llama-3.2-1B-Instruct-IQ3_XXS.gguf", "IQ3_XXS"),
    ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
    ("gemma-3-270m-it-BF16.gguf", "BF16"),
    ("Q4_K_M/Qwen3-30B-A3B-Q4_K_M-00001-of-00003.gguf", "Q4_K_M"),
    ("Qwen3-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("model.gguf", "model"),
    ("tinyllama.f16.gguf", "F16"),
])
def test_file_tag_is_the_quant_a_pull_picks_the_file_by(filename: str, tag: str) -> None:
    assert file_tag(filename) == tag


def test_local_name() -> None:
    assert local_name("SmolLM2-135M-Instruct.Q4_1.gguf") == "localhost/SmolLM2-135M-Instruct:Q4_1"
    assert local_name("my model (final).gguf") == "localhost/my-model-final:latest"
    assert local_name("shard-00001-of-00002.gguf") == "localhost/shard:latest"


def test_model_dirs_follow_each_tools_variables(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    d = model_dirs(home)
    assert d.ollama == (tmp_path / ".ollama/models", Path("/usr/share/ollama/.ollama/models"))
    assert d.hf == tmp_path / ".cache/huggingface/hub"
    assert d.llama_cpp == tmp_path / ".cache/llama.cpp"
    assert d.lmstudio == (tmp_path / ".lmstudio/models", tmp_path / ".cache/lm-studio/models")
    d = model_dirs({**home, "XDG_CACHE_HOME": "/x", "HF_HOME": "~/hf", "OLLAMA_MODELS": "/o"})
    assert (d.ollama, d.hf, d.llama_cpp) == ((Path("/o"),), tmp_path / "hf/hub", Path("/x/llama.cpp"))
    d = model_dirs({**home, "HF_HOME": "/h", "HF_HUB_CACHE": "/c", "LLAMA_CACHE": "/l"})
    assert (d.hf, d.llama_cpp) == (Path("/c"), Path("/l"))
    assert model_dirs({**home, "HUGGINGFACE_HUB_CACHE": "/old"}).hf == Path("/old")
    assert model_dirs({**home, "OLLAMA_MODELS": ""}).ollama[0] == tmp_path / ".ollama/models"


def test_sources_keywords_and_paths(tmp_path: Path) -> None:
    dirs = model_dirs({"HOME": str(tmp_path), "OLLAMA_MODELS": str(tmp_path / ".ollama/models")})
    (tmp_path / ".ollama/models").mkdir(parents=True)
    (tmp_path / ".lmstudio/models").mkdir(parents=True)
    assert sources_of([], dirs) == [(tmp_path / ".ollama/models", False),
                                    (tmp_path / ".lmstudio/models", True)]
    assert sources_of(["hf"], dirs) == []  # a keyword whose folder does not exist names nothing
    assert sources_of(["/some/where"], dirs) == [(Path("/some/where"), False)]
    with pytest.raises(NotFound):
        discover(tmp_path / "missing")


def test_ollama_store(tmp_path: Path) -> None:
    models = tmp_path / "models"
    gguf = write_gguf(tmp_path / "w.gguf")
    ollama_store(models, gguf, system="Be brief.", params={"temperature": 0.2})
    ollama_store(models, gguf, host="hf.co", repo="bartowski/SmolLM2-GGUF", tag="Q4_K_M", license_text=None)
    ollama_store(models, gguf, repo="library/vision", tag="latest",
                 extra=[("projector", write_mmproj(tmp_path / "p.gguf").read_bytes())])
    ollama_store(models, gguf, repo="library/tuned", tag="latest", extra=[("adapter", b"lora")])
    broken = ollama_store(models, gguf, repo="library/broken", tag="latest")
    manifest = json.loads(broken.read_text())
    manifest["layers"].append({"mediaType": mt.OLLAMA_LICENSE, "digest": "sha256:" + "0" * 64, "size": 1})
    broken.write_text(json.dumps(manifest))
    (models / "manifests/registry.ollama.ai/.DS_Store").write_bytes(b"\0")  # not a manifest
    found = {f.name: f for f in discover(models)}
    assert sorted(found) == ["hf.co/bartowski/SmolLM2-GGUF:Q4_K_M", "ollama.com/library/broken:latest",
                             "ollama.com/library/smollm2:135m", "ollama.com/library/tuned:latest",
                             "ollama.com/library/vision:latest"]
    smol = found["ollama.com/library/smollm2:135m"]
    assert not smol.problem and smol.config is not None and smol.config.media_type == mt.DOCKER_IMAGE_CONFIG
    kinds = [(p.media_type.rsplit(".", 1)[-1], p.link) for p in smol.parts]
    assert kinds == [("model", True), ("template", False), ("license", False), ("system", False),
                     ("params", False)]
    weights = smol.parts[0]
    assert weights.digest is not None and weights.path.name == f"sha256-{weights.digest[7:]}"
    assert "template is kept but not used" in smol.notes[0]
    assert [p.mmproj for p in found["ollama.com/library/vision:latest"].parts][-1] is True
    assert "LoRA adapter" in found["ollama.com/library/tuned:latest"].problem
    assert "is missing" in found["ollama.com/library/broken:latest"].problem
    (one,) = discover(models / "manifests/registry.ollama.ai/library/smollm2/135m")  # one manifest alone
    assert one.name == "ollama.com/library/smollm2:135m" and one.parts == smol.parts


def test_hf_cache(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    src = tmp_path / "src"
    src.mkdir()
    files = {"Tiny-Q4_K_M.gguf": write_gguf(src / "a.gguf"), "Tiny-Q8_0.gguf": write_gguf(src / "b.gguf"),
             "mmproj-Tiny-f32.gguf": write_mmproj(src / "m32.gguf"),
             "mmproj-Tiny-f16.gguf": write_mmproj(src / "m16.gguf")}
    for k, shard in enumerate(write_split(src, "Big-Q6_K", 3), 1):
        files[f"Q6_K/Big-Q6_K-{k:05d}-of-00003.gguf"] = shard
    hf_cache(hub, "org/Tiny-GGUF", files)
    (src / "x").mkdir()
    split = write_split(src / "x", "Half-Q2_K", 2)
    hf_cache(hub, "org/Half-GGUF", {"Half-Q2_K-00001-of-00002.gguf": split[0]})
    found = {f.name: f for f in discover(hub)}
    assert sorted(found) == ["hf.co/org/Half-GGUF:Q2_K", "hf.co/org/Tiny-GGUF:Q4_K_M",
                             "hf.co/org/Tiny-GGUF:Q6_K", "hf.co/org/Tiny-GGUF:Q8_0"]
    q4 = found["hf.co/org/Tiny-GGUF:Q4_K_M"]
    assert [p.filename for p in q4.parts] == ["Tiny-Q4_K_M.gguf", "mmproj-Tiny-f16.gguf"]
    assert q4.parts[1].mmproj and q4.parts[0].digest is not None
    assert q4.parts[0].path.parent.name == "blobs"  # the snapshot's symlink is followed
    assert [p.filename for p in found["hf.co/org/Tiny-GGUF:Q6_K"].parts][:3] == [
        f"Big-Q6_K-{k:05d}-of-00003.gguf" for k in (1, 2, 3)]
    assert "only 1 of its 2 shards" in found["hf.co/org/Half-GGUF:Q2_K"].problem
    one = discover(hub / "models--org--Tiny-GGUF")
    assert {f.name for f in one} == {n for n in found if "Tiny" in n}


def test_hf_cache_two_files_with_one_quant_take_their_stems(tmp_path: Path) -> None:
    a, b = write_gguf(tmp_path / "a.gguf"), write_gguf(tmp_path / "b.gguf", name="other")
    hf_cache(tmp_path / "hub", "org/R", {"base-Q4_0.gguf": a, "chat-Q4_0.gguf": b})
    names = sorted(f.name for f in discover(tmp_path / "hub"))
    assert names == ["hf.co/org/R:base-Q4_0", "hf.co/org/R:chat-Q4_0"]


def test_plain_folders_any_depth(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "a/b").mkdir(parents=True)
    write_gguf(root / "a/b/Tiny-Q4_K_M.gguf")
    write_mmproj(root / "a/b/mmproj-model-f16.gguf")
    write_split(root / "a", "Big-Q8_0", 2)
    (root / "a/notes.txt").write_text("x")
    (root / "a/fake.gguf").write_text("not a gguf")
    (root / ".hidden").mkdir()
    write_gguf(root / ".hidden/Secret-Q4_0.gguf")
    found = {f.name: f for f in discover(root)}
    assert sorted(found) == ["localhost/Big:Q8_0", "localhost/Tiny:Q4_K_M", "localhost/fake:latest"]
    assert [p.mmproj for p in found["localhost/Tiny:Q4_K_M"].parts] == [False, True]
    assert len(found["localhost/Big:Q8_0"].parts) == 2 and not found["localhost/Big:Q8_0"].problem
    assert found["localhost/fake:latest"].problem == "not a GGUF file"
    assert all(p.digest is None for f in found.values() for p in f.parts)  # hashed at import


def test_single_file_brings_its_shards_and_projector(tmp_path: Path) -> None:
    shards = write_split(tmp_path, "Big-Q8_0", 2)
    write_gguf(tmp_path / "Other-Q4_0.gguf")
    write_mmproj(tmp_path / "mmproj-f16.gguf")
    (only,) = discover(shards[1])
    assert only.name == "localhost/Big:Q8_0"
    assert [p.path.name for p in only.parts] == [s.name for s in shards] + ["mmproj-f16.gguf"]
    assert "projector" in discover(tmp_path / "mmproj-f16.gguf")[0].problem


def test_llama_cpp_cache_and_lmstudio(tmp_path: Path) -> None:
    cache = tmp_path / "llama.cpp"
    cache.mkdir()
    write_gguf(cache / "bartowski_SmolLM2-GGUF_SmolLM2-Q4_K_M.gguf")
    write_mmproj(cache / "bartowski_SmolLM2-GGUF_mmproj-f16.gguf")
    (cache / "manifest=bartowski=SmolLM2-GGUF=Q4_K_M.json").write_text(json.dumps(
        {"ggufFile": {"rfilename": "SmolLM2-Q4_K_M.gguf"}, "mmprojFile": {"rfilename": "mmproj-f16.gguf"}}))
    write_gguf(cache / "loose-Q8_0.gguf")
    found = {f.name: f for f in discover(cache)}
    assert sorted(found) == ["hf.co/bartowski/SmolLM2-GGUF:Q4_K_M", "localhost/loose:Q8_0"]
    assert [p.mmproj for p in found["hf.co/bartowski/SmolLM2-GGUF:Q4_K_M"].parts] == [False, True]
    studio = tmp_path / "lmstudio"
    (studio / "lmstudio-community/Tiny-GGUF").mkdir(parents=True)
    write_gguf(studio / "lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf")
    write_gguf(studio / "Loose-Q4_0.gguf")
    assert sorted(f.name for f in discover(studio, lmstudio=True)) == [
        "hf.co/lmstudio-community/Tiny-GGUF:Q4_K_M", "localhost/Loose:Q4_0"]
    assert sorted(f.name for f in discover(studio)) == ["localhost/Loose:Q4_0", "localhost/Tiny:Q4_K_M"]


def test_a_name_found_twice_is_kept_once(tmp_path: Path) -> None:
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        write_gguf(tmp_path / folder / "Tiny-Q4_0.gguf")
    found = discover_sources([(tmp_path / "one", False), (tmp_path / "two", False)])
    assert [bool(f.problem) for f in found] == [False, True]
    assert "the same name as" in found[1].problem
