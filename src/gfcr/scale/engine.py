"""``RayEngine``: one engine made of N Ray actors, each holding an inner engine (``hf`` or ``vllm``).

The training loop switches to it with ``generate.engine: ray``: generation is spread over the
actors, and after each update the trainer's weights reach every actor through Ray's object store.

* **Prompts are tokenized once, on the driver.** Every request's prompt ids are resolved with the
  driver's tokenizer (chat template → ids) before anything is sent, so all actors see identical ids.
* **Sharding by rows.** The ``sum(n)`` rows of a call are cut into ``workers`` contiguous shards of
  near-equal size (:func:`split_rows`); a request that straddles a cut is split into two requests
  whose seeds continue where the first part stopped (sample ``i`` still uses ``seed + i``). Results
  are gathered back in request order. So results do not depend on ``workers``, up to float
  rounding from different batch shapes (tested with greedy decoding: identical tokens).
* **Weights** (:meth:`RayEngine.load_weights`): the state dict is put in the object store once
  (``ray.put``) and every actor loads it with its inner engine's ``load_weights``; the call returns
  when all have finished.

Always start Ray through :func:`gfcr.scale.init_ray` (this module does): a plain ``ray.init`` on
this kind of machine sends traffic off it (see :mod:`gfcr.scale.cluster`).
"""

from __future__ import annotations

from typing import Any

from gfcr.generate.engines.base import GenRequest, GenResult

from .cluster import ScaleError, error_cause, import_ray, init_ray, kill_actors


def split_rows(sizes: list[int], parts: int) -> list[list[tuple[int, int, int]]]:
    """Cut the rows of requests (request ``i`` has ``sizes[i]`` rows) into ``parts`` contiguous shards.

    Args:
        sizes: ``[R]`` rows per request (each ``>= 1``).
        parts: number of shards (``>= 1``).
    Returns:
        ``parts`` lists of pieces ``(request index, first row, row count)``; shard ``s`` holds rows
        ``[s·N // parts, (s+1)·N // parts)`` of the ``N = sum(sizes)`` rows in order (so sizes differ
        by at most one; a shard may be empty when ``N < parts``).

    Example: ``split_rows([3, 1], 2)`` → ``[[(0, 0, 2)], [(0, 2, 1), (1, 0, 1)]]``: rows 0-1 of
    request 0; then its row 2 and request 1's only row.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if any(n < 1 for n in sizes):
        raise ValueError(f"every request needs at least one row, got sizes {sizes}")
    total = sum(sizes)
    bounds = [s * total // parts for s in range(parts + 1)]
    shards: list[list[tuple[int, int, int]]] = [[] for _ in range(parts)]
    start = 0  # global row index of request i's first row
    for i, n in enumerate(sizes):
        for s in range(parts):
            lo, hi = max(bounds[s], start), min(bounds[s + 1], start + n)
            if lo < hi:
                shards[s].append((i, lo - start, hi - lo))
        start += n
    return shards


class EngineWorker:
    """Actor body of :class:`RayEngine`: builds one inner engine (``make_engine(inner, model=..., **params)``)."""

    def __init__(self, inner: str, model: str | None, inner_params: dict[str, Any], torch_threads: int | None):
        if torch_threads:
            import torch

            torch.set_num_threads(int(torch_threads))
        from gfcr.generate.engines import make_engine

        self.engine = make_engine(inner, model=model, **inner_params)

    def info(self) -> dict[str, Any]:
        """The inner engine's name, eos ids (when it has them) and process id."""
        import os

        eos = getattr(self.engine, "eos_ids", None)
        return {"name": getattr(self.engine, "name", type(self.engine).__name__),
                "eos_ids": sorted(int(e) for e in eos) if eos is not None else None, "pid": os.getpid()}

    def generate(self, requests: list[GenRequest]) -> list[list[GenResult]]:
        return self.engine.generate(requests)

    def load_weights(self, weights: dict[str, Any], policy_version: str | None) -> None:
        if not hasattr(self.engine, "load_weights"):
            from gfcr.generate.sync import WeightSyncError

            raise WeightSyncError(f"inner engine {getattr(self.engine, 'name', self.engine)!r} cannot load weights")
        self.engine.load_weights(weights, policy_version=policy_version)

    def set_policy_version(self, version: str | None) -> None:
        if hasattr(self.engine, "set_policy_version"):
            self.engine.set_policy_version(version)

    def policy_version(self) -> str:
        return str(self.engine.policy_version)

    def weights_hash(self) -> str:
        """Content hash of the inner engine's weights (:func:`gfcr.models.model_hash`); for tests and checks."""
        from gfcr.models import model_hash

        model = getattr(self.engine, "model", None)
        if model is None or not hasattr(model, "state_dict"):
            raise ScaleError(f"inner engine {getattr(self.engine, 'name', '?')!r} exposes no torch model to hash")
        return model_hash(model, 32)


class RayEngine:
    """Generation over ``workers`` Ray actors, each holding an inner engine; weights synced via the object store.

    Args:
        model: HF model directory or name for every inner engine (``None``/``"default"``: the
            default model); the driver loads its tokenizer from it unless ``tokenizer`` is given.
        workers: number of actors (each gets a contiguous shard of every call's rows).
        inner: the inner engine's name in :data:`gfcr.generate.engines.ENGINES` (``hf``, ``vllm``).
        inner_params: keyword arguments of the inner engine (e.g. ``{"max_batch": 32}`` for ``hf``,
            ``{"gpu_memory_utilization": 0.3, "weight_sync": True}`` for ``vllm``).
        tokenizer: the driver's tokenizer (object or path); it must tokenize like the inner engines'.
        policy_version: the version recorded with rollouts; ``None`` asks actor 0 for its inner
            engine's version (the weights hash for ``hf``).
        address: connect to this Ray cluster (``"auto"``, ``"ray://head:10001"``); otherwise a
            loopback-only local one is started (:func:`gfcr.scale.init_ray`) unless Ray is running.
        num_cpus: CPUs of a local cluster this engine starts (default: all).
        actor_options: ``ray.remote`` options of each actor (default ``{"num_cpus": 1}``; add
            ``{"num_gpus": 1}`` for a GPU inner engine).
        torch_threads: torch threads per actor (the same count everywhere keeps results reproducible).
        start_timeout_s: how long to wait for all actors to be placed and their inner engines built
            (``None``: forever); actors the cluster cannot place (too few CPUs/GPUs) would otherwise wait
            for ever.

    Build errors of the inner engines (a bad model path, a missing extra) are raised here as a
    :class:`~gfcr.scale.cluster.ScaleError` with their cause, after the actors are killed.
    """

    name = "ray"

    def __init__(
        self,
        model: str | None = None,
        workers: int = 2,
        inner: str = "hf",
        inner_params: dict[str, Any] | None = None,
        tokenizer: Any = None,
        policy_version: str | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
        actor_options: dict[str, Any] | None = None,
        torch_threads: int = 1,
        start_timeout_s: float | None = 600.0,
    ):
        if int(workers) < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if model is not None and not isinstance(model, str):
            raise TypeError(f"RayEngine(model=...) takes a model directory or name, got {type(model).__name__}; "
                            "load a module's weights with load_weights() instead")
        if inner == "ray":
            raise ValueError("RayEngine's inner engine cannot be 'ray'; choose e.g. 'hf' or 'vllm'")
        from gfcr.generate.engines import ENGINES

        if inner not in ENGINES and ":" not in inner:
            raise ValueError(f"unknown inner engine {inner!r}; choose one of {sorted(set(ENGINES) - {'ray'})}")
        self.workers = int(workers)
        self.inner = inner
        self.model_name = model
        self.tokenizer = self._load_tokenizer(model, tokenizer)
        self._version = policy_version
        self._consistent = True  # False after a load that reached only some actors
        self._closed = False
        self._actors: list[Any] = []
        self._started = init_ray(address, num_cpus)
        ray = import_ray()
        opts: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0}
        opts.update(actor_options or {})
        actor_cls = ray.remote(**opts)(EngineWorker)
        try:
            self._actors = [actor_cls.remote(inner, model, dict(inner_params or {}), torch_threads)
                            for _ in range(self.workers)]
            refs = [a.info.remote() for a in self._actors]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=start_timeout_s)
            if len(ready) < len(refs):
                raise ScaleError(
                    f"only {len(ready)} of {self.workers} RayEngine actors started within {start_timeout_s} s; each "
                    f"asks for {_resources(opts)}, the cluster has {ray.cluster_resources()} with "
                    f"{ray.available_resources()} free. Use fewer workers, smaller actor_options, or a bigger cluster.")
            infos = self._gather(refs, "starting the inner engine")
        except BaseException:
            self.close()
            raise
        self.pids = [i["pid"] for i in infos]
        eos = infos[0]["eos_ids"]
        if eos is not None:
            self.eos_ids = set(eos)  # the topologies strip these from multi-turn assistant text
        if policy_version is not None:
            self.set_policy_version(policy_version)

    @staticmethod
    def _load_tokenizer(model: str | None, tokenizer: Any) -> Any:
        from transformers import AutoTokenizer

        if tokenizer is None:
            from gfcr.models import resolve_model

            tokenizer = resolve_model(model)
        if isinstance(tokenizer, str):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        return tokenizer

    # --- identity --------------------------------------------------------------------------------
    @property
    def policy_version(self) -> str:
        if self._version is None:
            self._check_open()
            self._version = self._gather([self._actors[0].policy_version.remote()], "reading the policy version")[0]
        return self._version

    def set_policy_version(self, version: str | None) -> None:
        """Set the version string on the driver and every actor (``None``: actor 0's weights hash on next use)."""
        self._check_open()
        self._gather([a.set_policy_version.remote(version) for a in self._actors], "setting the policy version")
        self._version = version

    # --- prompts ---------------------------------------------------------------------------------
    def encode_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat-templated conversation, with the driver's tokenizer (like ``HFEngine``'s)."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # --- generation ------------------------------------------------------------------------------
    def generate(self, requests: list[GenRequest]) -> list[list[GenResult]]:
        """``params.n`` results per request, in order; rows sharded over the actors (see module docstring)."""
        self._check_open()
        if not self._consistent:
            from gfcr.generate.sync import WeightSyncError

            raise WeightSyncError("the actors hold different weights after a failed load_weights; "
                                  "call load_weights again before generating")
        if not requests:
            return []
        ids = [list(r.prompt_ids) if r.prompt_ids is not None else self.encode_messages(r.messages or [])
               for r in requests]
        shards = split_rows([r.params.n for r in requests], self.workers)
        refs, used = [], []
        for s, pieces in enumerate(shards):
            if not pieces:
                continue
            sub = []
            for i, first, count in pieces:
                p = requests[i].params
                seed = None if p.seed is None else int(p.seed) + first
                sub.append(GenRequest(prompt_ids=[int(t) for t in ids[i]],
                                      params=p.model_copy(update={"n": count, "seed": seed}),
                                      request_id=requests[i].request_id))
            refs.append(self._actors[s].generate.remote(sub))
            used.append(pieces)
        out: list[list[GenResult]] = [[] for _ in requests]
        for pieces, results in zip(used, self._gather(refs, "generating"), strict=True):
            for (i, _, count), res in zip(pieces, results, strict=True):
                if len(res) != count:
                    raise ScaleError(f"an actor returned {len(res)} results for a request of n={count}")
                out[i].extend(res)
        return out

    # --- weights ---------------------------------------------------------------------------------
    def load_weights(self, weights: Any, policy_version: str | None = None) -> None:
        """Load new weights (a state dict or a module whose state dict to copy) into every actor.

        The (CPU) state dict is put in Ray's object store once and each actor's inner engine loads it
        (``hf``: names and shapes checked before anything is copied). Returns when all actors have
        finished. ``policy_version``: the new version (``None``: actor 0's weights hash on next use).

        Raises :class:`~gfcr.generate.sync.WeightSyncError` if any actor fails. Then: if **no**
        actor loaded the weights (e.g. wrong names or shapes, which every actor rejects before
        copying a tensor) all actors keep their old weights and version and the engine still
        generates with them; if only **some** did (an actor died or ran out of memory midway), the
        actors hold different weights and :meth:`generate` refuses until a ``load_weights`` succeeds
        on all of them. The error names each failed actor and its cause.
        """
        from gfcr.generate.sync import WeightSyncError

        self._check_open()
        ray = import_ray()
        sd = weights.state_dict() if hasattr(weights, "state_dict") else weights
        if not isinstance(sd, dict):
            raise WeightSyncError(f"load_weights needs a state dict or a module, got {type(weights).__name__}")
        cpu = {k: (v.detach().cpu() if hasattr(v, "detach") else v) for k, v in sd.items()}
        ref = ray.put(cpu)  # once; every actor reads the same object
        calls = [a.load_weights.remote(ref, policy_version) for a in self._actors]
        failed: list[str] = []
        for k, c in enumerate(calls):
            try:
                ray.get(c)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                cause = error_cause(e)
                failed.append(f"actor {k}: {type(cause).__name__}: {_first_line(cause)}")
        if failed:
            if len(failed) < len(calls):
                self._consistent = False
                state = (f"{len(calls) - len(failed)} of {len(calls)} actors loaded the new weights, the others did "
                         "not: generate() refuses until load_weights succeeds on all actors")
            else:
                state = "no actor loaded them; all keep their previous weights and version"
            raise WeightSyncError(f"loading weights into the Ray actors failed ({state}): " + "; ".join(failed))
        self._consistent = True
        self._version = policy_version

    # --- lifetime --------------------------------------------------------------------------------
    def weights_hashes(self) -> list[str]:
        """Each actor's weights hash (:meth:`EngineWorker.weights_hash`), in actor order."""
        self._check_open()
        return self._gather([a.weights_hash.remote() for a in self._actors], "hashing weights")

    def close(self) -> None:
        """Kill the actors (asynchronously: their processes exit shortly after); shut Ray down only if this
        engine started it. Safe to call twice; the engine cannot be used afterwards."""
        actors, self._actors = self._actors, []
        if actors or self._started:
            ray = import_ray()
            if actors and ray.is_initialized():
                kill_actors(ray, actors)
            if self._started:
                self._started = False
                ray.shutdown()
        self._closed = True

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ScaleError("this RayEngine is closed (its actors were killed); build a new one")

    def _gather(self, refs: list[Any], what: str) -> list[Any]:
        ray = import_ray()
        try:
            return ray.get(refs)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
            cause = error_cause(e)
            raise ScaleError(f"RayEngine failed {what} ({self.inner} inner engine, model {self.model_name!r}): "
                             f"{type(cause).__name__}: {_first_line(cause)}") from cause

    def __repr__(self) -> str:
        return f"RayEngine(model={self.model_name!r}, workers={self.workers}, inner={self.inner!r})"


def _resources(opts: dict[str, Any]) -> dict[str, Any]:
    """The resources one actor asks for (from its ``ray.remote`` options)."""
    keys = ("num_cpus", "num_gpus", "memory", "resources")
    return {k: opts[k] for k in keys if k in opts}


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else repr(e)


__all__ = ["EngineWorker", "RayEngine", "split_rows"]
