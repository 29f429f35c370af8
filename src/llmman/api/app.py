"""The one route table of the daemon."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Route

from llmman.api import (
    anthropic,
    drain,
    embeddings,
    health,
    llama_routes,
    logs_route,
    metrics_route,
    node,
    ollama_infer,
    ollama_models,
    openai,
    pool_view,
    requestlog_routes,
    responses,
    ui,
)
from llmman.api.auth import ApiKeys
from llmman.api.cors import CORSAndHostGuard
from llmman.api.errors import CatchAll, handle_http_error, handle_llmman_error
from llmman.api.limits import BodyLimits
from llmman.api.pool import pooled
from llmman.api.rpc_routes import rpc_routes
from llmman.api.services import Services
from llmman.api.transfer_routes import transfer_routes
from llmman.api.version_header import VersionHeader
from llmman.errors import LlmmanError
from llmman.protocol.llama_routes import CHAT_CHILD_PATHS, RERANK_PATHS

LLAMA_ROUTES = (*CHAT_CHILD_PATHS, *RERANK_PATHS)  # llama-server's own, per model (api/llama_routes.py)


def build_app(services: Services) -> Starlette:
    """The ASGI app serving the Ollama and OpenAI dialects over ``services``."""
    routes = [
        Route("/", ollama_models.root, methods=["GET", "HEAD"]),
        Route("/api/version", ollama_models.version, methods=["GET", "HEAD"]),
        Route("/api/tags", pooled("/api/tags", ollama_models.tags), methods=["GET", "HEAD"]),
        Route("/api/ps", pooled("/api/ps", ollama_models.ps), methods=["GET"]),
        Route("/api/show", ollama_models.show, methods=["POST"]),
        Route("/api/delete", ollama_models.delete, methods=["DELETE"]),
        Route("/api/copy", ollama_models.copy, methods=["POST"]),
        Route("/api/chat", ollama_infer.chat, methods=["POST"]),
        Route("/api/generate", ollama_infer.generate, methods=["POST"]),
        Route("/v1/chat/completions", openai.chat_completions, methods=["POST"]),
        Route("/v1/completions", openai.completions, methods=["POST"]),
        Route("/v1/models", pooled("/v1/models", openai.models), methods=["GET"]),
        Route("/v1/models/{id:path}", openai.model, methods=["GET"]),
        Route("/llmman/node", node.node, methods=["GET"]),
        Route("/llmman/drain", drain.drain, methods=["POST"]),
        Route("/llmman/drain", drain.state, methods=["GET"]),
        Route("/llmman/undrain", drain.undrain, methods=["POST"]),
        Route("/health", health.health, methods=["GET", "HEAD"]),
        Route("/metrics", metrics_route.metrics, methods=["GET"]),
        Route("/llmman/requests", requestlog_routes.requests, methods=["GET"]),
        Route("/llmman/stats", requestlog_routes.request_stats, methods=["GET"]),
        Route("/llmman/pool", pool_view.pool, methods=["GET"]),
        Route("/llmman/logs", logs_route.logs, methods=["GET"]),
        Route("/llmman/devices", ui.devices, methods=["GET"]),
        Route("/ui", ui.page, methods=["GET", "HEAD"]),
        Route("/ui/{name}", ui.page, methods=["GET", "HEAD"]),
        Route("/llmman/on/{node}/api/{name}", ui.on_node, methods=["GET", "POST", "DELETE"]),
        *transfer_routes(),
        *rpc_routes(),
        Route("/v1/messages", anthropic.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"]),
        Route("/v1/responses", responses.responses, methods=["POST"]),
        Route("/v1/responses/input_tokens", responses.input_tokens, methods=["POST"]),
        Route("/api/embed", embeddings.embed, methods=["POST"]),
        Route("/api/embeddings", embeddings.embeddings_legacy, methods=["POST"]),
        Route("/v1/embeddings", embeddings.v1_embeddings, methods=["POST"]),
        *(Route(path, llama_routes.llama_route, methods=["POST"]) for path in LLAMA_ROUTES),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(VersionHeader),
                    Middleware(CORSAndHostGuard, settings=services.settings), Middleware(CatchAll),
                    Middleware(ApiKeys, keys=services.settings.api_key_list,
                               scrape_keys=[services.settings.scrape_key]),
                    Middleware(BodyLimits, max_size=services.settings.max_body_size,
                               timeout=services.settings.body_timeout)],
        exception_handlers={
            LlmmanError: handle_llmman_error,
            HTTPException: handle_http_error,
        },
    )
    app.state.services = services
    return app
