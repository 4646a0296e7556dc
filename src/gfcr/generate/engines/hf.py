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
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult, SamplingParams


def sampling_logprobs(logits: Any, temperature: float, top_p: float = 1.0) -> Any:
    """Log-probs of the distribution sampled from: ``softmax(logits / T)``, cut to the top-p nucleus.

    Args:
        logits: float tensor ``[B, V]``.
        temperature: ``T > 0`` (``0`` means greedy: the unscaled ``log_softmax(logits)`` is returned).
        top_p: keep the smallest set of most likely tokens whose mass reaches ``top_p`` (the most
            likely token is always kept), renormalise; the rest get ``-inf``.
    Returns:
        float tensor ``[B, V]`` of log-probs (each row logsumexps to 0).

    Example: logits ``[ln 0.5, ln 0.3, ln 0.2]``, T = 1, top_p = 0.7 keeps the first two tokens
    (0.5 < 0.7 <= 0.8) and gives log-probs ``[ln 0.625, ln 0.375, -inf]``.
    """
    import torch

    x = logits.float()
    if temperature > 0:
        x = x / temperature
    lp = torch.log_softmax(x, dim=-1)
    if temperature > 0 and top_p < 1.0:
        sorted_lp, idx = torch.sort(lp, dim=-1, descending=True)
        p = sorted_lp.exp()
        mass_before = p.cumsum(-1) - p
        drop = mass_before >= top_p
        drop[..., 0] = False
        sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
        lp = torch.full_like(lp, float("-inf")).scatter(-1, idx, sorted_lp)
        lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    return lp


class NgramCounter:
    """Counts, as tokens arrive, how often each n-gram has occurred; :meth:`add` returns the count of
    the n-gram the new token completes, i.e. how often the sequence's trailing n-gram occurs in it
    (the quantity ``gfcr.control.groups.tail_ngram_count`` computes from scratch), in O(1) per token.
    ``n = 0`` counts nothing (always 0).

    Example (n = 2): tokens 1, 2, 1, 2 → add returns 0, 1, 1, 2.
    """

    def __init__(self, n: int):
        self.n = int(n)
        self.tail: list[int] = []
        self.counts: dict[tuple[int, ...], int] = {}

    def add(self, token: int) -> int:
        if self.n <= 0:
            return 0
        self.tail.append(int(token))
        if len(self.tail) > self.n:
            del self.tail[0]
        if len(self.tail) < self.n:
            return 0
        key = tuple(self.tail)
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]


def entropy_of(lp: Any, probs: Any) -> Any:
    """Entropy ``-Σ p log p`` over the last axis of log-probs ``lp`` and their ``probs = lp.exp()``
    (``[..., V]`` → ``[...]``); tokens cut by top-p (``lp = -inf``, ``p = 0``) add 0.

    Example: ``lp = [ln 0.5, ln 0.5, -inf]`` → ``ln 2``.
    """
    import torch

    return -torch.where(probs > 0, probs * lp, torch.zeros_like(lp)).sum(-1)


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
        rows: list[tuple[int, int, list[int], SamplingParams]] = []
        for ri, req in enumerate(requests):
            pids = self._prompt_ids(req)
            for si in range(req.params.n):
                rows.append((ri, si, pids, req.params))
        out: list[list[GenResult | None]] = [[None] * r.params.n for r in requests]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][2]))
        for b in range(0, len(order), self.max_batch):
            chunk = [rows[i] for i in order[b : b + self.max_batch]]
            for (ri, si, _, _), res in zip(chunk, self._generate_batch(chunk), strict=True):
                out[ri][si] = res
        return [[r for r in rs if r is not None] for rs in out]

    def _generate_batch(self, rows: list[tuple[int, int, list[int], SamplingParams]]) -> list[GenResult]:
        import torch

        t0 = time.perf_counter()
        B = len(rows)
        L = max(len(r[2]) for r in rows)
        pad = int(self.tokenizer.pad_token_id)
        ids = torch.full((B, L), pad, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, (_, _, p, _) in enumerate(rows):
            ids[i, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, L - len(p) :] = 1
        gens = []
        for _, si, _, sp in rows:
            g = torch.Generator(device="cpu")
            if sp.seed is None:
                g.seed()
            else:
                g.manual_seed((int(sp.seed) + si) % (2**63))
            gens.append(g)
        max_new = [sp.max_tokens for _, _, _, sp in rows]
        stop_ids = [self.eos_ids | set(sp.stop_token_ids) for _, _, _, sp in rows]
        uniform = len({(sp.temperature, sp.top_p) for _, _, _, sp in rows}) == 1
        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        ents: list[list[float]] = [[] for _ in range(B)]
        repeats = [NgramCounter(sp.repeat_ngram) for _, _, _, sp in rows]  # early exit on repetition
        exits: list[str | None] = [None] * B
        finish: list[str | None] = [None] * B
        dev = self.device
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        live = list(range(B))  # original row of each row still in the batch (finished rows are dropped)
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **self._prefill_kw)
            past = _cache_of(out)
            can_prune = hasattr(past, "batch_select_indices")
            logits = out.logits[:, -1, :].float().cpu()  # [len(live), V]
            for _step in range(max(max_new)):
                nxt = torch.full((len(live),), pad, dtype=torch.long)
                lp_all = sampling_logprobs(logits, rows[0][3].temperature, rows[0][3].top_p) if uniform else None
                probs_all = lp_all.exp() if lp_all is not None else None
                ent_all = entropy_of(lp_all, probs_all) if lp_all is not None else None
                for k, i in enumerate(live):
                    sp = rows[i][3]
                    if finish[i] is not None:
                        continue
                    if lp_all is not None:
                        lp, probs, ent = lp_all[k], probs_all[k], float(ent_all[k])
                    else:
                        lp = sampling_logprobs(logits[k : k + 1], sp.temperature, sp.top_p)[0]
                        probs = lp.exp()
                        ent = float(entropy_of(lp, probs))
                    if sp.temperature == 0:
                        t = int(torch.argmax(lp))
                    else:
                        t = int(torch.multinomial(probs, 1, generator=gens[i]))
                    nxt[k] = t
                    toks[i].append(t)
                    lps[i].append(float(lp[t]))
                    ents[i].append(ent)
                    if t in stop_ids[i]:
                        finish[i] = "stop"
                    elif sp.stop and self._hit_stop(toks[i], sp.stop):
                        finish[i] = "stop"
                    elif len(toks[i]) >= sp.max_tokens:
                        finish[i] = "length"
                    elif sp.repeat_ngram and repeats[i].add(t) >= sp.repeat_max:
                        finish[i] = "abort"
                        exits[i] = "repetition"
                keep = [k for k, i in enumerate(live) if finish[i] is None]
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
                past = _cache_of(out)
                logits = out.logits[:, -1, :].float().cpu()
        dt = time.perf_counter() - t0
        res = []
        for i, (_, _, p, _) in enumerate(rows):
            lp_arr = np.asarray(lps[i], dtype=np.float32)
            lp_arr = np.where(np.isfinite(lp_arr), lp_arr, np.float32(-1e4)).astype(np.float32)
            res.append(
                GenResult(
                    token_ids=np.asarray(toks[i], dtype=np.int32),
                    logprobs=np.minimum(lp_arr, 0.0).astype(np.float32),
                    finish_reason=finish[i] or "length",
                    latency_s=dt,
                    prompt_ids=np.asarray(p, dtype=np.int32),
                    text=self.tokenizer.decode(toks[i], skip_special_tokens=False),
                    meta={"batch_size": B} | ({"early_exit": exits[i]} if exits[i] else {}),
                    entropies=np.asarray(ents[i], dtype=np.float32),
                )
            )
        return res

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


def _cache_of(out: Any) -> Any:
    """The KV cache of a model output (``cache`` in transformers >= 5.2x, ``past_key_values`` before)."""
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values
