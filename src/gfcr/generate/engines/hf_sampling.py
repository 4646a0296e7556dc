"""The hf engine's sampling rules as pure functions (used by :mod:`gfcr.generate.engines.decode`):
the distribution sampled from (:func:`sampling_logprobs`: temperature, top-k, top-p), OpenAI's
penalties and logit bias (:func:`penalized_logits`), its entropy (:func:`entropy_of`), the vectorised
draw (:func:`inverse_cdf_sample`) from each row's seeded stream (:func:`row_generator`,
:data:`NOISE_BLOCK`), and the repetition counter of early exit (:class:`NgramCounter`).
"""

from __future__ import annotations

from typing import Any

NOISE_BLOCK = 64  # uniforms each row's generator draws at a time (fixed, so a seed's stream never depends on the batch)


def sampling_logprobs(logits: Any, temperature: float, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> Any:
    """Log-probs of the distribution sampled from: ``softmax(logits / T)``, cut by min-p, to the top-k
    tokens, then to the top-p nucleus (vLLM's order: its sampler applies temperature, then the min-p
    logits processor, then top-k/top-p; ``vllm/v1/sample/sampler.py``, ``MinPLogitsProcessor`` in
    ``vllm/v1/sample/logits_processor/builtin.py``).

    Args:
        logits: float tensor ``[B, V]``.
        temperature: ``T > 0`` (``0`` means greedy: the unscaled ``log_softmax(logits)`` is returned).
        top_p: keep the smallest set of most likely tokens whose mass reaches ``top_p`` (the most
            likely token is always kept), renormalise; the rest get ``-inf``.
        top_k: keep only the ``top_k`` largest logits (ties with the k-th kept); 0 = off.
        min_p: drop the tokens whose probability under ``softmax(logits / T)`` is below ``min_p`` times
            the most likely token's (the most likely is always kept); 0 = off (ignored when greedy).
    Returns:
        float tensor ``[B, V]`` of log-probs (each row logsumexps to 0).

    Example: logits ``[ln 0.5, ln 0.3, ln 0.2]``, T = 1, top_p = 0.7 keeps the first two tokens
    (0.5 < 0.7 <= 0.8) and gives log-probs ``[ln 0.625, ln 0.375, -inf]``; top_k = 1 instead gives
    ``[0, -inf, -inf]``; min_p = 0.5 instead keeps the tokens with p >= 0.25 (the first two) and gives
    ``[ln 0.625, ln 0.375, -inf]``.
    """
    import torch

    x = logits.float()
    if temperature > 0:
        x = x / temperature
        if min_p > 0:
            p = torch.softmax(x, dim=-1)
            x = x.masked_fill(p < min_p * p.amax(dim=-1, keepdim=True), float("-inf"))
        if 0 < top_k < x.shape[-1]:
            kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
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


def penalized_logits(logits: Any, counts: Any, frequency: Any, presence: Any, bias: Any = None) -> Any:
    """OpenAI's penalties and logit bias: ``logits - f * c - p * (c > 0) + bias``.

    Args:
        logits: ``[B, V]``; counts: ``[B, V]`` occurrences of each token among the tokens generated so
            far (the prompt does not count, as in vLLM); frequency, presence: ``[B]``; bias: ``[B, V]`` or None.
    Returns:
        ``[B, V]`` adjusted logits.

    Example: logits ``[1, 1, 1]``, counts ``[2, 1, 0]``, f = 0.5, p = 0.25 → ``[-0.25, 0.25, 1]``.
    """
    x = logits.float() - frequency[:, None] * counts - presence[:, None] * (counts > 0).float()
    return x + bias if bias is not None else x


def repetition_penalized(logits: Any, seen: Any, penalty: Any) -> Any:
    """The repetition penalty of CTRL (Keskar et al. 2019, arXiv:1909.05858, section 4.1) as vLLM and HF
    apply it (vLLM ``apply_penalties`` in ``vllm/model_executor/layers/utils.py``; HF
    ``RepetitionPenaltyLogitsProcessor``): a token already seen (in the prompt or the generated tokens)
    has its logit divided by the penalty when positive and multiplied by it otherwise.

    Departure from CTRL: CTRL divides every seen logit (which raises a negative one); vLLM/HF multiply
    negative ones so that a penalty > 1 always lowers a seen token. gfcr follows vLLM.

    Args:
        logits: float ``[B, V]``; seen: bool ``[B, V]``; penalty: float ``[B]`` (1 = off).
    Returns:
        ``[B, V]`` adjusted logits.

    Example: logits ``[2, -1, 3]``, seen ``[T, T, F]``, penalty 2 → ``[1, -2, 3]``.
    """
    import torch

    x = logits.float()
    r = penalty.to(x.dtype)[:, None]
    return torch.where(seen, torch.where(x > 0, x / r, x * r), x)


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

    # -inf becomes the most negative finite float, and 0 x that is 0: half the passes of a torch.where
    return -(probs * lp.clamp(min=torch.finfo(lp.dtype).min)).sum(-1)


def inverse_cdf_sample(probs: Any, u: Any) -> Any:
    """One token per row, drawn from ``probs`` with that row's uniform number ``u`` (inverse CDF).

    Args:
        probs: float ``[B, V]``, non-negative (a row need not sum to exactly 1: it is scaled by its total).
        u: float ``[B]`` in ``[0, 1)``.
    Returns:
        long ``[B]``: the first token whose cumulative mass exceeds ``u x total`` (a zero-probability
        token is never returned; ``u`` is kept strictly below the total, so a rounding ``u x total`` never
        runs past the end).

    Example: probs ``[0.5, 0.3, 0.2]`` (cumulative ``[0.5, 0.8, 1.0]``): u = 0.1 gives 0, u = 0.5 gives 1,
    u = 0.9 gives 2; probs ``[0.5, 0, 0.5]`` with u = 0.5 gives 2, never the empty token 1.
    """
    import torch

    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    x = torch.minimum(u.to(cdf.dtype)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)[:, 0]


def row_generator(seed: int | None, sample: int) -> Any:
    """The ``torch.Generator`` of sample ``sample`` of a request seeded ``seed`` (seeded ``seed + sample``;
    from the OS when ``seed`` is None)."""
    import torch

    g = torch.Generator(device="cpu")
    if seed is None:
        g.seed()
    else:
        g.manual_seed((int(seed) + sample) % (2**63))
    return g
