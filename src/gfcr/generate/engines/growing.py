"""One growing decode batch for the hf engine: requests that depend on earlier results join the
running batch as soon as those results are in (continuous batching), instead of waiting for a
whole round of sequential ``generate`` calls.

:func:`decode_growing` decodes ``requests``; whenever every sample of a request has finished, it
calls ``follow(index, results)``, and the requests that returns are prefilled and merged into the
batch at the next step (their index continues the list). Rows leave the batch the step they
finish, new rows take their slots (at most ``max_batch`` rows decode together). The tree topology
uses it so that a root path's branches start the moment that path ends, while the other paths are
still decoding: its rounds overlap instead of running one after another.

Each row samples exactly as :meth:`gfcr.generate.engines.hf.HFEngine.generate` does (the same
per-sample seeded generator, temperature / top-p log-probs, stop ids and strings, the repetition
early exit), so a request's samples follow the same distribution; tokens can differ from a separate
``generate`` call in rare near-ties, because batched float arithmetic with other padding is not
bit-identical (greedy decoding of the test model agrees exactly).

Merging: a new group of rows is prefilled on its own (left-padded), then both KV caches are
left-padded to one length and concatenated along the batch; the attention mask keeps the padding
out, and each row keeps its own position ids. Columns that have become padding for every row are
trimmed. This needs a plain ``DynamicCache`` of ``DynamicLayer`` s (keys/values ``[B, H, T, D]``,
the Llama family); :class:`GrowingUnsupported` is raised otherwise and callers fall back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult, SamplingParams


class GrowingUnsupported(RuntimeError):
    """The model's KV cache cannot be merged row-wise (not a plain DynamicCache)."""


@dataclass
class _Row:
    req: int
    si: int
    prompt: list[int]
    sp: SamplingParams
    gen: Any
    stop_ids: set[int]
    rep: Any
    t0: float = field(default_factory=time.perf_counter)
    toks: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    ents: list[float] = field(default_factory=list)
    finish: str | None = None
    exit: str | None = None


def _layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if not layers or any(type(ly).__name__ != "DynamicLayer" or getattr(ly, "keys", None) is None for ly in layers):
        raise GrowingUnsupported(f"cannot merge a {type(cache).__name__} row-wise")
    return layers


def _pad_left(x: Any, n: int, dim: int) -> Any:
    import torch

    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)


def merge_caches(a: Any, attn_a: Any, b: Any, attn_b: Any) -> tuple[Any, Any]:
    """Rows of cache ``b`` appended to cache ``a`` (in place), both left-padded to one length.

    Args:
        a, b: DynamicCaches with keys/values ``[Ba, H, Ta, D]`` and ``[Bb, H, Tb, D]``.
        attn_a, attn_b: attention masks ``[Ba, Ta]``, ``[Bb, Tb]`` (0 = padding).
    Returns:
        ``(a, attn)`` with ``attn`` ``[Ba + Bb, max(Ta, Tb)]``.
    """
    import torch

    la, lb = _layers(a), _layers(b)
    ta, tb = attn_a.shape[1], attn_b.shape[1]
    t = max(ta, tb)
    for x, y in zip(la, lb, strict=True):
        x.keys = torch.cat([_pad_left(x.keys, t - ta, 2), _pad_left(y.keys, t - tb, 2)], dim=0)
        x.values = torch.cat([_pad_left(x.values, t - ta, 2), _pad_left(y.values, t - tb, 2)], dim=0)
    attn = torch.cat([_pad_left(attn_a, t - ta, 1), _pad_left(attn_b, t - tb, 1)], dim=0)
    return a, attn


def trim_left(cache: Any, attn: Any) -> Any:
    """Drop leading columns that are padding for every row (cache and mask); returns the mask."""
    nz = attn.any(dim=0).nonzero()
    k = int(nz[0]) if len(nz) else 0
    if k > 0:
        for ly in _layers(cache):
            ly.keys, ly.values = ly.keys[:, :, k:], ly.values[:, :, k:]
        attn = attn[:, k:]
    return attn


def decode_growing(
    engine: Any,
    requests: Sequence[GenRequest],
    follow: Callable[[int, list[GenResult]], Sequence[GenRequest]] | None = None,
    max_batch: int | None = None,
) -> list[list[GenResult]]:
    """Decode ``requests`` and the requests ``follow`` adds, in one growing batch (module docstring).

    Returns ``params.n`` results per request, for the given requests then the added ones, in the
    order they were added.
    """
    import torch

    from gfcr.generate.engines.hf import NgramCounter, _cache_of

    mb = int(max_batch or engine.max_batch)
    reqs: list[GenRequest] = []
    out: list[list[GenResult | None]] = []
    left: list[int] = []
    queue: list[_Row] = []

    def submit(new: Sequence[GenRequest]) -> None:
        for req in new:
            ri = len(reqs)
            reqs.append(req)
            out.append([None] * req.params.n)
            left.append(req.params.n)
            pids = engine._prompt_ids(req)
            for si in range(req.params.n):
                g = torch.Generator(device="cpu")
                if req.params.seed is None:
                    g.seed()
                else:
                    g.manual_seed((int(req.params.seed) + si) % (2**63))
                queue.append(_Row(ri, si, pids, req.params, g, engine.eos_ids | set(req.params.stop_token_ids),
                                  NgramCounter(req.params.repeat_ngram)))

    submit(requests)
    dev = engine.device
    pad = int(engine.tokenizer.pad_token_id)
    live: list[_Row] = []
    cache = attn = pos = logits = None
    with torch.no_grad():
        while live or queue:
            if queue and len(live) < mb:  # admit waiting rows into free slots
                new, queue[:] = queue[: mb - len(live)], queue[mb - len(live) :]
                c2, a2, p2, lg2 = _prefill(engine, new, pad, dev)
                if cache is None:
                    cache, attn, pos, logits = c2, a2, p2, lg2
                else:
                    cache, attn = merge_caches(cache, attn, c2, a2)
                    pos, logits = torch.cat([pos, p2]), torch.cat([logits, lg2])
                live += new
            nxt = _sample_step(engine, live, logits)
            done = [r for r in live if r.finish is not None]
            for r in done:
                out[r.req][r.si] = _result(engine, r)
                left[r.req] -= 1
                if left[r.req] == 0 and follow is not None:
                    submit(follow(r.req, out[r.req]))  # type: ignore[arg-type]
            keep = [k for k, r in enumerate(live) if r.finish is None]
            if not keep:
                live, cache, attn, pos, logits = [], None, None, None, None
                continue
            if len(keep) < len(live):
                sel = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(sel)
                attn, pos, nxt = attn[sel], pos[sel], nxt[keep]
                live = [live[k] for k in keep]
                attn = trim_left(cache, attn)
            attn = torch.cat([attn, torch.ones((len(live), 1), dtype=attn.dtype, device=dev)], dim=1)
            pos = pos + 1
            o = engine.model(input_ids=nxt[:, None].to(dev), attention_mask=attn, position_ids=pos,
                             use_cache=True, **{engine._cache_kw: cache})
            cache = _cache_of(o)
            logits = o.logits[:, -1, :].float().cpu()
    return [[r for r in rs if r is not None] for rs in out]


def _prefill(engine: Any, rows: list[_Row], pad: int, dev: Any) -> tuple[Any, Any, Any, Any]:
    """Left-padded prefill of ``rows``: ``(cache, attn [b, L], last position [b, 1], logits [b, V])``."""
    import torch

    from gfcr.generate.engines.hf import _cache_of

    L = max(len(r.prompt) for r in rows)
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r.prompt):] = torch.tensor(r.prompt, dtype=torch.long)
        attn[i, L - len(r.prompt):] = 1
    ids, attn = ids.to(dev), attn.to(dev)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    o = engine.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **engine._prefill_kw)
    cache = _cache_of(o)
    _layers(cache)
    return cache, attn, pos[:, -1:], o.logits[:, -1, :].float().cpu()


def _sample_step(engine: Any, live: list[_Row], logits: Any) -> Any:
    """One token for every live row (the hf engine's rule); marks finished rows. Returns ids ``[B]``."""
    import torch

    from gfcr.generate.engines.hf import entropy_of, sampling_logprobs

    pad = int(engine.tokenizer.pad_token_id)
    nxt = torch.full((len(live),), pad, dtype=torch.long)
    uniform = len({(r.sp.temperature, r.sp.top_p) for r in live}) == 1
    if uniform:
        lp_all = sampling_logprobs(logits, live[0].sp.temperature, live[0].sp.top_p)
        probs_all = lp_all.exp()
        ent_all = entropy_of(lp_all, probs_all)
    for k, r in enumerate(live):
        sp = r.sp
        if uniform:
            lp, probs, ent = lp_all[k], probs_all[k], float(ent_all[k])
        else:
            lp = sampling_logprobs(logits[k : k + 1], sp.temperature, sp.top_p)[0]
            probs = lp.exp()
            ent = float(entropy_of(lp, probs))
        t = int(torch.argmax(lp)) if sp.temperature == 0 else int(torch.multinomial(probs, 1, generator=r.gen))
        nxt[k] = t
        r.toks.append(t)
        r.lps.append(float(lp[t]))
        r.ents.append(ent)
        if t in r.stop_ids:
            r.finish = "stop"
        elif sp.stop and engine._hit_stop(r.toks, sp.stop):
            r.finish = "stop"
        elif len(r.toks) >= sp.max_tokens:
            r.finish = "length"
        elif sp.repeat_ngram and r.rep.add(t) >= sp.repeat_max:
            r.finish, r.exit = "abort", "repetition"
    return nxt


def _result(engine: Any, r: _Row) -> GenResult:
    lp = np.asarray(r.lps, dtype=np.float32)
    lp = np.where(np.isfinite(lp), lp, np.float32(-1e4)).astype(np.float32)
    return GenResult(
        token_ids=np.asarray(r.toks, dtype=np.int32),
        logprobs=np.minimum(lp, 0.0).astype(np.float32),
        finish_reason=r.finish or "length",
        latency_s=time.perf_counter() - r.t0,
        prompt_ids=np.asarray(r.prompt, dtype=np.int32),
        text=engine.tokenizer.decode(r.toks, skip_special_tokens=False),
        meta={"growing_batch": True} | ({"early_exit": r.exit} if r.exit else {}),
        entropies=np.asarray(r.ents, dtype=np.float32),
    )
