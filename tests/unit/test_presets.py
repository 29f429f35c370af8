"""Presets (``[models."REF"]``): parsing, errors naming the key, config loading and listing, the
re-keying by full reference, the child's device variables, and golden argv of a preset model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmman.config.presets import Preset, by_reference, device_env, parse_preset
from llmman.config.settings import config_list, load_settings
from llmman.daemon import launch_spec
from llmman.errors import ConfigError
from llmman.refs import parse_reference
from llmman.runner.argv import build_argv
from llmman.sched.scheduler import ModelPlan

FULL = "docker.io/ai/smollm2:135m"


def full(name: str) -> str:
    return str(parse_reference(name))


def test_every_key_parses() -> None:
    table = {"context": 8192, "parallel": 2, "gpu_layers": 99, "devices": "0,1", "keep_alive": "1h",
             "preload": True, "extra_args": ["--flash-attn", "on"]}  # fmt: skip
    assert parse_preset("smollm2:135m", table) == Preset(
        reference="smollm2:135m", context=8192, parallel=2, gpu_layers=99, devices="0,1", keep_alive=3600.0,
        preload=True, extra_args=("--flash-attn", "on"))  # fmt: skip


@pytest.mark.parametrize(("table", "message"), [
    ({"ctx": 1}, "unknown preset key 'models.\"m\".ctx'"),
    ({"context": "8k"}, 'models."m".context must be an integer'),
    ({"context": 10}, "at least 256"),
    ({"parallel": 0}, "at least 1"),
    ({"parallel": True}, "must be an integer"),
    ({"gpu_layers": -3}, "at least -2"),
    ({"devices": ["0"]}, "device ids"),
    ({"keep_alive": "soon"}, 'models."m".keep_alive'),
    ({"preload": "yes"}, "true or false"),
    ({"extra_args": "--foo"}, "list of strings"),
    ({"extra_args": [1]}, "list of strings"),
])  # fmt: skip
def test_bad_presets_are_config_errors_naming_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_preset("m", table)
    assert message in str(info.value)


def test_negative_keep_alive_is_forever() -> None:
    assert parse_preset("m", {"keep_alive": -1}).keep_alive == math.inf


def test_by_reference_keys_by_the_full_reference_and_rejects_bad_or_double_names() -> None:
    presets = by_reference({"smollm2:135m": Preset("smollm2:135m", parallel=2)}, full)
    assert presets == {FULL: Preset(FULL, parallel=2)}
    with pytest.raises(ConfigError, match="invalid model name"):
        by_reference({"Bad Name!": Preset("Bad Name!")}, full)
    with pytest.raises(ConfigError, match=r"a second preset for docker\.io/ai/smollm2:135m"):
        by_reference({"smollm2:135m": Preset("a"), FULL: Preset("b")}, full)


@pytest.mark.parametrize(("devices", "expected"), [
    (None, {"PATH": "/bin"}),
    ("0,1", {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1",
             "GGML_VK_VISIBLE_DEVICES": "0,1"}),
])  # fmt: skip
def test_device_env_sets_every_backends_variable(devices: str | None, expected: dict[str, str]) -> None:
    assert device_env({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "7"} if devices else {"PATH": "/bin"},
                      devices) == expected  # fmt: skip


def test_config_file_presets_load_list_and_fail_on_unknown_keys(tmp_path: Path) -> None:
    user = tmp_path / "user.conf"
    user.write_text('[models."smollm2:135m"]\ncontext = 8192\nparallel = 2\nkeep_alive = "1h"\n'
                    'preload = true\nextra_args = ["--flash-attn", "on"]\n', encoding="utf-8")  # fmt: skip
    settings = load_settings(env={"HOME": str(tmp_path)}, system_file=tmp_path / "none", user_file=user)
    assert settings.presets["smollm2:135m"].parallel == 2
    rows = [row for row in config_list(settings) if row[0].startswith("models.")]
    assert rows == [
        ('models."smollm2:135m".context', "8192", str(user)),
        ('models."smollm2:135m".parallel', "2", str(user)),
        ('models."smollm2:135m".keep_alive', "1h0m0s", str(user)),
        ('models."smollm2:135m".preload', "true", str(user)),
        ('models."smollm2:135m".extra_args', "--flash-attn on", str(user)),
    ]
    user.write_text('[models."smollm2:135m"]\nnum_ctx = 8192\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"user.conf: unknown preset key 'models.\"smollm2:135m\".num_ctx'"):
        load_settings(env={"HOME": str(tmp_path)}, system_file=tmp_path / "none", user_file=user)


def test_golden_argv_of_a_preset_model() -> None:
    plan = ModelPlan(
        reference=FULL,
        digest="sha256:" + "0" * 64,
        size=1,
        n_ctx=8192,
        model_path="/m.gguf",
        n_parallel=2,
        n_gpu_layers=99,
        devices="0,1",
        extra_args=("--flash-attn", "on"),
    )
    assert build_argv("llama-server", launch_spec(plan), host="127.0.0.1", port=5000) == [
        "llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port", "5000", "-c", "16384", "-np", "2",
        "--no-kv-unified", "-a", FULL, "--no-ui", "--metrics", "--log-verbosity", "4", "-ngl", "99",
        "--flash-attn", "on",
    ]  # fmt: skip


def test_golden_argv_of_an_embedding_child_keeps_pooling_before_the_preset_args() -> None:
    plan = ModelPlan(
        reference=FULL,
        digest="sha256:" + "0" * 64,
        size=1,
        n_ctx=512,
        model_path="/m.gguf",
        embedding=True,
        pooling="mean",
        extra_args=("--batch-size", "512"),
    )
    assert build_argv("llama-server", launch_spec(plan), host="::1", port=1)[-10:] == [
        "4", "--embeddings", "-b", "512", "-ub", "512",
        "--pooling", "mean", "--batch-size", "512"]  # fmt: skip
