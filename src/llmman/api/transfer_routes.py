"""Routes of issue 3 (pull, push, create, blobs, the read-only ``/v2/`` registry), kept out of app.py."""

from __future__ import annotations

from starlette.routing import Route

from llmman.api import pull, v2, verify


def transfer_routes() -> list[Route]:
    """The transfer and registry routes, to splice into the app's route table."""
    return [
        Route("/api/pull", pull.pull, methods=["POST"]),
        Route("/api/push", pull.push, methods=["POST"]),
        Route("/api/create", pull.create, methods=["POST"]),
        Route("/api/blobs/{digest}", pull.blob_head, methods=["HEAD"]),
        Route("/api/blobs/{digest}", pull.blob_upload, methods=["POST"]),
        Route("/api/verify", verify.verify, methods=["POST"]),
        Route("/v2/", v2.base, methods=["GET", "HEAD"]),
        Route("/v2/{path:path}", v2.route, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
    ]
