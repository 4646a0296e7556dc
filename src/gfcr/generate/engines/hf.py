"""The ``hf`` engine: sampling with HF transformers on CPU or GPU, token-faithful.

It runs its own batched decode loop (left padding, KV cache) instead of ``model.generate`` so
that (1) the recorded log-prob of each token is that of the distribution it was actually drawn
from (temperature, then top-p, renormalised: :func:`sampling_logprobs`), (2) each sample has its
own seeded ``torch.Generator`` (sample ``i`` of a request with seed ``s`` uses ``s + i``), so the
same seed gives the same tokens, and (3) any token prefix can be continued (trees, multi-turn).

Greedy (temperature 0) records the log-prob under the unscaled model distribution (the point
mass actually sampled from would always give 0, which is useless for off-policy corrections).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult, TokenEvent
from gfcr.generate.engines.decode import DecodeState, Row, cache_of
from gfcr.generate.engines.hf_sampling import sampling_logprobs


def _report(req: GenRequest, ev: TokenEvent) -> None:
    """Hand ``ev`` to the request's ``on_token`` hook; a failing hook cancels only its own request."""
    try:
        req.on_token(ev)  # type: ignore[misc]
    except Exception:  # noqa: BLE001 - a client-side hook must never break the shared batch
        if req.cancel is not None:
            req.cancel.set()


@dataclass
class Scored:
    """Teacher-forced log-probs of one token sequence (:meth:`HFEngine.score_batch`).

    ``logprobs``: float32 ``[C]``, one per scored token; ``top_ids`` / ``top_logprobs``: int32 / float32
    ``[C, N]``, the N most likely tokens at each scored position (``None`` when N = 0).
    """

    logprobs: np.ndarray
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None


class HFEngine:
    """Batched sampling with a transformers causal LM (see module docstring).

    Args:
        model: an HF model directory/name (``None``/``"default"`` = the default model, see
            :func:`gfcr.models.resolve_model`) or an already-loaded ``PreTrainedModel`` (e.g. the
            policy being trained; its weights are used in place).
        tokenizer: a tokenizer or path; defaults to the model's directory.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:0"``... (a loaded model is moved there).
        max_batch: most sequences decoded together (rows beyond are run in further batches).
        policy_version: the version string recorded with rollouts; default = hash of the weights.
    """

    name = "hf"

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        device: str = "cpu",
        max_batch: int = 32,
        policy_version: str | None = None,
        dtype: str = "float32",
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from gfcr.models import resolve_model

        self.device = torch.device(device)
        self.max_batch = int(max_batch)
        if model is None or isinstance(model, str | Path):
            path = resolve_model(None if model is None else str(model))
            self.model_name = path
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
            tokenizer = tokenizer if tokenizer is not None else path
        else:
            self.model = model
            self.model_name = str(getattr(model, "name_or_path", "") or type(model).__name__)
            if tokenizer is None:
                tokenizer = getattr(model, "name_or_path", None)
                if not tokenizer:
                    raise ValueError("HFEngine(model_object) needs tokenizer= (the model has no name_or_path)")
        if isinstance(tokenizer, str | Path):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.to(self.device)
        self.model.eval()
        self.tokenizer.padding_side = "left"
        self.eos_ids = self._eos_ids()
        self._version = policy_version
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._prefill_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    # --- identity and weights ---------------------------------------------------------------
    @property
    def policy_version(self) -> str:
        if self._version is None:
            from gfcr.models import model_hash

            self._version = model_hash(self.model)
        return self._version

    def load_weights(self, weights: Any, policy_version: str | None = None) -> None:
        """Load new weights (a state dict or a model whose state dict to copy), cast to this engine's
        dtype; all or nothing (:func:`gfcr.generate.sync.check_state_dict`). ``policy_version``: the
        new version string (``None``: the weights hash, computed on next use)."""
        from gfcr.generate.sync import load_state_dict_checked

        sd = weights.state_dict() if hasattr(weights, "state_dict") else weights
        load_state_dict_checked(self.model, sd)
        self._version = policy_version

    def set_policy_version(self, version: str | None) -> None:
        """Set the version string (``None``: recompute the weights hash on next use)."""
        self._version = version

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), getattr(self.model, "config", None)):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(e, int):
                ids.add(e)
            elif isinstance(e, list | tuple):
                ids.update(int(x) for x in e)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id and im_end >= 0:
            ids.add(im_end)  # ChatML end of turn
        return ids

    # --- prompts ------------------------------------------------------------------------------
    def encode_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat-templated conversation (what the policy sees)."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _prompt_ids(self, req: GenRequest) -> list[int]:
        if req.prompt_ids is not None:
            return [int(t) for t in req.prompt_ids]
        return self.encode_messages(req.messages or [])

    # --- generation ---------------------------------------------------------------------------
    def generate(self, requests: list[GenRequest]) -> list[list[GenResult]]:
        """``params.n`` results per request, in order."""
        rows: list[Row] = []
        for ri, req in enumerate(requests):
            pids = self._prompt_ids(req)
            for si in range(req.params.n):
                rows.append((ri, si, pids, req.params, req))
        out: list[list[GenResult | None]] = [[None] * r.params.n for r in requests]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][2]))
        for b in range(0, len(order), self.max_batch):
            chunk = [rows[i] for i in order[b : b + self.max_batch]]
            for (ri, si, *_), res in zip(chunk, self._generate_batch(chunk), strict=True):
                out[ri][si] = res
        return [[r for r in rs if r is not None] for rs in out]

    def _generate_batch(self, rows: list[Row]) -> list[GenResult]:
        """Decode one batch of rows (left-padded prefill, then one token per live row per step).

        Long because the decode loop keeps its per-row state in local lists for speed; the per-step
        sampling is :meth:`DecodeState.step`, the per-token bookkeeping :meth:`_take`.
        """
        import torch

        t0 = time.perf_counter()
        B = len(rows)
        L = max(len(r[2]) for r in rows)
        pad = int(self.tokenizer.pad_token_id)
        ids = torch.full((B, L), pad, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, (_, _, p, _, _) in enumerate(rows):
            ids[i, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, L - len(p) :] = 1
        st = DecodeState(rows, self.eos_ids, len(self.tokenizer), self.model.config)
        max_new = [sp.max_tokens for _, _, _, sp, _ in rows]
        dev = self.device
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        live = list(range(B))  # original row of each row still in the batch (finished rows are dropped)
        for i in live:
            if rows[i][4].cancelled:
                st.finish[i] = "abort"
        with torch.no_grad():
            if all(f is not None for f in st.finish):
                max_new = [0]
            else:
                out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                                 **self._prefill_kw)
                past = cache_of(out)
                can_prune = hasattr(past, "batch_select_indices")
                logits = out.logits[:, -1, :].float().cpu()  # [len(live), V]
            for _step in range(max(max_new)):
                nxt = torch.full((len(live),), pad, dtype=torch.long)
                toks, lps, ents, tops = st.step(logits, live)
                for k, i in enumerate(live):
                    if st.finish[i] is not None:
                        continue
                    if rows[i][4].cancelled:  # the client went away: stop spending compute on it
                        st.finish[i] = "abort"
                        st.exits[i] = "cancelled"
                        continue
                    nxt[k] = self._take(st, i, toks[k], lps[k], ents[k], tops[k])
                keep = [k for k, i in enumerate(live) if st.finish[i] is None]
                if not keep:
                    break
                if can_prune and len(keep) < len(live):  # drop finished rows: no more compute spent on them
                    sel = torch.tensor(keep, dtype=torch.long, device=dev)
                    past.batch_select_indices(sel)
                    attn, pos, nxt = attn[sel], pos[sel], nxt[keep]
                    live = [live[k] for k in keep]
                attn = torch.cat([attn, torch.ones((len(live), 1), dtype=attn.dtype, device=dev)], dim=1)
                pos = pos[:, -1:] + 1
                out = self.model(
                    input_ids=nxt[:, None].to(dev), attention_mask=attn, position_ids=pos,
                    use_cache=True, **{self._cache_kw: past},
                )
                past = cache_of(out)
                logits = out.logits[:, -1, :].float().cpu()
        dt = time.perf_counter() - t0
        return [st.result(i, p, dt, B, self.tokenizer) for i, (_, _, p, _, _) in enumerate(rows)]

    def _take(self, st: DecodeState, i: int, t: int, lp: float, ent: float, top: Any) -> int:
        """Record row ``i``'s sampled token ``t`` (its log-prob ``lp``, the entropy ``ent`` of its
        distribution, its top-N or None), report it to the request's ``on_token`` and decide whether the
        row is finished."""
        _, si, _, sp, req = st.rows[i]
        st.toks[i].append(t)
        st.lps[i].append(lp)
        st.ents[i].append(ent)
        if st.counts is not None:
            st.counts[i, t] += 1
        if st.seen is not None and t < st.seen.shape[1]:
            st.seen[i, t] = True
        if top is not None:
            st.tops[i].append(top)
        if req.on_token is not None:
            _report(req, TokenEvent(si, t, max(lp, -9999.0),
                                    top[0].tolist() if top is not None else None,
                                    top[1].clamp(min=-9999.0).tolist() if top is not None else None))
        early = len(st.toks[i]) < sp.min_tokens  # vLLM: nothing but the length stops before min_tokens
        if not early and (t in st.stop_ids[i] or (sp.stop and self._hit_stop(st.toks[i], sp.stop))):
            st.finish[i] = "stop"
        elif len(st.toks[i]) >= sp.max_tokens:
            st.finish[i] = "length"
        elif sp.repeat_ngram and st.repeats[i].add(t) >= sp.repeat_max:
            st.finish[i] = "abort"
            st.exits[i] = "repetition"
        return t

    # --- scoring (teacher forcing) ------------------------------------------------------------
    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0,
              top_p: float = 1.0, top_k: int = 0) -> np.ndarray:
        """Log-prob of each token of ``completion_ids`` following ``prompt_ids`` under the current
        weights, in one teacher-forced forward pass: float32 ``[len(completion_ids)]``.

        ``temperature``/``top_p``/``top_k`` give the log-probs of that sampling distribution (as the
        engine records for sampled tokens; T = 1 and no cuts: the model's own log-probs, what on-policy
        distillation asks of a teacher; T = 0 also gives the model's own). Tokens cut by top-k/top-p get
        -9999. Penalties and logit bias depend on a sampling history and are not applied.
        Example: ``engine.score(prompt, rollout_tokens)`` equals the behaviour log-probs the engine
        recorded for a sample drawn at T = 1 from that prompt (to float rounding).
        """
        return self.score_batch([(prompt_ids, completion_ids)], temperature, top_p, top_k)[0].logprobs

    def score_batch(self, pairs: list[tuple[list[int], list[int]]], temperature: float = 1.0, top_p: float = 1.0,
                    top_k: int = 0, top_n: int = 0, max_logit_bytes: int = 2**30) -> list[Scored]:
        """:meth:`score` for many ``(prompt_ids, completion_ids)`` pairs, batched (left padding), with the
        ``top_n`` most likely tokens at each scored position. Batches are cut so that one forward's logits
        stay under ``max_logit_bytes`` (float32). Each prompt needs at least one token; a completion may be
        empty (then its ``logprobs`` is empty)."""
        import torch

        for p, _ in pairs:
            if len(p) == 0:
                raise ValueError("score needs at least one prompt token before the scored tokens")
        out: list[Scored | None] = [None] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        V = int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer))
        budget = max(1, max_logit_bytes // (4 * V))
        pad = int(self.tokenizer.pad_token_id)
        at = 0
        while at < len(order):
            chunk = [order[at]]
            L = len(pairs[order[at]][0]) + len(pairs[order[at]][1])
            while at + len(chunk) < len(order) and len(chunk) < self.max_batch:
                nxt = order[at + len(chunk)]
                L2 = len(pairs[nxt][0]) + len(pairs[nxt][1])
                if (len(chunk) + 1) * L2 > budget:
                    break
                chunk.append(nxt)
                L = L2
            at += len(chunk)
            ids = torch.full((len(chunk), L), pad, dtype=torch.long)
            attn = torch.zeros((len(chunk), L), dtype=torch.long)
            for b, i in enumerate(chunk):
                seq = [int(t) for t in pairs[i][0]] + [int(t) for t in pairs[i][1]]
                ids[b, L - len(seq):] = torch.tensor(seq, dtype=torch.long)
                attn[b, L - len(seq):] = 1
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                                    position_ids=pos.to(self.device)).logits.float().cpu()
            for b, i in enumerate(chunk):
                P, C = len(pairs[i][0]), len(pairs[i][1])
                o = L - P - C
                lp = sampling_logprobs(logits[b, o + P - 1 : o + P + C - 1], temperature, top_p, top_k)
                tgt = ids[b, o + P : o + P + C]
                got = lp.gather(-1, tgt[:, None])[:, 0].clamp(min=-9999.0).numpy().astype(np.float32)
                sc = Scored(got)
                if top_n:
                    top = torch.topk(lp, min(top_n, lp.shape[-1]), dim=-1)
                    sc.top_ids = top.indices.numpy().astype(np.int32)
                    sc.top_logprobs = top.values.clamp(min=-9999.0).numpy().astype(np.float32)
                out[i] = sc
        return [o for o in out if o is not None]

    def generate_growing(self, requests: list[GenRequest], follow: Any = None) -> list[list[GenResult]]:
        """Continuous batching: ``follow(i, results)`` may add requests when request ``i`` is done;
        they join the running batch (:func:`gfcr.generate.engines.growing.decode_growing`)."""
        from gfcr.generate.engines.growing import decode_growing

        return decode_growing(self, requests, follow)

    def _hit_stop(self, toks: list[int], stop: list[str]) -> bool:
        tail = self.tokenizer.decode(toks[-64:], skip_special_tokens=False)
        return any(s in tail for s in stop)

    def __repr__(self) -> str:
        return f"HFEngine(model={self.model_name!r}, device={self.device}, max_batch={self.max_batch})"


def teacher_forced_logprobs(model: Any, token_ids: Any, prompt_len: int, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    """Log-probs of ``token_ids[prompt_len:]`` under ``model`` in one teacher-forced forward pass.

    Args:
        token_ids: ``[T]`` ids (prompt + generated).
    Returns:
        float32 ``[T - prompt_len]``: ``sampling_logprobs(logits_{t-1}, T, top_p)[token_t]``.
    """
    import torch

    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))[None]
    with torch.no_grad():
        logits = model(input_ids=ids.to(next(model.parameters()).device)).logits[0].float().cpu()
    lp = sampling_logprobs(logits[prompt_len - 1 : -1], temperature, top_p)
    tgt = ids[0, prompt_len:]
    got = lp.gather(-1, tgt[:, None])[:, 0]
    return got.numpy().astype(np.float32)
