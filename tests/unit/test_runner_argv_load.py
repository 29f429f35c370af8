"""Ollama's load options as llama-server b11434 flags (llmman.runner.argv.load_args, load_mode), and
their parsing and range checks (llmman.protocol.ollama.fields.runner_options); issue 14 item 6."""

from __future__ import annotations

import pytest

from llmman.errors import BadRequest
from llmman.protocol.ollama.fields import RunnerOptions, runner_options
from llmman.runner.argv import LoadOptions, load_args, load_mode


@pytest.mark.parametrize(("mmap", "mlock", "mode"), [
    (None, None, None), (None, False, None), (True, None, "mmap"), (False, None, "none"),
    (None, True, "mmap+mlock"), (True, True, "mmap+mlock"), (False, True, "mlock"), (False, False, "none"),
    (True, False, "mmap"),
])  # fmt: skip
def test_load_mode(mmap: bool | None, mlock: bool | None, mode: str | None) -> None:
    assert load_mode(mmap, mlock) == mode


@pytest.mark.parametrize(("load", "argv"), [
    (LoadOptions(), ()),
    (LoadOptions(threads=3), ("-t", "3")),
    (LoadOptions(batch=64), ("-b", "64", "-ub", "64")),
    (LoadOptions(main_gpu=1), ("-mg", "1")),
    (LoadOptions(mmap=False, mlock=True), ("-lm", "mlock")),
    (LoadOptions(threads=2, batch=32, main_gpu=0, mmap=True),
     ("-t", "2", "-b", "32", "-ub", "32", "-mg", "0", "-lm", "mmap")),
])  # fmt: skip
def test_load_args(load: LoadOptions, argv: tuple[str, ...]) -> None:
    assert load_args(load) == argv


def test_cpu_only_uses_no_device() -> None:
    assert load_args(LoadOptions(threads=2), cpu_only=True) == ("-t", "2", "-dev", "none")


def test_an_embedding_child_keeps_a_batch_that_holds_its_context() -> None:
    assert load_args(LoadOptions(batch=256), embedding=True, n_ctx=2048) == ()
    assert load_args(LoadOptions(batch=4096), embedding=True, n_ctx=2048) == ("-b", "4096", "-ub", "4096")


def test_runner_options_reads_every_load_option() -> None:
    got = runner_options({"num_ctx": 4096, "num_batch": 128, "num_gpu": 0, "main_gpu": 1, "num_thread": 4,
                          "use_mmap": False, "use_mlock": True, "temperature": 0.2})
    assert got == RunnerOptions(num_ctx=4096, num_batch=128, num_gpu=0, main_gpu=1, num_thread=4,
                                use_mmap=False, use_mlock=True)


def test_automatic_values_are_not_given() -> None:
    assert runner_options({"num_gpu": -1, "num_thread": 0}) == RunnerOptions()


@pytest.mark.parametrize(("options", "words"), [
    ({"num_batch": 0}, 'option "num_batch" must be at least 1, got 0'),
    ({"num_gpu": -2}, 'option "num_gpu" must be -1 (automatic) or at least 0, got -2'),
    ({"main_gpu": -1}, 'option "main_gpu" must be at least 0, got -1'),
    ({"num_thread": -1}, 'option "num_thread" must be 0 (automatic) or at least 1, got -1'),
    ({"use_mlock": 1}, 'option "use_mlock" must be of type boolean'),
])  # fmt: skip
def test_values_llama_server_cannot_take_are_refused(options: dict[str, object], words: str) -> None:
    with pytest.raises(BadRequest) as err:
        runner_options(options)
    assert err.value.message == words
