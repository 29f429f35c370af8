"""Pulling and pushing models: the OCI distribution client, downloads, push, Hugging Face, credentials.

Layering: above :mod:`llmman.store` (it writes blobs and manifests through :class:`llmman.store.Store`),
below the gateway and the API. Everything here is synchronous (httpx + threads); the daemon runs it in
worker threads and forwards progress to its event loop.
"""

from __future__ import annotations
