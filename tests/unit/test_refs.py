from __future__ import annotations

import dataclasses

import pytest

from llmman.errors import InvalidReference
from llmman.refs import Reference, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "full"),
    [
        # bare names: docker.io/ai/<name>, dots allowed
        ("gemma3", "docker.io/ai/gemma3:latest"),
        ("qwen3.5:0.8b", "docker.io/ai/qwen3.5:0.8b"),
        ("qwen3.5:0.8B", "docker.io/ai/qwen3.5:0.8B"),
        ("smollm2:135m", "docker.io/ai/smollm2:135m"),
        ("  gemma3  ", "docker.io/ai/gemma3:latest"),
        # owner/repo: Hugging Face, case kept
        ("unsloth/Qwen3.5-0.8B-GGUF", "hf.co/unsloth/Qwen3.5-0.8B-GGUF:latest"),
        ("unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M", "hf.co/unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M"),
        ("ai/smollm2", "hf.co/ai/smollm2:latest"),
        # already qualified
        ("hf.co/unsloth/x:Q4_K_M", "hf.co/unsloth/x:Q4_K_M"),
        ("docker.io/ai/smollm2:135m", "docker.io/ai/smollm2:135m"),
        ("docker.io/ai/smollm2", "docker.io/ai/smollm2:latest"),
        ("ghcr.io/org/models/llama:1b", "ghcr.io/org/models/llama:1b"),
        # registry hosts: a dot, a port, or localhost; a port is never a tag
        ("example.com:5000/ns/m:tag", "example.com:5000/ns/m:tag"),
        ("example.com:5000/ns/m", "example.com:5000/ns/m:latest"),
        ("localhost:5000/x", "localhost:5000/x:latest"),
        ("localhost/x:v1", "localhost/x:v1"),
        ("127.0.0.1:5000/a/b:c", "127.0.0.1:5000/a/b:c"),
        ("[::1]:5000/a:b", "[::1]:5000/a:b"),
        ("Example.COM/ns/m", "example.com/ns/m:latest"),
        # well-known renames
        ("registry-1.docker.io/ai/gemma3", "docker.io/ai/gemma3:latest"),
        ("index.docker.io/ai/gemma3:1b", "docker.io/ai/gemma3:1b"),
        ("huggingface.co/unsloth/x:Q8_0", "hf.co/unsloth/x:Q8_0"),
        # schemes
        ("hf://unsloth/x", "hf.co/unsloth/x:latest"),
        ("hf://unsloth/x:Q4_K_M", "hf.co/unsloth/x:Q4_K_M"),
        ("huggingface://unsloth/x", "hf.co/unsloth/x:latest"),
        ("hf://hf.co/unsloth/x", "hf.co/unsloth/x:latest"),
        ("oci://docker.io/ai/gemma3", "docker.io/ai/gemma3:latest"),
        # digests
        (f"gemma3@{DIGEST}", f"docker.io/ai/gemma3@{DIGEST}"),
        (f"gemma3:1b@{DIGEST}", f"docker.io/ai/gemma3:1b@{DIGEST}"),
        (
            f"example.com:5000/ns/m@{DIGEST.upper().replace('SHA256', 'sha256')}",
            f"example.com:5000/ns/m@{DIGEST}",
        ),
    ],
)
def test_parse_reference(text: str, full: str) -> None:
    ref = parse_reference(text)
    assert str(ref) == full
    assert ref.name == full
    # the full form is a fixed point
    assert parse_reference(full) == ref


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("gemma3", "docker.io", "ai/gemma3", "latest", None),
        ("unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M", "hf.co", "unsloth/Qwen3.5-0.8B-GGUF", "Q4_K_M", None),
        ("example.com:5000/ns/m:tag", "example.com:5000", "ns/m", "tag", None),
        (f"x:v@{DIGEST}", "docker.io", "ai/x", "v", DIGEST),
        (f"x@{DIGEST}", "docker.io", "ai/x", "latest", DIGEST),
    ],
)
def test_parse_reference_fields(
    text: str, registry: str, repository: str, tag: str, digest: str | None
) -> None:
    assert parse_reference(text) == Reference(registry, repository, tag, digest)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "gemma 3",
        "gemma3:",
        "gemma3:bad/tag",
        ":tag",
        "/x",
        "x/",
        "a//b",
        "-x",
        "x@sha256:1234",
        "x@md5:" + "a" * 32,
        "x@",
        "s3://bucket/m",
        "http://example.com/m",
        "oci://gemma3",
        "example.com:/ns/m",
        "example.com:99999/ns/m",
        "example.com:abc/ns/m",
        "exa_mple.com/ns/m",
        "[::1/x",
        "g" + ":" + "t" * 129,
    ],
)
def test_parse_reference_rejects(text: str) -> None:
    with pytest.raises(InvalidReference) as info:
        parse_reference(text)
    assert str(info.value).startswith("invalid model name: ")
    assert info.value.status == 400


def test_oci_scheme_forces_the_first_component_to_be_the_registry() -> None:
    ref = parse_reference("oci://myregistry/ns/m:1")
    assert ref == Reference("myregistry", "ns/m", "1")
    # without the scheme the same text is a Hugging Face owner/repo
    assert str(parse_reference("myregistry/ns")) == "hf.co/myregistry/ns:latest"


def test_aliases_hit_exact_string_before_anything_else() -> None:
    aliases = {"g": "unsloth/gemma-3-GGUF:Q4_K_M", "hf://x/y": "gemma3:1b", "mine": "hf://a/b"}
    assert str(parse_reference("g", aliases)) == "hf.co/unsloth/gemma-3-GGUF:Q4_K_M"
    assert str(parse_reference("  g ", aliases)) == "hf.co/unsloth/gemma-3-GGUF:Q4_K_M"
    assert str(parse_reference("hf://x/y", aliases)) == "docker.io/ai/gemma3:1b"
    assert str(parse_reference("mine", aliases)) == "hf.co/a/b:latest"
    # not an alias: exact match only (case and tag matter)
    assert str(parse_reference("G", aliases)) == "docker.io/ai/G:latest"
    assert str(parse_reference("g:latest", aliases)) == "docker.io/ai/g:latest"


def test_aliases_do_not_chain() -> None:
    aliases = {"a": "b", "b": "hf.co/x/y"}
    assert str(parse_reference("a", aliases)) == "docker.io/ai/b:latest"


def test_bad_alias_target_is_invalid() -> None:
    with pytest.raises(InvalidReference, match="bad target"):
        parse_reference("x", {"x": "bad target"})


def test_key_is_case_insensitive_but_display_keeps_case() -> None:
    a = parse_reference("unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M")
    b = parse_reference("hf.co/UNSLOTH/qwen3.5-0.8b-gguf:q4_k_m")
    assert a != b
    assert a.key() == b.key() == "hf.co/unsloth/qwen3.5-0.8b-gguf:q4_k_m"
    assert str(a) == "hf.co/unsloth/Qwen3.5-0.8B-GGUF:Q4_K_M"


def test_properties() -> None:
    ref = parse_reference("unsloth/x:Q4_K_M")
    assert ref.host_repository == "hf.co/unsloth/x"
    assert ref.is_huggingface
    assert not parse_reference("gemma3").is_huggingface
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.tag = "other"  # type: ignore[misc]
    assert Reference("docker.io", "ai/x").tag == "latest"
    assert hash(ref) == hash(parse_reference("hf.co/unsloth/x:Q4_K_M"))


def test_non_string_is_invalid() -> None:
    with pytest.raises(InvalidReference):
        parse_reference(None)  # type: ignore[arg-type]
