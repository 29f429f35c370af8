"""Model references: what users type (``gemma3``, ``unsloth/Qwen3.5-0.8B-GGUF``) -> a full OCI reference.

The rules (after the existing llmman's ``shortnames.rs``), in order:

1. Surrounding whitespace is stripped; an exact hit in the alias table (``[aliases]`` in the config) is
   replaced by its value, which is then parsed by the rules below (aliases do not chain).
2. ``hf://x`` and ``huggingface://x`` mean ``hf.co/x``; ``oci://x`` means ``x`` with its first path
   component taken as the registry host whatever it looks like. Other schemes are refused.
3. A name without ``/`` (``gemma3``, ``qwen3.5:0.8b``; dots allowed) means ``docker.io/ai/<name>``.
4. A first component with a ``.``, a ``:port``, or equal to ``localhost`` is a registry host
   (``example.com:5000/ns/m:tag``); otherwise (``owner/repo``) the registry is ``hf.co``.
5. ``registry-1.docker.io`` and ``index.docker.io`` become ``docker.io``; ``huggingface.co`` becomes
   ``hf.co``; registry hosts are lowercased.
6. A tag is a ``:`` after the last ``/`` (a registry port is never a tag); no tag means ``latest``.
   ``@sha256:<64 hex>`` (or ``@sha512:<128 hex>``) pins a digest.
7. ``registry/repository`` is at most :data:`MAX_NAME_LENGTH` characters (the limit of Docker's
   ``distribution/reference`` grammar), a tag at most 128 (OCI distribution-spec 1.1); longer text is
   refused before any other rule runs, and error messages quote at most :data:`_QUOTE` characters of it.

Repository and tag keep the case the user typed (Hugging Face repositories are mixed case); use
:meth:`Reference.key` to compare names case-insensitively, as Ollama matches installed models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from llmman.errors import InvalidReference

__all__ = ["DEFAULT_TAG", "DOCKER_AI_NAMESPACE", "HF_REGISTRY", "Reference", "parse_reference"]

DEFAULT_TAG = "latest"
MAX_NAME_LENGTH = 255  # registry/repository
MAX_REFERENCE_LENGTH = MAX_NAME_LENGTH + 1 + 128 + 1 + 135  # name, ":" tag, "@" sha512 digest
_QUOTE = 80
DOCKER_AI_NAMESPACE = "docker.io/ai"
HF_REGISTRY = "hf.co"

_REGISTRY_ALIASES = {
    "registry-1.docker.io": "docker.io",
    "index.docker.io": "docker.io",
    "huggingface.co": HF_REGISTRY,
}
_HF_SCHEMES = ("hf://", "huggingface://")
_OCI_SCHEME = "oci://"

# A path component: alphanumerics joined by runs of ``.``, ``_`` or ``-`` (the OCI distribution grammar,
# widened to upper case for Hugging Face). A tag as in the OCI distribution spec.
_COMPONENT = re.compile(r"[A-Za-z0-9]+(?:[._-]+[A-Za-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]+\]")


@dataclass(frozen=True)
class Reference:
    """A fully qualified model reference.

    Attributes:
        registry: the registry host, normalised (``docker.io``, ``hf.co``, ``localhost:5000``).
        repository: the path inside the registry, case as typed (``ai/smollm2``, ``unsloth/Qwen3-GGUF``).
        tag: the tag, ``latest`` when none was given.
        digest: ``sha256:<hex>`` when the reference pins a manifest digest, else None.
    """

    registry: str
    repository: str
    tag: str = DEFAULT_TAG
    digest: str | None = None

    def __str__(self) -> str:
        """The full form: ``docker.io/ai/smollm2:135m``; ``registry/repo@sha256:…`` for a digest
        without an explicit tag (tag ``latest``); ``registry/repo:tag@sha256:…`` for both."""
        base = self.host_repository
        if self.digest is None:
            return f"{base}:{self.tag}"
        if self.tag == DEFAULT_TAG:
            return f"{base}@{self.digest}"
        return f"{base}:{self.tag}@{self.digest}"

    @property
    def name(self) -> str:
        """The display and listing form, always with its tag: same as ``str(self)``."""
        return str(self)

    @property
    def host_repository(self) -> str:
        """``registry/repository`` without tag or digest, e.g. ``docker.io/ai/smollm2``."""
        return f"{self.registry}/{self.repository}"

    @property
    def is_huggingface(self) -> bool:
        """True when the reference points at Hugging Face (registry ``hf.co``)."""
        return self.registry == HF_REGISTRY

    def key(self) -> str:
        """The lowercase full form, for case-insensitive matching of installed names (as Ollama does)."""
        return str(self).lower()


def parse_reference(text: str, aliases: Mapping[str, str] | None = None) -> Reference:
    """Parse what a user typed into a full :class:`Reference` (rules in the module docstring).

    Args:
        text: a model name as given to the CLI or in an API ``model`` field.
        aliases: the ``[aliases]`` table, ``short name -> reference``; matched on the exact stripped text.

    Returns:
        The normalised reference; ``str()`` of it is the name stored in the OCI index
        (``org.opencontainers.image.ref.name``).

    Raises:
        InvalidReference: ``invalid model name: "<text>" (<reason>)`` for empty text, an unknown scheme,
            bad characters, an empty or malformed tag, a malformed digest, or a bad registry host.
    """
    if not isinstance(text, str):
        raise InvalidReference(f"invalid model name: {text!r} (not a string)")
    stripped = text.strip()
    if aliases and stripped in aliases:
        value = aliases[stripped].strip()
        return _parse(value, original=value)
    return _parse(stripped, original=text)


def _fail(original: str, reason: str) -> InvalidReference:
    quoted = original if len(original) <= _QUOTE else original[:_QUOTE] + "…"
    return InvalidReference(f'invalid model name: "{quoted}" ({reason})')


def _parse(text: str, *, original: str) -> Reference:
    if not text:
        raise _fail(original, "empty")
    if len(text) > MAX_REFERENCE_LENGTH:
        raise _fail(original, f"{len(text)} characters, more than {MAX_REFERENCE_LENGTH}")
    if any(ch.isspace() for ch in text):
        raise _fail(original, "contains whitespace")

    forced_registry = False
    lowered = text.lower()
    for scheme in _HF_SCHEMES:
        if lowered.startswith(scheme):
            rest = text[len(scheme) :]
            qualified = rest.split("/", 1)[0].lower() in (HF_REGISTRY, "huggingface.co") and "/" in rest
            text = rest if qualified else f"{HF_REGISTRY}/{rest}"
            forced_registry = True
            break
    else:
        if lowered.startswith(_OCI_SCHEME):
            text = text[len(_OCI_SCHEME) :]
            forced_registry = True
            if "/" not in text:
                raise _fail(original, "oci:// needs registry/repository")
        elif "://" in text:
            raise _fail(original, f"unsupported scheme {text.split('://', 1)[0]!r}")

    name, digest = _split_digest(text, original)
    name, tag = _split_tag(name, original)

    if "/" not in name:
        registry, repository = "docker.io", f"ai/{name}"
    else:
        first, rest = name.split("/", 1)
        if forced_registry or _looks_like_host(first):
            registry, repository = _normalise_registry(first, original), rest
        else:
            registry, repository = HF_REGISTRY, name

    for component in repository.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise _fail(original, f"bad repository component {component!r}")
    if len(registry) + 1 + len(repository) > MAX_NAME_LENGTH:
        raise _fail(original, f"registry/repository longer than {MAX_NAME_LENGTH} characters")
    return Reference(registry=registry, repository=repository, tag=tag, digest=digest)


def _split_digest(text: str, original: str) -> tuple[str, str | None]:
    if "@" not in text:
        return text, None
    name, digest = text.rsplit("@", 1)
    digest = digest.lower()
    if not _DIGEST.fullmatch(digest):
        raise _fail(original, "digest must be sha256:<64 hex digits>")
    return name, digest


def _split_tag(name: str, original: str) -> tuple[str, str]:
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return name, DEFAULT_TAG
    name, tag = name.rsplit(":", 1)
    if not _TAG.fullmatch(tag):
        raise _fail(original, f"bad tag {tag!r}" if tag else "empty tag")
    return name, tag


def _looks_like_host(component: str) -> bool:
    return "." in component or ":" in component or component.lower() == "localhost" or component[:1] == "["


def _normalise_registry(host: str, original: str) -> str:
    """Validate ``host[:port]`` (IPv6 in brackets) and apply the well-known renames, lowercased."""
    name, port = host, ""
    if host.startswith("["):
        end = host.find("]")
        name, after = host[: end + 1], host[end + 1 :]
        if end < 0 or not _IPV6.fullmatch(name) or (after and not after.startswith(":")):
            raise _fail(original, f"bad registry host {host!r}")
        if after == ":":
            raise _fail(original, f"bad registry port in {host!r}")
        port = after[1:]
    elif ":" in host:
        name, port = host.split(":", 1)
        if not port:
            raise _fail(original, f"bad registry port in {host!r}")
    if port and (not port.isdigit() or not 0 < int(port) < 65536):
        raise _fail(original, f"bad registry port in {host!r}")
    if not name.startswith("[") and not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        raise _fail(original, f"bad registry host {host!r}")
    normal = host.lower()
    return _REGISTRY_ALIASES.get(normal, normal)
