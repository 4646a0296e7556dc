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
per-sample seeded stream of uniforms, and the engine's own per-row decode state and sampling step: penalties,
logit bias, top-k/top-p, stop rules, early exit, top log-probs, token hooks, cancellation), so a
request's samples follow the same distribution; tokens can differ from a separate
``generate`` call in rare near-ties, because batched float arithmetic with other padding is not
bit-identical (greedy decoding of the test model agrees exactly).

Prefix reuse: when a row finishes, the KV cache of its tokens is kept (the most recent
``prefix_rows`` rows). A new request whose prompt continues such a row's tokens (a tree branch is
its parent's tokens up to the fork) takes that cache instead of prefilling its prompt: only its
last prompt token is run. Without it, re-prefilling each branch's prefix cost more CPU than the
tree saved by sampling fewer tokens.

Merging: a new group of rows is prefilled on its own (left-padded), then both KV caches are
left-padded to one length and concatenated along the batch; the attention mask keeps the padding
out, and each row keeps its own position ids. Columns that have become padding for every row are
trimmed. This needs a plain ``DynamicCache`` of ``DynamicLayer`` s (keys/values ``[B, H, T, D]``,
the Llama family); :class:`GrowingUnsupported` is raised otherwise and callers fall back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult


class GrowingUnsupported(RuntimeError):
    """The model's KV cache cannot be merged row-wise (not a plain DynamicCache)."""


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
    prefix_rows: int = 256,
) -> list[list[GenResult]]:
    """Decode ``requests`` and the requests ``follow`` adds, in one growing batch (module docstring).

    Long because: one decode loop whose state (the KV cache, the live rows, the queue of rows waiting to be
    admitted) is shared by admission, sampling and retirement at every step.

    Returns ``params.n`` results per request, for the given requests then the added ones, in the
    order they were added. Each admitted group of rows keeps the engine's own per-row decode state
    (``DecodeState``: penalties, logit bias, top log-probs, stop rules, seeded uniforms) and is sampled
    by its ``step`` and recorded by the engine's own ``_take``.
    """
    import torch

    from gfcr.generate.engines.decode import DecodeState, cache_of

    mb = int(max_batch or engine.max_batch)
    reqs: list[GenRequest] = []
    out: list[list[GenResult | None]] = []
    left: list[int] = []
    queue: list[tuple[Any, ...]] = []  # engine rows: (request, sample, prompt ids, params, request object)

    def submit(new: Sequence[GenRequest]) -> None:
        for req in new:
            ri = len(reqs)
            reqs.append(req)
            out.append([None] * req.params.n)
            left.append(req.params.n)
            pids = engine._prompt_ids(req)
            queue.extend((ri, si, pids, req.params, req) for si in range(req.params.n))

    submit(requests)
    dev = engine.device
    pad = int(engine.tokenizer.pad_token_id)
    live: list[tuple[Any, int, float]] = []  # (decode state, row in it, admitted at)
    saved = _Prefixes(prefix_rows)
    cache = attn = pos = logits = None
    with torch.no_grad():
        while live or queue:
            if queue and len(live) < mb:  # admit waiting rows into free slots
                rows, queue[:] = queue[: mb - len(live)], queue[mb - len(live) :]
                hits = [saved.find(r[2]) for r in rows]
                fresh = [r for r, h in zip(rows, hits, strict=True) if h is None]
                cont = [(r, h) for r, h in zip(rows, hits, strict=True) if h is not None]
                for prows, made in ((fresh, lambda fresh=fresh: _prefill(engine, fresh, pad, dev)),
                                    ([r for r, _ in cont], lambda cont=cont: _extend(engine, cont, pad, dev))):
                    if not prows:
                        continue
                    c2, a2, p2, lg2 = made()
                    st = DecodeState(prows, engine.eos_ids, len(engine.tokenizer), engine.model.config)
                    if cache is None:
                        cache, attn, pos, logits = c2, a2, p2, lg2
                    else:
                        cache, attn = merge_caches(cache, attn, c2, a2)
                        pos, logits = torch.cat([pos, p2]), torch.cat([logits, lg2])
                    now = time.perf_counter()
                    live += [(st, i, now) for i in range(len(prows))]
            nxt = _sample_step(engine, live, logits, pad)
            keep = []
            for k, (st, i, t0) in enumerate(live):
                if st.finish[i] is None:
                    keep.append(k)
                    continue
                ri, si, p = st.rows[i][0], st.rows[i][1], st.rows[i][2]
                if prefix_rows > 0:  # its cache covers prompt + all generated tokens but the last
                    saved.add(list(p) + st.toks[i][:-1], cache, k, attn[k])
                out[ri][si] = st.result(i, p, time.perf_counter() - t0, len(st.rows), engine.tokenizer)
                left[ri] -= 1
                if left[ri] == 0 and follow is not None:
                    submit(follow(ri, out[ri]))  # type: ignore[arg-type]
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
            cache = cache_of(o)
            logits = o.logits[:, -1, :].float().cpu()
    return [[r for r in rs if r is not None] for rs in out]


class _Prefixes:
    """KV caches of finished rows, keyed by the tokens they cover (the ``size`` most recent)."""

    def __init__(self, size: int):
        self.size = size
        self.items: list[tuple[np.ndarray, list[tuple[Any, Any]]]] = []

    def add(self, tokens: list[int], cache: Any, row: int, mask: Any) -> None:
        keep = mask.bool()
        kv = [(ly.keys[row][:, keep].clone(), ly.values[row][:, keep].clone()) for ly in _layers(cache)]
        self.items.append((np.asarray(tokens, dtype=np.int64), kv))
        if len(self.items) > self.size:
            self.items.pop(0)

    def find(self, prompt: list[int]) -> tuple[list[tuple[Any, Any]], int] | None:
        """A cache covering ``prompt[:-1]`` and its length, or None."""
        q = len(prompt) - 1
        if q < 1 or not self.items:
            return None
        head = np.asarray(prompt[:q], dtype=np.int64)
        for toks, kv in reversed(self.items):
            if len(toks) >= q and np.array_equal(toks[:q], head):
                return kv, q
        return None


def _extend(engine: Any, part: list[tuple[tuple[Any, ...], Any]], pad: int, dev: Any) -> tuple[Any, Any, Any, Any]:
    """Rows whose prompt but its last token is cached: build their cache from the kept slices
    (left-padded), run the last prompt token. Same return as :func:`_prefill`."""
    import torch
    from transformers import DynamicCache

    from gfcr.generate.engines.decode import cache_of

    L = max(q for _, (_, q) in part)
    n_layers = len(part[0][1][0])
    cache = DynamicCache()
    for li in range(n_layers):
        ks = [_pad_left(kv[li][0][:, :q], L - q, 1) for _, (kv, q) in part]
        vs = [_pad_left(kv[li][1][:, :q], L - q, 1) for _, (kv, q) in part]
        cache.update(torch.stack(ks).to(dev), torch.stack(vs).to(dev), li)
    attn = torch.zeros((len(part), L + 1), dtype=torch.long, device=dev)
    for b, (_, (_, q)) in enumerate(part):
        attn[b, L - q:] = 1
    last = torch.tensor([[r[2][-1]] for r, _ in part], dtype=torch.long, device=dev)
    pos = torch.tensor([[q] for _, (_, q) in part], dtype=torch.long, device=dev)
    o = engine.model(input_ids=last, attention_mask=attn, position_ids=pos, use_cache=True, **{engine._cache_kw: cache})
    cache = cache_of(o)
    _layers(cache)
    return cache, attn, pos, o.logits[:, -1, :].float().cpu()


def _prefill(engine: Any, rows: list[tuple[Any, ...]], pad: int, dev: Any) -> tuple[Any, Any, Any, Any]:
    """Left-padded prefill of ``rows``: ``(cache, attn [b, L], last position [b, 1], logits [b, V])``."""
    import torch

    from gfcr.generate.engines.decode import cache_of

    L = max(len(r[2]) for r in rows)
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r[2]):] = torch.tensor(r[2], dtype=torch.long)
        attn[i, L - len(r[2]):] = 1
    ids, attn = ids.to(dev), attn.to(dev)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    o = engine.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **engine._prefill_kw)
    cache = cache_of(o)
    _layers(cache)
    return cache, attn, pos[:, -1:], o.logits[:, -1, :].float().cpu()


def _sample_step(engine: Any, live: list[tuple[Any, int, float]], logits: Any, pad: int) -> Any:
    """One token for every live row, by the engine's rule (its ``DecodeState.step`` per admitted
    group, then ``_take``); marks finished rows. Returns ids ``[B]``."""
    import torch

    nxt = torch.full((len(live),), pad, dtype=torch.long)
    groups: dict[int, list[int]] = {}
    for k, (st, _, _) in enumerate(live):
        groups.setdefault(id(st), []).append(k)
    for ks in groups.values():
        st = live[ks[0]][0]
        idx = [live[k][1] for k in ks]
        toks, lps, ents, tops = st.step(logits[ks] if len(ks) < len(live) else logits, idx)
        for j, (k, i) in enumerate(zip(ks, idx, strict=True)):
            if st.rows[i][4].cancelled:  # the client went away: stop spending compute on it
                st.finish[i], st.exits[i] = "abort", "cancelled"
                continue
            nxt[k] = engine._take(st, i, toks[j], lps[j], ents[j], tops[j])
    return nxt
