"""``gfcr serve``: an OpenAI-compatible server over the ``hf`` engine, with dynamic batching.

:mod:`~gfcr.serve.app` builds the FastAPI app and runs it; :mod:`~gfcr.serve.api` holds the request
bodies, limits and loopback checks; :mod:`~gfcr.serve.chat` the chat rendering and tool-call parsers;
:mod:`~gfcr.serve.server` the engine-facing core; :mod:`~gfcr.serve.batching` the request batcher.
"""

from gfcr.serve.app import (
    LOOPBACK_NAMES,
    create_app,
    free_port,
    host_allowed,
    is_loopback,
    serve,
    serve_in_thread,
)

__all__ = ["LOOPBACK_NAMES", "create_app", "free_port", "host_allowed", "is_loopback", "serve", "serve_in_thread"]
