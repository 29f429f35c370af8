"""The operator's view: the request log (SQLite) and its stats, Prometheus metrics, and the health answer.

:class:`~llmman.obs.observer.Observer` is the one handle the data path reports to
(``Services.obs.request_done(RequestRow(...))``); the routes are in ``api/metrics_route.py``,
``api/health.py`` and ``api/requestlog_routes.py``. See docs/observability.md.
"""
