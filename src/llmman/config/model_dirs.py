"""Where other tools keep the models a user already has: the folders ``llmman import`` reads by keyword.

Each follows its tool's own variable and default, as that tool resolves it (an empty variable counts as
unset):

* ``ollama``: ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (Ollama's envconfig) and
  ``/usr/share/ollama/.ollama/models`` (the home of the ``ollama`` user that Ollama's Linux install runs
  its service as).
* ``hf``: the Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE`` (its older
  name), else ``$HF_HOME/hub``, ``$HF_HOME`` defaulting to ``$XDG_CACHE_HOME/huggingface`` or
  ``~/.cache/huggingface`` (huggingface_hub's constants).
* ``llama.cpp``: ``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or ``~/.cache/llama.cpp``
  (llama.cpp's ``fs_get_cache_directory`` on Linux).
* ``lmstudio``: ``~/.lmstudio/models`` and the older ``~/.cache/lm-studio/models``.

:func:`model_dirs` is the one reader, called by :func:`llmman.config.environment.read_environment` with
the environment the settings are read from: everyone else takes ``settings.environment.model_dirs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KEYWORDS", "ModelDirs", "home", "model_dirs"]

OLLAMA_SERVICE_MODELS = Path("/usr/share/ollama/.ollama/models")
KEYWORDS = ("ollama", "hf", "llama.cpp", "lmstudio")  # the SOURCE keywords of ``llmman import``


@dataclass(frozen=True)
class ModelDirs:
    """The folders of each keyword (see the module docstring); a folder may not exist."""

    ollama: tuple[Path, ...]
    hf: Path
    llama_cpp: Path
    lmstudio: tuple[Path, ...]

    def of(self, keyword: str) -> tuple[Path, ...]:
        """The folders ``keyword`` (one of :data:`KEYWORDS`) names. KeyError for another word."""
        table = {"ollama": self.ollama, "hf": (self.hf,), "llama.cpp": (self.llama_cpp,),
                 "lmstudio": self.lmstudio}
        return table[keyword]


def home(env: Mapping[str, str]) -> Path:
    """``$HOME``, else the account's home directory."""
    value = env.get("HOME")
    return Path(value) if value else Path.home()


def _expand(text: str, env: Mapping[str, str]) -> Path:
    if text == "~" or text.startswith("~/"):
        return home(env) / text[2:]
    return Path(text)


def model_dirs(env: Mapping[str, str]) -> ModelDirs:
    """The :class:`ModelDirs` that ``env`` describes."""
    user = home(env)
    cache = _expand(env.get("XDG_CACHE_HOME") or "~/.cache", env)
    hf_home = _expand(env["HF_HOME"], env) if env.get("HF_HOME") else cache / "huggingface"
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    ollama = (_expand(env["OLLAMA_MODELS"], env),) if env.get("OLLAMA_MODELS") else (
        user / ".ollama" / "models", OLLAMA_SERVICE_MODELS)
    return ModelDirs(
        ollama=ollama,
        hf=_expand(hub, env) if hub else hf_home / "hub",
        llama_cpp=_expand(env["LLAMA_CACHE"], env) if env.get("LLAMA_CACHE") else cache / "llama.cpp",
        lmstudio=(user / ".lmstudio" / "models", user / ".cache" / "lm-studio" / "models"),
    )
