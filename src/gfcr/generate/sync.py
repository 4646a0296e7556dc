"""Weight sync: put the trainer's new weights into the engine that samples the next rollouts.

RL trains one copy of the policy and samples with another whenever the sampler is not the training
module itself (a vLLM engine, a bf16 inference copy, a server on another process or machine). After
each update (or every ``every`` updates) the trainer pushes its weights and the engine's
``policy_version`` becomes the trainer's, so every stored rollout names the weights that sampled it.

=============  ===========================================================================================
``in_place``   :class:`InPlaceSync`: the ``hf`` engine samples with the training module itself; nothing
               moves, only the version string changes.
``copy``       :class:`StateDictSync`: an in-process engine with its own weights (``hf`` copy in another
               dtype, ``vllm`` colocated) loads the trainer's state dict via ``engine.load_weights``.
``http``       :class:`HTTPSync`: a ``gfcr serve --allow-weight-updates`` server, in another process or on
               another machine with a shared filesystem: the trainer writes one safetensors file and asks the
               server to load it (``POST /gfcr/weights``); the server swaps weights between requests.
``vllm_reload`` :class:`VLLMReloadSync`: vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``
               started with ``VLLM_SERVER_DEV_MODE=1``): the trainer saves an HF checkpoint folder and asks
               the server to reload it in place (``POST /collective_rpc`` ``reload_weights``), then
               resets its prefix cache (``POST /reset_prefix_cache``).
=============  ===========================================================================================

Loading is all-or-nothing: names and shapes are checked against the engine's model before a single
tensor is copied (:func:`check_state_dict`), so a bad file leaves the engine serving the old weights.
Files are safetensors only; nothing is unpickled.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SYNC_METHODS = ("in_place", "copy", "http", "vllm_reload")

#: The route of ``gfcr serve`` that loads new weights (enabled by ``--allow-weight-updates``).
WEIGHTS_ROUTE = "/gfcr/weights"


class WeightSyncError(RuntimeError):
    """Weights could not be moved into the engine; the engine keeps its previous weights."""


def post_checked(url: str, not_found_hint: str, timeout_s: float, **kw: Any) -> Any:
    """``httpx.post(url, **kw)`` for a weight-sync route: a transport error, a 404 (with
    ``not_found_hint``: how to start a server that has the route) or any other non-200 answer is a
    :class:`WeightSyncError` naming the URL; returns the response."""
    import httpx

    try:
        resp = httpx.post(url, timeout=timeout_s, **kw)
    except httpx.TransportError as e:
        raise WeightSyncError(f"POST {url} failed: {type(e).__name__}: {e}") from e
    if resp.status_code == 404:
        raise WeightSyncError(f"{url} not found: {not_found_hint}")
    if resp.status_code != 200:
        raise WeightSyncError(f"POST {url} -> HTTP {resp.status_code}: {resp.text[:500]}")
    return resp


@dataclass
class SyncReport:
    """What one push did: the version now served, bytes moved, wall seconds."""

    policy_version: str
    bytes: int
    seconds: float
    method: str


class WeightSync(Protocol):
    """Moves a trainer's weights into a sampling engine."""

    method: str

    def push(self, model: Any, policy_version: str) -> SyncReport: ...


# ---------------------------------------------------------------------------------------------
# Checking and loading state dicts (used by the engines and by gfcr serve)
# ---------------------------------------------------------------------------------------------


def _tied_groups(model: Any) -> dict[str, set[str]]:
    """For each state-dict name, the names sharing its storage (tied embeddings share one tensor)."""
    by_ptr: dict[tuple[int, tuple[int, ...]], set[str]] = {}
    sd = model.state_dict(keep_vars=True)
    for name, t in sd.items():
        by_ptr.setdefault((t.data_ptr(), tuple(t.shape)), set()).add(name)
    return {name: group for group in by_ptr.values() for name in group}


def check_state_dict(model: Any, state_dict: dict[str, Any]) -> list[str]:
    """Check ``state_dict`` can replace ``model``'s weights; return the names it omits because they are
    tied to a name it has (e.g. ``lm_head.weight`` tied to the input embedding, which safetensors files
    store once). Raises :class:`WeightSyncError` naming every unexpected, missing or mis-shaped tensor."""
    own = model.state_dict()
    unexpected = sorted(set(state_dict) - set(own))
    bad_shape = [f"{k}: got {tuple(v.shape)}, model has {tuple(own[k].shape)}"
                 for k, v in state_dict.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    tied = _tied_groups(model)
    missing, omitted = [], []
    for k in own:
        if k in state_dict:
            continue
        if any(o in state_dict for o in tied.get(k, ())):
            omitted.append(k)
        else:
            missing.append(k)
    problems = []
    if unexpected:
        problems.append(f"unexpected tensors {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    if missing:
        problems.append(f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if bad_shape:
        problems.append(f"wrong shapes {bad_shape[:3]}{' ...' if len(bad_shape) > 3 else ''}")
    if problems:
        raise WeightSyncError("these weights do not fit the engine's model (nothing was loaded): " + "; ".join(problems))
    return omitted


def state_dict_bytes(state_dict: dict[str, Any]) -> int:
    """Bytes held by the tensors of a state dict."""
    return int(sum(v.numel() * v.element_size() for v in state_dict.values()))


def load_state_dict_checked(model: Any, state_dict: dict[str, Any]) -> int:
    """Copy ``state_dict`` into ``model`` (casting to each parameter's dtype and device) after
    :func:`check_state_dict`; returns the bytes read. All or nothing."""
    import torch

    check_state_dict(model, state_dict)
    with torch.no_grad():
        model.load_state_dict(state_dict, strict=False)
    return state_dict_bytes(state_dict)


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Tensors of a ``.safetensors`` file, or of every ``*.safetensors`` file of a directory (an HF
    checkpoint folder, sharded or not). Only safetensors are read: nothing is unpickled."""
    from safetensors.torch import load_file

    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise WeightSyncError(f"{p} holds no *.safetensors file")
    elif p.is_file() and p.suffix == ".safetensors":
        files = [p]
    elif p.exists():
        raise WeightSyncError(f"{p} is not a .safetensors file or a folder of them (pickled weights are never loaded)")
    else:
        raise WeightSyncError(f"{p} does not exist (the server must see the path the trainer wrote: same machine or "
                              "a shared filesystem)")
    sd: dict[str, Any] = {}
    for f in files:
        try:
            part = load_file(str(f))
        except Exception as e:  # noqa: BLE001 - a corrupt/truncated file
            raise WeightSyncError(f"{f} is not a readable safetensors file: {e}") from e
        dup = set(sd) & set(part)
        if dup:
            raise WeightSyncError(f"tensors {sorted(dup)[:3]} appear in more than one file of {p}")
        sd.update(part)
    return sd


#: (input embedding, output head) names of the HF causal LMs whose head can be tied to the embedding
#: (Llama, Qwen2, Mistral, SmolLM2: ``tie_word_embeddings``)
TIED_HEAD = ("model.embed_tokens.weight", "lm_head.weight")


def with_tied_head(state_dict: dict[str, Any], tied: bool) -> dict[str, Any]:
    """``state_dict`` with the output head named explicitly when the model ties it to the input
    embedding and the dict stores the tensor once (as safetensors files of tied models do).

    Why: vLLM's CPU backend packs each layer's weight into its own GEMM tensor at load
    (``vllm/model_executor/layers/utils.py``, ``dispatch_cpu_unquantized_gemm``, called by the
    embedding method's ``process_weights_after_loading``), the tied ``lm_head`` included. An in-place
    reload (``reload/layerwise.py``) re-processes only layers whose weights it reads; a tied head that
    is not named is put back as it was ("ParallelLMHead: Failed to load weights"), so the model
    samples with the new embedding and the OLD head. Naming ``lm_head.weight`` reloads and re-packs it.

    >>> sorted(with_tied_head({"model.embed_tokens.weight": 1}, tied=True))
    ['lm_head.weight', 'model.embed_tokens.weight']
    >>> sorted(with_tied_head({"model.embed_tokens.weight": 1}, tied=False))
    ['model.embed_tokens.weight']
    """
    emb, head = TIED_HEAD
    if tied and emb in state_dict and head not in state_dict:
        return dict(state_dict) | {head: state_dict[emb]}
    return state_dict


def write_tied_head(model: Any, folder: Path) -> int:
    """After ``save_pretrained(folder)`` of a tied model: write its head as ``lm_head.safetensors`` (and
    into the shard index, if any) so a loader reading the folder reloads the head too
    (:func:`with_tied_head` says why). Returns the bytes written (0 for an untied model)."""
    import json

    from safetensors.torch import save_file

    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return 0
    emb = model.get_input_embeddings().weight.detach().contiguous().clone()
    f = folder / "lm_head.safetensors"
    save_file({TIED_HEAD[1]: emb}, str(f))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data.setdefault("weight_map", {})[TIED_HEAD[1]] = f.name
        index.write_text(json.dumps(data, indent=2))
    return f.stat().st_size


def write_safetensors(model: Any, path: str | os.PathLike[str]) -> int:
    """Write ``model``'s weights to ``path`` atomically (temp file, then rename; tied tensors once).
    Returns the file size in bytes."""
    from safetensors.torch import save_model

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    save_model(model, str(tmp))
    os.replace(tmp, p)
    return p.stat().st_size


# ---------------------------------------------------------------------------------------------
# The three syncs
# ---------------------------------------------------------------------------------------------


class InPlaceSync:
    """The engine samples with the training module itself (``hf`` on the policy): only the version moves."""

    method = "in_place"

    def __init__(self, engine: Any):
        self.engine = engine

    def push(self, model: Any, policy_version: str) -> SyncReport:
        if getattr(self.engine, "model", None) is not model:
            raise WeightSyncError("in_place sync needs an engine built on the training module itself")
        self.engine.set_policy_version(policy_version)
        return SyncReport(policy_version, 0, 0.0, self.method)


class StateDictSync:
    """An in-process engine with its own weights loads the trainer's state dict (``engine.load_weights``)."""

    method = "copy"

    def __init__(self, engine: Any):
        if not hasattr(engine, "load_weights"):
            raise WeightSyncError(f"engine {getattr(engine, 'name', engine)!r} cannot load weights in process")
        self.engine = engine

    def push(self, model: Any, policy_version: str) -> SyncReport:
        t0 = time.perf_counter()
        sd = model.state_dict()
        n = state_dict_bytes(sd)
        self.engine.load_weights(sd, policy_version=policy_version)
        return SyncReport(policy_version, n, time.perf_counter() - t0, self.method)


class HTTPSync:
    """Push to ``gfcr serve --allow-weight-updates`` at ``base_url`` through a safetensors file in ``folder``.

    The file is rewritten on each push (temp file + rename), so a crash never leaves a half file that
    the server could load. ``folder`` must be visible to the server under the same path.
    """

    method = "http"

    def __init__(self, engine: Any, folder: str | os.PathLike[str], admin_token: str | None = None,
                 timeout_s: float = 600.0):
        base = getattr(engine, "base_url", None)
        if not base:
            raise WeightSyncError("http sync needs the openai engine (with base_url) of a gfcr serve server")
        self.engine = engine
        self.url = base.rstrip("/").removesuffix("/v1") + WEIGHTS_ROUTE
        self.folder = Path(folder)
        self.admin_token = admin_token
        self.timeout_s = timeout_s

    def push(self, model: Any, policy_version: str) -> SyncReport:

        t0 = time.perf_counter()
        path = (self.folder / "weights.safetensors").resolve()
        size = write_safetensors(model, path)
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        resp = post_checked(self.url, "start the server with `gfcr serve --allow-weight-updates`", self.timeout_s,
                            json={"path": str(path), "policy_version": policy_version}, headers=headers)
        served = resp.json().get("policy_version")
        if served != policy_version:
            raise WeightSyncError(f"the server reports policy_version {served!r} after loading {policy_version!r}")
        self.engine.set_policy_version(policy_version)
        return SyncReport(policy_version, size, time.perf_counter() - t0, self.method)


class VLLMReloadSync:
    """Push to a vLLM OpenAI server (dev mode) at the openai engine's ``base_url`` through a checkpoint folder.

    vLLM has no weight-file route of its own outside dev mode; with ``VLLM_SERVER_DEV_MODE=1`` its server
    exposes ``POST /collective_rpc`` (``vllm/entrypoints/serve/dev/rpc/api_router.py``: a worker method
    name plus string kwargs) and ``POST /reset_prefix_cache`` (``serve/dev/cache/api_router.py``). The
    worker method ``reload_weights(weights_path=...)`` (``vllm/v1/worker/gpu_worker.py``; the CPU worker
    inherits it) reloads every layer in place from the folder's safetensors
    (``vllm/model_executor/model_loader/reload/inplace.py``). The prefix cache is then reset, so no KV
    computed with the old weights is served. Each push writes a new folder ``push-<n>`` (HF
    ``save_pretrained``, plus a tied model's head in ``lm_head.safetensors``: :func:`write_tied_head`) and removes the previous one
    after the server has loaded the new one. Dev mode also opens other admin routes: loopback only.
    Departure from ``http``: vLLM does not report a policy version back; the engine's version is set
    once both calls answered 200.
    """

    method = "vllm_reload"

    def __init__(self, engine: Any, folder: str | os.PathLike[str], timeout_s: float = 600.0):
        base = getattr(engine, "base_url", None)
        if not base:
            raise WeightSyncError("vllm_reload sync needs the openai engine (with base_url) of a vLLM server")
        self.engine = engine
        self.root = base.rstrip("/").removesuffix("/v1")
        self.folder = Path(folder)
        self.timeout_s = timeout_s
        self._n = 0
        self._last: Path | None = None

    def _post(self, route: str, **kw: Any) -> Any:
        return post_checked(self.root + route, "start vLLM's server with VLLM_SERVER_DEV_MODE=1", self.timeout_s, **kw)

    def push(self, model: Any, policy_version: str) -> SyncReport:
        import shutil

        t0 = time.perf_counter()
        path = (self.folder / f"push-{self._n}").resolve()
        self._n += 1
        if path.exists():
            shutil.rmtree(path)
        model.save_pretrained(str(path), safe_serialization=True)
        write_tied_head(model, path)  # a tied head is reloaded only when named (vLLM's CPU backend repacks it)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        self._post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        ok = self._post("/reset_prefix_cache", params={"reset_running_requests": "true"}).json().get("success")
        if not ok:
            raise WeightSyncError(f"{self.root}/reset_prefix_cache answered success=false: KV of the old weights may remain")
        if self._last is not None and self._last != path:
            shutil.rmtree(self._last, ignore_errors=True)
        self._last = path
        self.engine.set_policy_version(policy_version)
        return SyncReport(policy_version, size, time.perf_counter() - t0, self.method)


def make_sync(method: str, engine: Any, folder: str | os.PathLike[str] | None = None,
              admin_token: str | None = None) -> WeightSync:
    """The sync ``method`` (``in_place``, ``copy``, ``http``) for ``engine``."""
    if method == "in_place":
        return InPlaceSync(engine)
    if method == "copy":
        return StateDictSync(engine)
    if method == "http":
        if folder is None:
            raise WeightSyncError("http sync needs a folder for the weights file")
        return HTTPSync(engine, folder, admin_token=admin_token)
    if method == "vllm_reload":
        if folder is None:
            raise WeightSyncError("vllm_reload sync needs a folder for the checkpoint")
        return VLLMReloadSync(engine, folder)
    raise WeightSyncError(f"unknown weight sync {method!r}; choose one of {list(SYNC_METHODS)}")
