"""The hf engine's decode state, shared by its batched decode loop (:mod:`~gfcr.generate.engines.hf`)
and the growing-batch decode of trees (:mod:`~gfcr.generate.engines.growing`): per-row tokens, log-probs,
penalties' counts, finish reasons and seeded streams (:class:`DecodeState`), and the KV cache of a
model output (:func:`cache_of`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult, SamplingParams
from gfcr.generate.engines.hf_sampling import (
    NOISE_BLOCK,
    NgramCounter,
    entropy_of,
    inverse_cdf_sample,
    penalized_logits,
    repetition_penalized,
    row_generator,
    sampling_logprobs,
)

Row = tuple[int, int, list[int], SamplingParams, GenRequest]  # (request, sample, prompt ids, params, request)


def _exit_meta(why: str | None) -> dict[str, Any]:
    if why == "cancelled":
        return {"cancelled": True}
    return {"early_exit": why} if why else {}


class DecodeState:
    """Per-row state of one decode batch (tokens, log-probs, penalties' counts, finish reasons, each
    row's seeded stream of uniform numbers) and the batch's sampling step (:meth:`step`)."""

    def __init__(self, rows: list[Row], eos_ids: set[int], vocab: int, config: Any):
        import torch

        B = len(rows)
        self.rows = rows
        self.stop_ids = [(set() if sp.ignore_eos else eos_ids) | set(sp.stop_token_ids) for _, _, _, sp, _ in rows]
        self.toks: list[list[int]] = [[] for _ in range(B)]
        self.lps: list[list[float]] = [[] for _ in range(B)]
        self.ents: list[list[float]] = [[] for _ in range(B)]
        self.tops: list[list[tuple[Any, Any]]] = [[] for _ in range(B)]
        self.repeats = [NgramCounter(sp.repeat_ngram) for _, _, _, sp, _ in rows]  # early exit on repetition
        self.exits: list[str | None] = [None] * B
        self.finish: list[str | None] = [None] * B
        self.gens = [row_generator(sp.seed, si) for _, si, _, sp, _ in rows]  # one stream of uniforms per row
        self.noise = torch.zeros((B, 0))  # [B, drawn so far]; see uniforms()
        V = int(getattr(config, "vocab_size", 0) or vocab)
        self.V = V
        penal = any(sp.frequency_penalty or sp.presence_penalty for _, _, _, sp, _ in rows)
        self.counts = torch.zeros((B, V)) if penal else None
        self.freq = torch.tensor([sp.frequency_penalty for _, _, _, sp, _ in rows], dtype=torch.float32)
        self.pres = torch.tensor([sp.presence_penalty for _, _, _, sp, _ in rows], dtype=torch.float32)
        self.bias = None
        if any(sp.logit_bias for _, _, _, sp, _ in rows):
            self.bias = torch.zeros((B, V))
            for i, (_, _, _, sp, _) in enumerate(rows):
                for tid, b in sp.logit_bias.items():
                    if not 0 <= int(tid) < V:
                        raise ValueError(f"logit_bias token id {tid} is outside the vocabulary [0, {V})")
                    self.bias[i, int(tid)] = float(b)
        self.seen = None  # [B, V] tokens of the prompt and of the sample so far (repetition penalty)
        if any(sp.repetition_penalty != 1.0 for _, _, _, sp, _ in rows):
            self.seen = torch.zeros((B, V), dtype=torch.bool)
            for i, (_, _, p, _, _) in enumerate(rows):
                self.seen[i, torch.tensor([t for t in p if 0 <= t < V], dtype=torch.long)] = True
        self.rep = torch.tensor([sp.repetition_penalty for _, _, _, sp, _ in rows], dtype=torch.float32)
        # rows that must not end before min_tokens: the ids they may not sample until then
        self.no_stop = {i: sorted(eos_ids | set(sp.stop_token_ids)) for i, (_, _, _, sp, _) in enumerate(rows)
                        if sp.min_tokens > 0}

    def uniforms(self, live: list[int]) -> Any:
        """Each live row's uniform number for its next token: float ``[len(live)]``. Row ``i``'s ``t``-th
        token uses the ``t``-th number of its own generator's stream (drawn :data:`NOISE_BLOCK` at a time),
        so the numbers never depend on the other rows."""
        import torch

        pos = [len(self.toks[i]) for i in live]
        while max(pos, default=0) >= self.noise.shape[1]:
            block = torch.stack([torch.rand(NOISE_BLOCK, generator=g) for g in self.gens])
            self.noise = torch.cat([self.noise, block], dim=1)
        return self.noise[torch.tensor(live, dtype=torch.long), torch.tensor(pos, dtype=torch.long)]

    def step(self, logits: Any, live: list[int]) -> tuple[list[int], list[float], list[float], list[Any]]:
        """Sample the next token of every live row from ``logits`` ``[len(live), V]``, all rows at once.

        Returns per live row: the token, its log-prob under the distribution sampled from, that
        distribution's entropy, and (top ids, top log-probs) when the row asks for top log-probs, else
        None. Penalties and logit bias are applied to all rows together; rows sharing (temperature,
        top_p, top_k) get their log-probs and their tokens in one call (greedy rows: the arg-max).
        """
        import torch

        sel = torch.tensor(live, dtype=torch.long)
        V = logits.shape[-1]
        if self.seen is not None:  # vLLM's order: logit bias, repetition penalty, then OpenAI's penalties
            if self.bias is not None:
                logits = logits.float() + self.bias[sel][:, :V]
            logits = repetition_penalized(logits, self.seen[sel][:, :V], self.rep[sel])
            if self.counts is not None:
                logits = penalized_logits(logits, self.counts[sel][:, :V], self.freq[sel], self.pres[sel])
        elif self.counts is not None:
            bias = self.bias[sel][:, :V] if self.bias is not None else None
            logits = penalized_logits(logits, self.counts[sel][:, :V], self.freq[sel], self.pres[sel], bias)
        elif self.bias is not None:  # logit bias alone: no [B, V] of zero counts to subtract
            logits = logits.float() + self.bias[sel][:, :V]
        early = [(k, self.no_stop[i]) for k, i in enumerate(live)
                 if i in self.no_stop and len(self.toks[i]) < self.rows[i][3].min_tokens]
        if early:  # vLLM's MinTokensLogitsProcessor: no stop token before min_tokens
            logits = logits.float().clone()
            for k, ids in early:
                logits[k, torch.tensor([t for t in ids if t < V], dtype=torch.long)] = float("-inf")
        groups: dict[tuple[float, float, int, float], list[int]] = {}
        for k, i in enumerate(live):
            sp = self.rows[i][3]
            groups.setdefault((sp.temperature, sp.top_p, sp.top_k, sp.min_p), []).append(k)
        u = self.uniforms(live) if any(key[0] > 0 for key in groups) else None
        n = len(live)
        tok, chosen, ent = torch.zeros(n, dtype=torch.long), torch.zeros(n), torch.zeros(n)
        tops: list[Any] = [None] * n
        for (temp, top_p, top_k, min_p), ks in groups.items():
            whole = len(ks) == n
            lp = sampling_logprobs(logits if whole else logits[ks], temp, top_p, top_k, min_p)
            probs = lp.exp()
            t = lp.argmax(-1) if temp == 0 else inverse_cdf_sample(probs, u if whole else u[ks])
            idx = slice(None) if whole else torch.tensor(ks, dtype=torch.long)
            tok[idx], chosen[idx], ent[idx] = t, lp.gather(-1, t[:, None])[:, 0], entropy_of(lp, probs)
            n_top = max(self.rows[live[k]][3].top_logprobs for k in ks)
            if n_top:
                top = torch.topk(lp, min(n_top, lp.shape[-1]), dim=-1)
                for j, k in enumerate(ks):
                    m = self.rows[live[k]][3].top_logprobs
                    tops[k] = (top.indices[j, :m], top.values[j, :m]) if m else None
        return tok.tolist(), chosen.tolist(), ent.tolist(), tops

    def result(self, i: int, prompt: list[int], dt: float, batch: int, tokenizer: Any) -> GenResult:
        lp_arr = np.asarray(self.lps[i], dtype=np.float32)
        lp_arr = np.where(np.isfinite(lp_arr), lp_arr, np.float32(-1e4)).astype(np.float32)
        n_top = self.rows[i][3].top_logprobs
        top_ids = top_lps = None
        if n_top:
            T = len(self.toks[i])
            top_ids = np.zeros((T, n_top), np.int32)
            top_lps = np.full((T, n_top), -9999.0, np.float32)
            for t, (ti, tv) in enumerate(self.tops[i]):
                top_ids[t, : len(ti)] = ti.numpy()
                top_lps[t, : len(tv)] = np.maximum(tv.numpy(), -9999.0)
        return GenResult(
            token_ids=np.asarray(self.toks[i], dtype=np.int32),
            logprobs=np.minimum(lp_arr, 0.0).astype(np.float32),
            finish_reason=self.finish[i] or "length",
            latency_s=dt,
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            text=tokenizer.decode(self.toks[i], skip_special_tokens=False),
            meta={"batch_size": batch} | _exit_meta(self.exits[i]),
            entropies=np.asarray(self.ents[i], dtype=np.float32),
            top_ids=top_ids,
            top_logprobs=top_lps,
        )


def cache_of(out: Any) -> Any:
    """The KV cache of a model output (``cache`` in transformers >= 5.2x, ``past_key_values`` before)."""
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values
