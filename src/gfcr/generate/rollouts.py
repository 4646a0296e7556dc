"""From an engine's result to a token-faithful :class:`gfcr.records.Rollout`, shared by every topology
(:mod:`~gfcr.generate.topologies`) and the growing-batch tree decode (:mod:`~gfcr.generate.tree_growing`):
seeds and group ids, the prompt's token ids, the decoded completion, the rollout record itself and its
per-token entropies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gfcr.generate.engines.base import Engine, GenResult, SamplingParams
from gfcr.records import CONTEXT, GENERATED, Cost, Message, Prompt, Rollout


def derive_seed(seed: int | None, *parts: Any) -> int | None:
    """A per-request seed from a base seed and identifying parts (``None`` stays ``None``)."""
    if seed is None:
        return None
    h = hashlib.blake2b("|".join(map(str, (seed, *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % (2**31 - 1)


def group_id_of(prompt_id: str, step: int, run_id: str) -> str:
    return f"{prompt_id}@{run_id}:{step}"


def prompt_messages(prompt: Prompt) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.content} for m in prompt.messages]


def engine_tokenizer(engine: Engine) -> Any | None:
    return getattr(engine, "tokenizer", None)


def encode_prompt(engine: Engine, prompt: Prompt) -> list[int] | None:
    """Chat-templated prompt ids with the engine's tokenizer (``None`` if it has none)."""
    tok = engine_tokenizer(engine)
    if tok is None:
        return None
    if hasattr(engine, "encode_messages"):
        return list(engine.encode_messages(prompt_messages(prompt)))
    text = tok.apply_chat_template(prompt_messages(prompt), tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def decode_completion(engine: Engine, ids: np.ndarray, fallback: str | None) -> str:
    """Assistant text from generated ids: special tokens dropped (e.g. the final ``<|im_end|>``)."""
    tok = engine_tokenizer(engine)
    if tok is None:
        return fallback or ""
    return tok.decode([int(t) for t in ids], skip_special_tokens=True)


def rollout_from_result(
    engine: Engine,
    prompt: Prompt,
    res: GenResult,
    prompt_ids: Sequence[int] | None,
    params: SamplingParams,
    run_id: str,
    step: int,
    sample_index: int,
    group_id: str,
    policy_version: str,
    parent_id: str | None = None,
    branch_pos: int | None = None,
    prefix_ids: Sequence[int] | None = None,
    prefix_role: Sequence[int] | None = None,
    prefix_logprobs: Sequence[float] | None = None,
    meta: dict[str, Any] | None = None,
    prefix_entropies: Sequence[float] | None = None,
) -> Rollout:
    """One rollout: (prefix or prompt) + generated tokens with roles and behaviour log-probs.

    When the engine reports per-token entropies (``GenResult.entropies``, the hf engine does) and,
    for a continued prefix, ``prefix_entropies`` gives those of the prefix (``nan`` on context),
    ``signals["entropy"]`` is the mean entropy over the rollout's generated tokens: the entropy of
    the distribution each was sampled from (the top-p nucleus when ``top_p < 1``).
    """
    if prefix_ids is not None:
        ids = np.concatenate([np.asarray(prefix_ids, np.int32), res.token_ids.astype(np.int32)])
        role = np.concatenate([np.asarray(prefix_role, np.uint8), np.full(len(res.token_ids), GENERATED, np.uint8)])
        lps = np.concatenate([np.asarray(prefix_logprobs, np.float32), res.logprobs.astype(np.float32)])
        n_prompt = int(np.count_nonzero(role == CONTEXT))
    else:
        p = res.prompt_ids if res.prompt_ids is not None else (np.asarray(prompt_ids, np.int32) if prompt_ids is not None else None)
        if p is None:
            raise ValueError("the engine returned no prompt token ids and no tokenizer is available to make them")
        p = np.asarray(p, np.int32)
        ids = np.concatenate([p, res.token_ids.astype(np.int32)])
        role = np.concatenate([np.zeros(len(p), np.uint8), np.full(len(res.token_ids), GENERATED, np.uint8)])
        lps = np.concatenate([np.zeros(len(p), np.float32), res.logprobs.astype(np.float32)])
        n_prompt = len(p)
    gen = ids[role == GENERATED]
    text = decode_completion(engine, gen, res.text)
    ent = token_entropies(res, len(ids) - len(res.token_ids), prefix_entropies if prefix_ids is not None else None,
                          continued=prefix_ids is not None)
    signals = mean_generated_entropy(ent, role)
    return Rollout(
        run_id=run_id,
        prompt_id=prompt.prompt_id,
        token_ids=ids,
        token_role=role,
        logprobs=lps,
        messages=[*prompt.messages, Message("assistant", text)],
        task=prompt.task,
        step=step,
        policy_version=policy_version,
        group_id=group_id,
        sample_index=sample_index,
        parent_id=parent_id,
        branch_pos=branch_pos,
        finish_reason=res.finish_reason if res.finish_reason in ("stop", "length", "abort", "error") else "unknown",
        sampling=params.to_record(engine),
        cost=Cost(prompt_tokens=n_prompt, gen_tokens=int(len(res.token_ids)), latency_s=float(res.latency_s)),
        tokens_source=res.tokens_source,
        signals=signals,
        meta=dict(meta or {}) | ({"early_exit": res.meta["early_exit"]} if res.meta.get("early_exit") else {}),
    )


def token_entropies(res: GenResult, n_before: int, prefix_entropies: Sequence[float] | None,
                    continued: bool) -> np.ndarray | None:
    """Per-token entropies of a whole rollout ``[n_before + T]`` (``nan`` on context tokens), or None
    when the engine reported none or a continued prefix has none."""
    if res.entropies is None or len(res.entropies) != len(res.token_ids):
        return None
    if continued:
        if prefix_entropies is None:
            return None
        head = np.asarray(prefix_entropies, np.float32)
    else:
        head = np.full(n_before, np.nan, np.float32)
    return np.concatenate([head, np.asarray(res.entropies, np.float32)])


def mean_generated_entropy(ent: np.ndarray | None, role: np.ndarray) -> dict[str, float]:
    """``{"entropy": mean over generated tokens}`` when every generated token has one, else ``{}``."""
    if ent is None:
        return {}
    g = np.asarray(ent, np.float64)[np.asarray(role) == GENERATED]
    return {"entropy": float(g.mean())} if g.size and np.isfinite(g).all() else {}


# ---------------------------------------------------------------------------------------------
# group
# ---------------------------------------------------------------------------------------------
