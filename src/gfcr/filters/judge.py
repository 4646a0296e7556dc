"""An LLM-judge client for any OpenAI-compatible ``/v1/chat/completions`` endpoint.

A :class:`JudgeTemplate` holds a system prompt, a user prompt with ``{field}`` slots and the JSON
Schema the answer must satisfy. :class:`JudgeClient` renders it, calls the endpoint, extracts and
validates the JSON, and on invalid output retries with the validation error fed back as a user
turn (up to ``max_retries``). Every call returns a :class:`JudgeResult` recording the raw outputs,
latency and tokens; a call that never validates ends as ``ok=False`` with the last error, never
an exception. Results are cached on disk by sha256(messages, model, params, schema), so a re-run
costs nothing. ``judge_many`` runs calls with bounded concurrency (threads).

Ready templates: :data:`EQUIVALENCE` (xVerify-style answer equivalence, arXiv 2504.10481: judge
the final answer only, accept mathematically equivalent forms) and :data:`RUBRIC` (pointwise
1–10 rubric score).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from gfcr.config import StrictModel


class JudgeConfig(StrictModel):
    """Where and how to call the judge model: the one LLM-judge vocabulary (ROSS's audit judge
    composes it as ``judge.llm``)."""

    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="Model name sent in the request.")
    api_key: str | None = Field(None, description="Bearer token, if the server wants one.")
    api_key_env: str | None = Field(None, description=(
        "Environment variable holding the bearer token (used when api_key is not given; keeps the key out of "
        "config files)."))
    temperature: float = Field(0.0, ge=0, description="Sampling temperature.")
    max_tokens: int = Field(256, ge=1, description="Max tokens of each judge answer.")
    max_retries: int = Field(2, ge=0, description="Retries after an invalid answer (error fed back).")
    concurrency: int = Field(4, ge=1, description="Calls in flight at once in judge_many.")
    timeout_s: float = Field(60.0, gt=0, description="HTTP timeout per request.")
    cache_dir: str | None = Field(None, description="Directory of the on-disk cache (None: no cache).")
    cache_failures: bool = Field(False, description="Also cache calls that ended without valid JSON.")
    json_mode: bool = Field(False, description="Send response_format={'type': 'json_object'}.")


@dataclass
class JudgeTemplate:
    """A judge prompt: ``user`` is formatted with the call's fields; the answer must fit ``schema``."""

    name: str
    system: str
    user: str
    schema: dict[str, Any]
    version: str = "1"

    def render(self, fields: dict[str, Any]) -> list[dict[str, str]]:
        try:
            user = self.user.format(**fields)
        except KeyError as e:
            raise ValueError(f"judge template {self.name!r} needs field {e.args[0]!r}") from None
        schema = json.dumps(self.schema, sort_keys=True)
        system = f"{self.system}\nReply with only a JSON object that satisfies this JSON Schema:\n{schema}"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@dataclass
class JudgeResult:
    """One judge call: the parsed answer (when valid) and everything it cost."""

    ok: bool
    parsed: dict[str, Any] | None
    error: str | None
    raw_outputs: list[str] = field(default_factory=list)
    attempts: int = 0
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    template: str = ""
    model: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EQUIVALENCE = JudgeTemplate(
    name="equivalence",
    system=(
        "You check whether a model's final answer matches a reference answer. If the output states "
        "several answers, judge only the final one. Accept mathematically equivalent forms (fractions, "
        "decimals, simplified expressions) and answers that mean the same thing. Do not solve the "
        "question yourself."
    ),
    user="Question:\n{question}\n\nModel output:\n{output}\n\nReference answer:\n{reference}",
    schema={
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["Correct", "Incorrect"]},
            "reason": {"type": "string"},
        },
        "required": ["verdict"],
    },
)

RUBRIC = JudgeTemplate(
    name="rubric",
    system="You grade a response against a rubric, pointwise, on a 1-10 scale (10 = fully meets it).",
    user="Task:\n{question}\n\nResponse:\n{response}\n\nRubric:\n{rubric}",
    schema={
        "type": "object",
        "properties": {
            "score": {"type": "integer", "minimum": 1, "maximum": 10},
            "rationale": {"type": "string"},
        },
        "required": ["score", "rationale"],
    },
)

TEMPLATES = {"equivalence": EQUIVALENCE, "rubric": RUBRIC}

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_json(text: str) -> tuple[Any, str | None]:
    """The JSON object in a model answer (whole text, a fenced block, or the first ``{…}``).

    Returns ``(object, None)`` or ``(None, error message)``.
    """
    cands = [text.strip()] + [m.strip() for m in _FENCE.findall(text)]
    start = text.find("{")
    if start >= 0:
        cands.append(text[start : text.rfind("}") + 1])
    dec = json.JSONDecoder()
    for c in cands:
        if not c:
            continue
        try:
            return json.loads(c), None
        except json.JSONDecodeError:
            pass
    if start >= 0:
        try:
            obj, _ = dec.raw_decode(text[start:])
            return obj, None
        except json.JSONDecodeError as e:
            return None, f"invalid JSON: {e.msg} at char {e.pos}"
    return None, "no JSON object found in the answer"


def validate_json(obj: Any, schema: dict[str, Any]) -> str | None:
    """None when ``obj`` satisfies ``schema``, else a one-line error naming the path."""
    import jsonschema

    v = jsonschema.validators.validator_for(schema)(schema)
    errs = sorted(v.iter_errors(obj), key=lambda e: list(e.path))
    if not errs:
        return None
    e = errs[0]
    where = "/".join(str(p) for p in e.path) or "(root)"
    return f"schema violation at {where}: {e.message}"


class JudgeClient:
    """Calls an OpenAI-compatible endpoint with a template; validates, retries, caches, records."""

    def __init__(self, config: JudgeConfig, template: JudgeTemplate | str) -> None:
        self.config = config
        self.template = TEMPLATES[template] if isinstance(template, str) else template
        self._cache = Path(config.cache_dir) if config.cache_dir else None
        if self._cache:
            self._cache.mkdir(parents=True, exist_ok=True)

    def _params(self) -> dict[str, Any]:
        return {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
                "max_retries": self.config.max_retries, "json_mode": self.config.json_mode}

    def cache_key(self, messages: list[dict[str, str]]) -> str:
        blob = json.dumps(
            {"messages": messages, "model": self.config.model, "params": self._params(),
             "schema": self.template.schema, "template": [self.template.name, self.template.version]},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def judge(self, **fields: Any) -> JudgeResult:
        messages = self.template.render(fields)
        key = self.cache_key(messages)
        path = self._cache / f"{key}.json" if self._cache else None
        if path is not None and path.exists():
            res = JudgeResult(**json.loads(path.read_text()))
            if res.ok or self.config.cache_failures:  # a cached failure counts only when failures are cached
                res.cached = True
                return res
        res = self._call(messages)
        if path is not None and (res.ok or self.config.cache_failures):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(res.to_dict()))
            tmp.replace(path)  # atomic: a crash never leaves a half-written entry
        return res

    def judge_many(self, items: list[dict[str, Any]]) -> list[JudgeResult]:
        """Judge each field dict, at most ``config.concurrency`` calls in flight; input order kept."""
        with ThreadPoolExecutor(self.config.concurrency) as ex:
            return list(ex.map(lambda f: self.judge(**f), items))

    def _call(self, messages: list[dict[str, str]]) -> JudgeResult:
        import httpx

        cfg = self.config
        res = JudgeResult(ok=False, parsed=None, error=None, template=self.template.name, model=cfg.model)
        key = cfg.api_key or (os.environ.get(cfg.api_key_env) if cfg.api_key_env else None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        convo = list(messages)
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        t0 = time.perf_counter()
        with httpx.Client(timeout=cfg.timeout_s, headers=headers) as http:
            for attempt in range(cfg.max_retries + 1):
                res.attempts = attempt + 1
                body: dict[str, Any] = {"model": cfg.model, "messages": convo, "temperature": cfg.temperature,
                                        "max_tokens": cfg.max_tokens}
                if cfg.json_mode:
                    body["response_format"] = {"type": "json_object"}
                try:
                    r = http.post(url, json=body)
                    r.raise_for_status()
                    data = r.json()
                    text = data["choices"][0]["message"]["content"] or ""
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                    res.error = f"request failed: {type(e).__name__}: {e}"
                    continue
                usage = data.get("usage") or {}
                res.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                res.completion_tokens += int(usage.get("completion_tokens") or 0)
                res.raw_outputs.append(text)
                obj, err = extract_json(text)
                if err is None:
                    err = validate_json(obj, self.template.schema)
                if err is None:
                    res.ok, res.parsed, res.error = True, obj, None
                    break
                res.error = err
                convo = convo + [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"Your answer was invalid: {err}. Reply again with only a JSON "
                                                 "object that satisfies the schema."},
                ]
        res.latency_s = time.perf_counter() - t0
        if not res.ok:
            res.error = f"no valid answer after {res.attempts} attempt(s): {res.error}"
        return res
