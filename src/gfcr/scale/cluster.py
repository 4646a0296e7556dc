"""Ray set-up shared by the scale-out entry points: import guard, loopback-only local clusters.

``import gfcr.scale`` never imports Ray; :func:`import_ray` does, with an actionable error when it
is missing. :func:`ray_session` connects to a running cluster (``address``) or starts a local one,
and shuts down only what it started.

A local cluster sends nothing off the machine and talks only over 127.0.0.1. Measured with
``strace`` on Ray 2.60, the settings alone (``_node_ip_address="127.0.0.1"``,
``include_dashboard=False``, ``RAY_USAGE_STATS_ENABLED=0``) are not enough: the GCS and workers
still bind and connect to the host's own non-loopback address, and the API-server process that Ray
starts even without a dashboard asks the cloud metadata service (TCP to 169.254.169.254, a DNS
query for ``metadata.google.internal``) whether usage stats are on or not. So :func:`init_ray`
also sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's single-node mode: every node address is
127.0.0.1) and, while Ray's own processes start, points the HTTP proxy variables at a closed
loopback port so that probe fails on 127.0.0.1. The job's workers get the caller's proxy variables
back through ``runtime_env``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class ScaleError(RuntimeError):
    """A scale-out run was refused or failed; the message says what happened to the store and what to do."""


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`ScaleError` saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ScaleError("Ray is not installed; install the extra with `pip install 'gfcr[ray]'` "
                         "(or `pip install 'ray>=2.40'`)") from e
    return ray


_PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
               "NO_PROXY", "no_proxy")
_CLOSED_PORT_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, so a request fails at once


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Make sure Ray is initialised; returns True when this call started (or connected) it.

    ``address`` (e.g. ``"auto"`` or ``"ray://head:10001"``) connects to an existing cluster;
    otherwise a loopback-only local cluster with ``num_cpus`` CPUs (default: all) is started (see
    the module docstring). An already initialised Ray (a test fixture, the caller's own
    ``ray.init``) is reused as is.
    """
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
        return True
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; the driver may have imported ray already
    saved = {k: os.environ.get(k) for k in _PROXY_VARS}
    # workers see the caller's proxy settings ("" = unset: urllib, requests and httpx ignore empty values)
    worker_env = {k: v or "" for k, v in saved.items()}
    try:
        for k in _PROXY_VARS:
            os.environ[k] = "" if k.lower() == "no_proxy" else _CLOSED_PORT_PROXY
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False, runtime_env={"env_vars": worker_env})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return True


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """``with ray_session(...) as ray:`` — :func:`init_ray`, then shut down only if this started it."""
    started = init_ray(address, num_cpus)
    ray = import_ray()
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def error_cause(e: BaseException) -> BaseException:
    """The user's exception inside a Ray task error (``RayTaskError.cause``), else ``e`` itself."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def kill_actors(ray: Any, actors: list[Any]) -> None:
    """Kill actors this run created (their processes exit; nothing else is touched)."""
    for a in actors:
        ray.kill(a, no_restart=True)
