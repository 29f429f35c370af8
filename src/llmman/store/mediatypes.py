"""Media types and annotation keys of the OCI image layout and of the model artifacts llmman stores.

Sources: OCI image-spec 1.1 (image-layout.md, image-index.md, manifest.md, annotations.md), CNCF ModelPack
(modelpack/model-spec/docs/spec.md, annotations.md), Docker Model Runner artifacts (model-distribution),
Ollama's Modelfile layers (server/images.go) for derived models.

Derived models (``POST /api/create`` with ``system``/``parameters``/``messages``/``license``,
:mod:`llmman.store.derive`) use Ollama's own layer types, so a registry, ``oras`` or Ollama itself reads
them by the same name: ``application/vnd.ollama.image.system`` (UTF-8 text), ``.params`` (a JSON object of
Ollama options), ``.messages`` (a JSON array of ``{role, content}``), ``.license`` (UTF-8 text, one layer
per license).

Ollama's own models (its local store, read by ``llmman import``, and manifests pulled from a registry in
Ollama's format) name the weights ``application/vnd.ollama.image.model`` (one GGUF), the vision projector
``.projector``, a LoRA ``.adapter`` (not servable: llmman refuses such a model) and a Go ``.template``
(kept in the manifest, not used: the GGUF's own chat template is); their config is a Docker image config
(``application/vnd.docker.container.image.v1+json``).
"""

from __future__ import annotations

IMAGE_LAYOUT_VERSION = "1.0.0"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})

# CNCF ModelPack
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODEL_WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"
MODEL_DOC_RAW = "application/vnd.cncf.model.doc.v1.raw"
MODEL_WEIGHT_PREFIX = "application/vnd.cncf.model.weight."
MODEL_DOC_PREFIX = "application/vnd.cncf.model.doc."

# Docker Model Runner (docker.io/ai/*)
DOCKER_AI_CONFIG = "application/vnd.docker.ai.model.config.v0.1+json"
DOCKER_AI_GGUF = "application/vnd.docker.ai.gguf.v3"
DOCKER_AI_MMPROJ = "application/vnd.docker.ai.mmproj"
DOCKER_AI_LICENSE = "application/vnd.docker.ai.license"

# Annotations
REF_NAME = "org.opencontainers.image.ref.name"
TITLE = "org.opencontainers.image.title"
CREATED = "org.opencontainers.image.created"
FILEPATH = "org.cncf.model.filepath"
ROLE = "ai.llmman.role"
ROLE_MMPROJ = "mmproj"
IMPORTED_FROM = "ai.llmman.imported-from"  # manifest annotation: the path ``llmman import`` read

# Ollama Modelfile layers, used by derived models
OLLAMA_SYSTEM = "application/vnd.ollama.image.system"
OLLAMA_PARAMS = "application/vnd.ollama.image.params"
OLLAMA_MESSAGES = "application/vnd.ollama.image.messages"
OLLAMA_LICENSE = "application/vnd.ollama.image.license"
OLLAMA_TEMPLATE = "application/vnd.ollama.image.template"
OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"
OLLAMA_ADAPTER = "application/vnd.ollama.image.adapter"
OLLAMA_PREFIX = "application/vnd.ollama.image."
DOCKER_IMAGE_CONFIG = "application/vnd.docker.container.image.v1+json"
DERIVED_TYPES = frozenset({OLLAMA_SYSTEM, OLLAMA_PARAMS, OLLAMA_MESSAGES, OLLAMA_LICENSE})
