"""The ``openai`` engine: any OpenAI-compatible server (``gfcr serve``, vLLM, SGLang, hosted APIs).

Token-id prompts go to ``/v1/completions`` (prompt as a list of ids), chat prompts to
``/v1/chat/completions``; log-probs are requested. Exact sampled ids are read from the
``token_ids`` extension (``gfcr serve`` and vLLM with ``return_token_ids``) or from
``token_id:N`` strings (vLLM ``return_tokens_as_token_ids``); failing both, the text is
re-tokenized with a local ``tokenizer`` (if given) and the result is flagged
``tokens_source="retokenized"``. Requests run on a thread pool of ``max_concurrency``; connection
errors and HTTP 408/409/429/5xx are retried with exponential backoff.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gfcr.generate.engines.base import GenRequest, GenResult

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)


class OpenAIEngineError(RuntimeError):
    """The server refused a request or kept failing; the message has its answer."""


class OpenAIEngine:
    """Client engine for an OpenAI-compatible endpoint (see module docstring).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        api_key: bearer token (``None``: none sent).
        tokenizer: optional local tokenizer (path or object) for re-tokenizing text answers.
        max_concurrency: requests in flight at once.
        max_retries, backoff_s: retries of failed requests, first wait (doubles each retry).
        timeout_s: per-request timeout.
        policy_version: recorded with rollouts (default ``"openai:<model>"``).
    """

    name = "openai"

    def __init__(self, base_url: str, model: str = "default", api_key: str | None = None, tokenizer: Any = None,
                 max_concurrency: int = 8, max_retries: int = 4, backoff_s: float = 0.5, timeout_s: float = 300.0,
                 policy_version: str | None = None, extra_body: dict[str, Any] | None = None):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_concurrency = int(max_concurrency)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.extra_body = dict(extra_body or {})
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self.policy_version = policy_version or f"openai:{model}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers,
                                    limits=httpx.Limits(max_connections=self.max_concurrency))

    def close(self) -> None:
        self._client.close()

    def set_policy_version(self, version: str) -> None:
        """The version recorded with rollouts from now on (set by :class:`gfcr.generate.sync.HTTPSync`
        after the server loaded new weights)."""
        self.policy_version = version

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        url = f"{self.base_url}{path}"
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                resp = self._client.post(url, json=body)
                if resp.status_code == 200:
                    return resp.json()
                last = f"HTTP {resp.status_code}: {_error_message(resp)}"
                if resp.status_code not in RETRY_STATUS:
                    raise OpenAIEngineError(f"POST {url} failed: {last}")
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            if attempt < self.max_retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise OpenAIEngineError(f"POST {url} failed after {self.max_retries + 1} attempts: {last}")

    def _one(self, req: GenRequest) -> list[GenResult]:
        p = req.params
        body: dict[str, Any] = {"model": self.model, "n": p.n, "temperature": p.temperature, "top_p": p.top_p,
                                "max_tokens": p.max_tokens, "return_token_ids": True}
        if p.stop:
            body["stop"] = p.stop
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop_token_ids:
            body["stop_token_ids"] = p.stop_token_ids
        if p.repeat_ngram:  # gfcr serve's extension; other servers may refuse it
            body |= {"repeat_ngram": p.repeat_ngram, "repeat_max": p.repeat_max}
        if p.top_k:  # vLLM / gfcr serve extension
            body["top_k"] = p.top_k
        if p.frequency_penalty:
            body["frequency_penalty"] = p.frequency_penalty
        if p.presence_penalty:
            body["presence_penalty"] = p.presence_penalty
        if p.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in p.logit_bias.items()}
        # vLLM's sampling extras (gfcr serve has them too), sent only when they ask for something
        extras = {"min_p": p.min_p, "repetition_penalty": p.repetition_penalty if p.repetition_penalty != 1.0 else 0,
                  "min_tokens": p.min_tokens, "ignore_eos": p.ignore_eos}
        body |= {k: v for k, v in extras.items() if v}
        if p.top_logprobs:  # name the alternatives by id (vLLM / gfcr serve), so no re-tokenizing is needed
            body["return_tokens_as_token_ids"] = True
        body.update(self.extra_body)
        t0 = time.perf_counter()
        if req.prompt_ids is not None:
            body |= {"prompt": [int(t) for t in req.prompt_ids], "logprobs": p.top_logprobs}
            out = self._post("/completions", body)
        else:
            body |= {"messages": req.messages, "logprobs": True}
            if p.top_logprobs:
                body["top_logprobs"] = p.top_logprobs
            out = self._post("/chat/completions", body)
        dt = time.perf_counter() - t0
        results = []
        for c in sorted(out.get("choices", []), key=lambda c: c.get("index", 0)):
            results.append(self._parse_choice(c, req, dt))
        if len(results) != p.n:
            raise OpenAIEngineError(f"server returned {len(results)} choices for n={p.n}")
        return results

    def _parse_choice(self, c: dict[str, Any], req: GenRequest, dt: float) -> GenResult:
        text = c["text"] if "text" in c else (c.get("message") or {}).get("content") or ""
        lp_obj = c.get("logprobs") or {}
        if "content" in lp_obj:  # chat format
            toks = [e.get("token", "") for e in lp_obj["content"] or []]
            lps = [float(e.get("logprob", 0.0)) for e in lp_obj["content"] or []]
        else:
            toks = list(lp_obj.get("tokens") or [])
            lps = [float(x) if x is not None else 0.0 for x in (lp_obj.get("token_logprobs") or [])]
        source = "engine"
        if c.get("token_ids") is not None:
            ids = [int(t) for t in c["token_ids"]]
        elif toks and all(t.startswith("token_id:") for t in toks):
            ids = [int(t.split(":", 1)[1]) for t in toks]
        elif self.tokenizer is not None:
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            source = "retokenized"
        else:
            raise OpenAIEngineError(
                "the server returned no token ids; pass tokenizer= to re-tokenize text (lossy) or use a server "
                "that supports return_token_ids (gfcr serve, vLLM)")
        if len(lps) != len(ids):
            lps = (lps + [0.0] * len(ids))[: len(ids)] if source == "retokenized" else lps
        if len(lps) != len(ids):
            raise OpenAIEngineError(f"{len(lps)} logprobs for {len(ids)} tokens in the server's answer")
        top_ids, top_lps = self._tops(lp_obj, req.params.top_logprobs, len(ids)) if source == "engine" else (None, None)
        prompt_ids = c.get("prompt_token_ids")
        if prompt_ids is None and req.prompt_ids is not None:
            prompt_ids = req.prompt_ids
        return GenResult(
            token_ids=np.asarray(ids, dtype=np.int32),
            logprobs=np.minimum(np.asarray(lps, dtype=np.float32), 0.0),
            finish_reason=c.get("finish_reason") or "unknown",
            latency_s=dt,
            prompt_ids=None if prompt_ids is None else np.asarray(prompt_ids, dtype=np.int32),
            text=text,
            tokens_source=source,
            entropies=_entropies(c.get("token_entropies"), len(ids)) if source == "engine" else None,
            top_ids=top_ids,
            top_logprobs=top_lps,
        )

    def _tops(self, lp_obj: dict[str, Any], n: int, T: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The top-``n`` alternatives per token from a chat (``content[].top_logprobs``) or completions
        (``top_logprobs`` dicts) answer, as ids (a local ``tokenizer`` maps the token strings; without one,
        or when a string is not one token, None) and log-probs, best first; ``token_id:N`` names are read
        directly."""
        if not n:
            return None, None
        if "content" in lp_obj:
            rows = [[(e.get("token", ""), e.get("logprob")) for e in (x.get("top_logprobs") or [])]
                    for x in lp_obj["content"] or []]
        else:
            rows = [sorted((d or {}).items(), key=lambda kv: -kv[1]) for d in lp_obj.get("top_logprobs") or []]
        if len(rows) != T:
            return None, None
        ids = np.zeros((T, n), np.int32)
        lps = np.full((T, n), -9999.0, np.float32)
        for t, row in enumerate(rows):
            for j, (s, v) in enumerate(row[:n]):
                if s.startswith("token_id:"):
                    enc = [int(s.split(":", 1)[1])]
                elif self.tokenizer is not None:
                    enc = self.tokenizer(s, add_special_tokens=False)["input_ids"]
                else:
                    return None, None
                if len(enc) != 1:
                    return None, None
                ids[t, j], lps[t, j] = enc[0], float(v)
        return ids, lps

    def generate(self, requests: list[GenRequest]) -> list[list[GenResult]]:
        if len(requests) <= 1 or self.max_concurrency <= 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> str:
        """Convenience: one chat completion's text (for judges)."""
        from gfcr.generate.engines.base import SamplingParams

        req = GenRequest(messages=messages, params=SamplingParams(**params))
        return self._one(req)[0].text or ""


def _error_message(resp: Any) -> str:
    """The message of an error answer: OpenAI/vLLM ``{"error": {"message"}}``, FastAPI ``{"detail"}``, or
    the start of the body."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:1000]
        if body.get("detail"):
            return str(body["detail"])[:1000]
    return resp.text[:500]


def _entropies(values: Any, n: int) -> np.ndarray | None:
    """``token_entropies`` of a ``gfcr serve`` answer, when there is one per token and all are finite."""
    if not isinstance(values, list) or len(values) != n:
        return None
    arr = np.asarray(values, dtype=np.float32)
    return arr if np.isfinite(arr).all() else None
