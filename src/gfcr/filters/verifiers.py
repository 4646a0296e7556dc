"""Outcome verifiers: turn a completion (and the task's gold answer or tests) into a :class:`Verdict`.

Every verifier has the same call::

    verdict = verifier.verify(completion, answer=None, tests=None, **context)

and returns ``Verdict(passed, score, evidence, cost_s)``; ``passed`` is ``None`` when the verifier
could not judge (no gold answer, no env signal), never a guess. Verifiers are configured with
keyword arguments checked by a pydantic model (``Verifier.Config``, unknown keys refused), and
are found by name in :data:`VERIFIERS` / :func:`get_verifier`.

Reading the final answer out of the text (the task's stated format, the strict and the lenient
readers, numbers) lives in :mod:`gfcr.filters.answers`; its names are re-exported here.

Heavy work runs out of process, so every verifier is safe to call from threads: ``math`` uses a
pool of math-verify worker processes (:mod:`gfcr.filters._mathpool`) and ``code`` runs tests in the
sandbox (:mod:`gfcr.sandbox`).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import AliasChoices, Field, model_validator

from gfcr.config import StrictModel, note_renamed
from gfcr.sandbox import CODE_CHILD, CODE_HARNESS, SandboxConfig, run_python

from .answers import (  # noqa: F401 - the answer readers are re-exported
    ANSWER_FORMATS,
    TRUNCATED_FINISHES,
    extract_answer,
    last_boxed,
    leading_number,
    parse_number,
    read_answer,
    stated_answer_format,
    truncation,
)


@dataclass
class Verdict:
    """A verifier's judgement. ``score`` is the reward it proposes; ``evidence`` says why."""

    passed: bool | None
    score: float
    evidence: dict[str, Any] = field(default_factory=dict)
    cost_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Verifier(Protocol):
    name: str
    version: str

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict: ...


def coderl_reward(status: str, pass_ratio: float = 0.0) -> float:
    """CodeRL/RLTF execution reward.

    CodeRL (arXiv 2207.01780): compile error −1, runtime error −0.6, failed tests −0.3, all pass +1;
    RLTF (arXiv 2307.04349) makes the failing case adaptive: −0.3 + 1.3 × pass_ratio.

    >>> coderl_reward("failed", 0.5)
    0.35
    """
    if status == "compile_error":
        return -1.0
    if status == "runtime_error":
        return -0.6
    if status == "failed":
        return round(-0.3 + 1.3 * float(pass_ratio), 10)
    if status == "passed":
        return 1.0
    raise ValueError(f"unknown code status {status!r}; expected compile_error, runtime_error, failed or passed")


# ---------------------------------------------------------------------------------------------
# Verifiers
# ---------------------------------------------------------------------------------------------


def _no_gold(name: str) -> Verdict:
    return Verdict(None, 0.0, {"error": f"no gold answer: the {name} verifier needs `answer`"})


class _AnswerConfig(StrictModel):
    """Options shared by the verifiers that read a final answer (exact, numeric, math)."""

    answer_format: Literal["task", "any", "answer_line", "boxed"] = Field(
        "task", description="Where the final answer is read: 'task' = the format the task states "
        "(context answer_format; the lenient order when it states none), 'any' = the lenient order "
        "(last \\boxed{}, else an Answer: line, else the last number), or one fixed format.")
    lenient_fallback: bool = Field(
        False, description="When the stated format is absent, fall back to the lenient order (recorded "
        "as evidence lenient_fallback=true). Off: a missing 'Answer: N' line is a failed verdict.")
    allow_truncated: bool = Field(
        False, description="Judge generations cut by the token limit (finish_reason length/abort). Off: "
        "they are never verified (passed=False, reason in the evidence).")


def _truncated_verdict(cfg: _AnswerConfig, answer: Any, context: dict[str, Any], t0: float) -> Verdict | None:
    cut = truncation(context)
    if cut is None or cfg.allow_truncated:
        return None
    ev = {"reason": f"truncated generation (finish_reason={cut}); not verified unless allow_truncated",
          "finish_reason": cut, "gold": answer}
    return Verdict(False, 0.0, ev, time.perf_counter() - t0)


def _final_answer(cfg: _AnswerConfig, completion: str, context: dict[str, Any]) -> tuple[str | None, str, dict[str, Any]]:
    """``(answer, how, evidence)`` under the configured/stated answer format (see :class:`_AnswerConfig`)."""
    fmt = context.get("answer_format") if cfg.answer_format == "task" else cfg.answer_format
    fmt = None if fmt in (None, "any") else fmt
    pred, how = read_answer(completion, fmt)
    ev: dict[str, Any] = {"answer_format": fmt or "any", "lenient_fallback": False}
    if pred is None and fmt is not None and cfg.lenient_fallback:
        pred, how = extract_answer(completion)
        ev["lenient_fallback"] = pred is not None
    return pred, how, ev


class ExactVerifier:
    """Exact string match of the extracted final answer with the gold (after light normalisation)."""

    name = "exact"
    version = "1"

    class Config(_AnswerConfig):
        extract: bool = Field(True, description=(
            "Compare the extracted final answer (else the whole completion)."))
        case_sensitive: bool = Field(False, description="Compare case-sensitively.")

    def __init__(self, **kw: Any) -> None:
        self.config = self.Config(**kw)

    def _norm(self, s: str) -> str:
        s = " ".join(s.strip().strip(".").split())
        return s if self.config.case_sensitive else s.casefold()

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict:
        t0 = time.perf_counter()
        if answer is None:
            return _no_gold(self.name)
        if (cut := _truncated_verdict(self.config, answer, context, t0)) is not None:
            return cut
        if self.config.extract:
            pred, how, ev = _final_answer(self.config, completion, context)
        else:
            pred, how, ev = completion, "whole", {}
        ok = pred is not None and self._norm(pred) == self._norm(str(answer))
        ev.update(extracted=pred, extraction=how, gold=answer)
        if pred is None:
            ev["reason"] = "no answer found"
        return Verdict(ok, float(ok), ev, time.perf_counter() - t0)


class NumericVerifier:
    """Numeric match of the extracted final answer with the gold within a tolerance."""

    name = "numeric"
    version = "1"

    class Config(_AnswerConfig):
        rel_tol: float = Field(1e-6, ge=0, description="Relative tolerance (math.isclose).")
        abs_tol: float = Field(1e-9, ge=0, description="Absolute tolerance (math.isclose).")

    def __init__(self, **kw: Any) -> None:
        self.config = self.Config(**kw)

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict:
        t0 = time.perf_counter()
        if answer is None:
            return _no_gold(self.name)
        gold = parse_number(str(answer))
        if gold is None:
            return Verdict(None, 0.0, {"error": f"gold answer {answer!r} is not a number"})
        if (cut := _truncated_verdict(self.config, answer, context, t0)) is not None:
            return cut
        pred, how, ev = _final_answer(self.config, completion, context)
        val = parse_number(pred) if pred is not None else None
        if val is None and pred is not None and how == "answer_line":
            val = leading_number(pred)  # "Answer: 42 apples"
        ok = val is not None and math.isclose(val, gold, rel_tol=self.config.rel_tol, abs_tol=self.config.abs_tol)
        ev.update(extracted=pred, extraction=how, value=val, gold=gold)
        if pred is None:
            ev["reason"] = "no answer found"
        return Verdict(ok, float(ok), ev, time.perf_counter() - t0)


class FormatVerifier:
    """Structural gate: the completion matches a regex, or holds a JSON object valid under a schema."""

    name = "format"
    version = "1"

    class Config(StrictModel):
        pattern: str | None = Field(None, description="Regex searched in the completion (MULTILINE|DOTALL).")
        json_schema: dict[str, Any] | None = Field(None, description=(
            "JSON Schema the completion's JSON must satisfy."))

    def __init__(self, **kw: Any) -> None:
        self.config = self.Config(**kw)
        if (self.config.pattern is None) == (self.config.json_schema is None):
            raise ValueError("format verifier: give exactly one of `pattern` or `json_schema`")
        self._re = re.compile(self.config.pattern, re.MULTILINE | re.DOTALL) if self.config.pattern is not None else None
        if self.config.json_schema is not None:
            import jsonschema

            jsonschema.validators.validator_for(self.config.json_schema).check_schema(self.config.json_schema)

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict:
        t0 = time.perf_counter()
        if self._re is not None:
            ok = self._re.search(completion) is not None
            ev: dict[str, Any] = {"pattern": self.config.pattern}
        else:
            from .judge import extract_json, validate_json

            obj, err = extract_json(completion)
            if err is None:
                err = validate_json(obj, self.config.json_schema or {})
            ok = err is None
            ev = {"error": err} if err else {}
        return Verdict(ok, float(ok), ev, time.perf_counter() - t0)


class MathVerifier:
    """Math answer equivalence with math-verify (HF), run in worker processes with our own timeout.

    Extracts the final answer (last ``\\boxed{}``, else ``Answer:`` line, else last number), wraps it
    in ``$…$`` and compares it with the gold via ``verify(gold, pred)`` (order matters). A timeout or
    a dead worker is a failed verdict with the reason in the evidence; the caller never hangs.
    Departure: math-verify's own extraction over the whole text is not used (it may pick an
    intermediate expression); our extraction decides what the final answer is.
    """

    name = "math"
    version = "1"

    class Config(_AnswerConfig):
        timeout_s: float = Field(5.0, gt=0, description="Longest a single comparison may take.")
        workers: int = Field(1, ge=1, le=64, description=(
            "math-verify worker processes (shared, grown on demand)."))

    def __init__(self, **kw: Any) -> None:
        self.config = self.Config(**kw)

    def prepare(self, workers: int) -> None:
        from ._mathpool import math_pool

        math_pool(max(workers, self.config.workers))

    @staticmethod
    def _wrap(s: str) -> str:
        s = s.strip()
        return s if "$" in s or "\\boxed" in s else f"${s}$"

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict:
        from ._mathpool import math_pool

        t0 = time.perf_counter()
        if answer is None:
            return _no_gold(self.name)
        if (cut := _truncated_verdict(self.config, answer, context, t0)) is not None:
            return cut
        pred, how, ev = _final_answer(self.config, completion, context)
        ev.update(extracted=pred, extraction=how, gold=answer)
        if pred is None:
            ev["reason"] = "no answer found"
            return Verdict(False, 0.0, ev, time.perf_counter() - t0)
        chk = math_pool(self.config.workers).check(self._wrap(str(answer)), self._wrap(pred), self.config.timeout_s)
        ev.update(parsed_gold=chk.parsed_gold, parsed_pred=chk.parsed_pred, status=chk.status)
        if chk.error:
            ev["reason"] = chk.error
        elif not chk.equal:
            ev["reason"] = "not equivalent to the gold answer"
        return Verdict(chk.equal, float(chk.equal), ev, time.perf_counter() - t0)


def normalize_tests(tests: Any) -> tuple[str, list[Any]]:
    """Code tests in one of the accepted shapes → ``(kind, items)``.

    Accepted: a list of assert statements (``["assert f(1) == 2", …]``); ``{"asserts": [...]}``;
    ``{"cases": [{"input": "...", "output": "..."}, …]}`` (stdin/stdout); or APPS-style
    ``{"inputs": [...], "outputs": [...]}``. A JSON string of any of these is accepted too.
    """
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError:
            tests = [tests]  # a single assert block
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        return "assert", list(tests)
    if isinstance(tests, dict):
        if "asserts" in tests:
            return "assert", [str(t) for t in tests["asserts"]]
        if "cases" in tests:
            return "stdio", [{"input": str(c["input"]), "output": str(c["output"])} for c in tests["cases"]]
        if "inputs" in tests and "outputs" in tests:
            if len(tests["inputs"]) != len(tests["outputs"]):
                raise ValueError("code tests: `inputs` and `outputs` differ in length")
            return "stdio", [{"input": str(i), "output": str(o)} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    raise ValueError(
        "code tests must be a list of assert strings, {'asserts': [...]}, {'cases': [{'input','output'}...]} "
        f"or {{'inputs': [...], 'outputs': [...]}}; got {type(tests).__name__}"
    )


_CODE_BLOCK = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last fenced Python code block of a completion, else the whole completion."""
    blocks = _CODE_BLOCK.findall(completion)
    return blocks[-1] if blocks else completion


class CodeVerifier:
    """Runs the completion's code against unit tests in the sandbox; CodeRL/RLTF-shaped reward.

    Reward (CodeRL arXiv 2207.01780, RLTF arXiv 2307.04349): compile error −1, runtime error −0.6
    (any test raising or timing out, or the program killed by a limit), failing tests
    −0.3 + 1.3 × pass_ratio, all pass +1. Evidence: error type, per-test outcomes, the first failing
    test and the sandbox isolation used.
    """

    name = "code"
    version = "2"

    class Config(StrictModel):
        timeout_per_test_s: float = Field(2.0, gt=0, description="Per-test time limit inside the sandbox.")
        allow_truncated: bool = Field(False, description=(
            "Run the tests of generations cut by the token limit (finish_reason length/abort). Off: they are "
            "never verified."))
        sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description=(
            "Sandbox limits and isolation."))

    def __init__(self, **kw: Any) -> None:
        self.config = self.Config(**kw)

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict:
        t0 = time.perf_counter()
        if tests is None:
            return Verdict(None, 0.0, {"error": "no tests: the code verifier needs `tests`"})
        cut = truncation(context)
        if cut is not None and not self.config.allow_truncated:
            ev0 = {"status": "truncated", "finish_reason": cut,
                   "reason": f"truncated generation (finish_reason={cut}); not verified unless allow_truncated"}
            return Verdict(False, coderl_reward("runtime_error"), ev0, time.perf_counter() - t0)
        kind, items = normalize_tests(tests)
        if not items:
            return Verdict(None, 0.0, {"error": "empty test list"})
        nonce = f"@@gfcr-{uuid.uuid4().hex}@@"
        spec = {"kind": kind, "tests": items, "timeout_s": self.config.timeout_per_test_s, "nonce": nonce}
        sb = self.config.sandbox
        # each test may time out and cost a reload of the solution in a fresh child
        wall = min(sb.wall_s, self.config.timeout_per_test_s * (2 * len(items) + 1) + 5.0)
        sb = sb.model_copy(update={"wall_s": wall})
        files = {"solution.py": extract_code(completion), "tests.json": json.dumps(spec),
                 "child.py": CODE_CHILD.read_text()}
        res = run_python(CODE_HARNESS.read_text(), config=sb, files=files)
        report = None
        for line in reversed(res.stdout.splitlines()):
            if line.startswith(nonce):
                report = json.loads(line[len(nonce) :])
                break
        ev: dict[str, Any] = {"isolation": res.isolation, "kind": kind, "n_tests": len(items)}
        if report is None:
            if res.timed_out:
                why = f"wall-clock timeout after {wall:.1f}s"
            elif res.signal:
                why = f"killed by {res.signal} (a resource limit)"
            else:
                why = f"program exited (code {res.returncode}) before the tests finished"
            ev.update(status="runtime_error", error_type="runtime_error", error=why, stderr=res.stderr[-500:])
            return Verdict(False, coderl_reward("runtime_error"), ev, time.perf_counter() - t0)
        status = report["status"]
        results = report.get("results", [])
        ratio = sum(r == "pass" for r in results) / len(items)
        ev.update(
            status=status,
            error_type=None if status == "passed" else status,
            results=results,
            pass_ratio=ratio,
            first_failure=report.get("first_failure"),
            decided_by_harness=report.get("decided_by_harness", 0),
        )
        if report.get("error"):
            ev["error"] = report["error"]
        return Verdict(status == "passed", coderl_reward(status, ratio), ev, time.perf_counter() - t0)


class EnvVerifier:
    """The success signal of a multi-turn environment, read from the rollout (signals, then meta)."""

    name = "env"
    version = "1"

    class Config(StrictModel):
        key: str = Field("env_success", description=(
            "Key in rollout.signals or rollout.meta holding success (bool/0-1)."))
        threshold: float = Field(0.5, description="passed when the value is >= threshold.")

    def __init__(self, **kw: Any) -> None:
        self.config = self.Config(**kw)

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict:
        key = self.config.key
        value = context.get(key)
        rollout = context.get("rollout")
        if value is None and rollout is not None:
            value = rollout.signals.get(key, rollout.meta.get(key))
        if value is None:
            return Verdict(None, 0.0, {"error": f"no environment success value under {key!r}"})
        v = float(value)
        return Verdict(v >= self.config.threshold, v, {key: v})


class CompositeVerifier:
    """Weighted combination: score = Σ wᵢ·scoreᵢ; passed = all parts that could judge passed."""

    name = "composite"
    version = "1"

    class Part(StrictModel):
        name: str = Field(description="Verifier name in VERIFIERS.")
        weight: float = Field(1.0, description="Weight of this part's score.")
        params: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("params", "options"),
                                       description=("Keyword config of that verifier "
                                                    "(`options`: its old name)."))

        @model_validator(mode="before")
        @classmethod
        def _renamed(cls, data: Any) -> Any:
            return note_renamed(data, {"options": "params"}, "composite.parts[]")

    class Config(StrictModel):
        parts: list[CompositeVerifier.Part] = Field(min_length=1, description="The verifiers combined.")

    def __init__(self, **kw: Any) -> None:
        self.config = self.Config(**kw)
        self.parts = [(get_verifier(p.name, **p.params), p.weight) for p in self.config.parts]

    def prepare(self, workers: int) -> None:
        for v, _ in self.parts:
            if hasattr(v, "prepare"):
                v.prepare(workers)

    def verify(self, completion: str, answer: str | None = None, tests: Any = None, **context: Any) -> Verdict:
        t0 = time.perf_counter()
        verdicts = [(v.name, w, v.verify(completion, answer, tests, **context)) for v, w in self.parts]
        judged = [d.passed for _, _, d in verdicts if d.passed is not None]
        passed = all(judged) if judged else None
        score = sum(w * d.score for _, w, d in verdicts)
        ev = {"parts": [{"name": n, "weight": w, **d.to_dict()} for n, w, d in verdicts]}
        return Verdict(passed, score, ev, time.perf_counter() - t0)


CompositeVerifier.Config.model_rebuild()

#: name → class. Add your own with ``VERIFIERS["mine"] = MyVerifier`` (any class following Verifier).
VERIFIERS: dict[str, type] = {
    "math": MathVerifier,
    "exact": ExactVerifier,
    "numeric": NumericVerifier,
    "format": FormatVerifier,
    "code": CodeVerifier,
    "env": EnvVerifier,
    "composite": CompositeVerifier,
}

VerifierName = Literal["math", "exact", "numeric", "format", "code", "env", "composite"]


def get_verifier(name: str, **config: Any) -> Verifier:
    """Build the verifier registered as ``name`` with its keyword config (unknown keys refused)."""
    try:
        cls = VERIFIERS[name]
    except KeyError:
        raise ValueError(f"unknown verifier {name!r}; known: {', '.join(sorted(VERIFIERS))}") from None
    return cls(**config)
