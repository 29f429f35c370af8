"""What a recogniser found on disk: one model to import (:class:`Found`), its files (:class:`Part`), and the
naming rules every recogniser shares.

Names (docs/compatibility.md, "Importing the models you already have"):

* a file's tag is the quantisation its name carries (``Q4_K_M``, ``IQ3_XXS``, ``Q8_0``, ``BF16``...),
  upper-cased, else its stem (split suffix ``-00001-of-00003`` removed) — what ``llmman pull
  hf.co/ORG/NAME:TAG`` picks the same file by;
* a plain GGUF outside any known layout is ``localhost/<stem without the quant>:<quant or latest>``
  (``localhost``: made on this machine, pulled from nowhere).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llmman.errors import InvalidReference
from llmman.refs import DEFAULT_TAG, parse_reference

__all__ = ["LOCAL_REGISTRY", "Found", "Part", "file_tag", "is_gguf", "local_name", "split_stem", "valid_name"]

LOCAL_REGISTRY = "localhost"
GGUF_MAGIC = b"GGUF"
SPLIT = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)
# llama.cpp's quantisation names as they appear in file names (bartowski's, unsloth's, TheBloke's...).
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(?P<q>(?:UD-)?(?:I?Q[1-8](?:_[0-9A-Z]+)*|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|F32|FP16))"
    r"(?![A-Za-z0-9])", re.IGNORECASE)
_BAD = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Part:
    """One file of a model.

    Attributes:
        path: the file to take (resolved: an HF snapshot's symlink is followed to its blob).
        media_type: the layer's media type in the stored manifest.
        size: bytes.
        digest: ``sha256:<hex>`` when the source names the file by its digest (Ollama's
            ``sha256-<hex>`` blobs, a Hugging Face cache blob): trusted now, hashed at the first load;
            None: hashed at import.
        filename: the layer's file name annotation (ModelPack layers), "" for none.
        mmproj: the vision projector.
        link: True for weights (linked, never copied); False for small layers copied into the store
            (Ollama's config, params, system, template, license).
    """

    path: Path
    media_type: str
    size: int
    digest: str | None = None
    filename: str = ""
    mmproj: bool = False
    link: bool = True


@dataclass(frozen=True)
class Found:
    """One model a recogniser found.

    Attributes:
        name: the full reference it is imported as.
        source: where it was found (an Ollama manifest file, the first GGUF shard); recorded in the
            manifest as ``ai.llmman.imported-from``.
        parts: its layers, in manifest order.
        config: Ollama's config blob (copied as is); None: a ModelPack config is written.
        notes: what is kept but not used (a Go template), said to the user.
        problem: why it cannot be imported ("" when it can): it is listed as skipped.
    """

    name: str
    source: Path
    parts: tuple[Part, ...] = ()
    config: Part | None = None
    notes: tuple[str, ...] = ()
    problem: str = ""


def is_gguf(path: Path) -> bool:
    """True when ``path`` is a readable file starting with the GGUF magic."""
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def split_stem(filename: str) -> str:
    """The file name without ``.gguf`` and without a split suffix ``-0000k-of-0000n``."""
    base = filename.rsplit("/", 1)[-1]
    m = SPLIT.fullmatch(base)
    if m is not None:
        return m["prefix"]
    return base[:-5] if base.lower().endswith(".gguf") else base


def _clean(text: str) -> str:
    """``text`` as one reference component / tag: other characters become ``-``, separators trimmed."""
    return _BAD.sub("-", text).strip("._-")


def file_tag(filename: str) -> str:
    """The tag a GGUF file gets: the last quantisation its stem names, upper-cased, else the stem."""
    stem = split_stem(filename)
    quants = list(_QUANT.finditer(stem))
    tag = quants[-1]["q"].upper() if quants else _clean(stem)
    return tag[:128] or DEFAULT_TAG


def local_name(filename: str) -> str:
    """``localhost/<stem without the quant>:<quant or latest>`` for a GGUF outside any known layout."""
    stem = split_stem(filename)
    quants = list(_QUANT.finditer(stem))
    if quants:
        q = quants[-1]
        repo, tag = _clean(stem[:q.start()] + stem[q.end():]), q["q"].upper()
    else:
        repo, tag = _clean(stem), DEFAULT_TAG
    return f"{LOCAL_REGISTRY}/{repo or 'model'}:{tag}"


def valid_name(name: str) -> str | None:
    """``name`` as :func:`llmman.refs.parse_reference` normalises it, or None when it is not a valid
    full reference with an explicit registry."""
    try:
        ref = parse_reference(name)
    except InvalidReference:
        return None
    return str(ref) if ref.digest is None else None
