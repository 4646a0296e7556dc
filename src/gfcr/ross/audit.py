"""ROSS select → audit → align over a rollout store.

- :func:`select_rollouts`: verified-successful rollouts in a window (run, step range, task),
  optionally re-verified, deduplicated by (prompt, assistant text).
- :func:`audit_rollouts`: for each rollout, number its units, ask the judge, validate the verdict
  strictly (retrying with the error fed back, then discarding with the reason), align the kept
  characters to the stored tokens and write one :class:`~gfcr.records.Audit` per rollout to the
  store's ``audits`` table, keyed by (rollout_id, judge, judge_version). Rollouts that already have
  a ``kept`` or ``discarded`` audit for this judge and version are skipped, so re-running resumes;
  ``error`` rows (judge unreachable) are retried. Audits are written in batches, so a crash loses
  at most one batch of judge calls.
- :func:`realign`: recompute stored audits' masks and TER from their excluded spans (the
  ``align`` stage on its own, e.g. after a tokenizer fix).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from gfcr.records import (
    Audit,
    Cost,
    Prompt,
    Rollout,
    assistant_text,
    assistant_text_ranges,
    table_to_audits,
    table_to_rollouts,
)
from gfcr.ross.align import AlignError, align_mask
from gfcr.ross.judges import Judge, JudgeRequest, Turn
from gfcr.ross.units import split_units
from gfcr.ross.verdict import (
    MAX_REPLY_CHARS,
    Decision,
    VerdictError,
    kept_ends_with_answer,
    parse_json_object,
    validate_verdict,
)

_ANSWER_KEYS = ("answer", "parsed", "extracted", "pred", "prediction", "parsed_answer")


def verified_answer(rollout: Rollout, prompt: Prompt | None) -> str | None:
    """The final answer the verifier accepted: from the rollout's verifier evidence when it names
    one (keys ``answer``/``parsed``/``extracted``…, top level or under ``evidence``), else the
    prompt's gold answer."""
    v = rollout.verifier or {}
    for scope in (v.get("evidence") if isinstance(v.get("evidence"), dict) else {}, v):
        for k in _ANSWER_KEYS:
            x = scope.get(k)
            if isinstance(x, str | int | float) and not isinstance(x, bool) and str(x).strip():
                return str(x).strip()
    if prompt is not None and prompt.answer is not None and str(prompt.answer).strip():
        return str(prompt.answer).strip()
    return None


def _prompt_text(rollout: Rollout, prompt: Prompt | None) -> str:
    msgs = prompt.messages if prompt is not None else [m for m in rollout.messages if m.role != "assistant"]
    return "\n".join(m.content for m in msgs if m.role in ("system", "user"))


def select_rollouts(
    store: Any,
    run: str | None = None,
    steps: tuple[int, int] | None = None,
    task: str | None = None,
    reverify: Callable[[Rollout, Prompt | None], bool] | None = None,
    dedup: bool = True,
    limit: int | None = None,
) -> list[Rollout]:
    """Verified-successful rollouts of the window, oldest step first.

    ``reverify(rollout, prompt) -> bool`` re-checks each one (default: trust the stored
    ``verified``). ``dedup`` keeps the first of rollouts with the same prompt and identical
    assistant text. ``limit`` caps the result (after dedup).
    """
    rs = store.rollouts(run=run, steps=steps, verified=True, task=task)
    rs.sort(key=lambda r: (r.step, r.prompt_id, r.sample_index, r.rollout_id))
    if reverify is not None:
        prompts = {p.prompt_id: p for p in store.prompts(ids=sorted({r.prompt_id for r in rs}))} if rs else {}
        rs = [r for r in rs if reverify(r, prompts.get(r.prompt_id))]
    if dedup:
        seen: set[tuple[str, str]] = set()
        out = []
        for r in rs:
            key = (r.prompt_id, r.completion)
            if key not in seen:
                seen.add(key)
                out.append(r)
        rs = out
    return rs[:limit] if limit is not None else rs


def judge_request(rollout: Rollout, prompt: Prompt | None, mode: str, max_unit_chars: int = 200,
                  check_answer: bool = True) -> tuple[JudgeRequest, list[tuple[int, int]]]:
    """The judge's view of one rollout and the assistant turns' char ranges (``bounds``).

    Units are split per assistant turn (none crosses a tool or environment turn). ``turns`` is
    the whole interaction in order with roles; only assistant turns carry unit numbers."""
    text, bounds = assistant_text_ranges(rollout.messages)
    units = split_units(text, max_unit_chars, bounds=bounds)
    answer = verified_answer(rollout, prompt) if check_answer else None
    turns: list[Turn] = []
    k = 0
    seg_end = [bounds[i + 1][0] if i + 1 < len(bounds) else len(text) for i in range(len(bounds))]
    for m in rollout.messages:
        if m.role == "assistant":
            lo, hi = (bounds[k][0] if k else 0), seg_end[k]
            turns.append(Turn("assistant", m.content, [u.number for u in units if lo <= u.start < hi]))
            k += 1
        else:
            turns.append(Turn(m.role, m.content))
    req = JudgeRequest(
        rollout_id=rollout.rollout_id, task=rollout.task, prompt=_prompt_text(rollout, prompt), text=text,
        units=units, mode=mode, answer=answer,
        evidence=rollout.verifier if isinstance(rollout.verifier, dict) else {}, turns=turns,
    )
    return req, bounds


def _shown_text(req: JudgeRequest) -> str:
    """Everything of the rollout the judge is shown (task, every turn): a verdict object copied
    verbatim from it is refused (:func:`gfcr.ross.verdict.parse_json_object`)."""
    return "\n".join([req.prompt, req.text, *(t.text for t in req.turns)])


def safe_text(s: str | None, limit: int | None = None) -> str | None:
    """``s`` made storable: each lone surrogate (invalid in UTF-8; a JSON ``"\\ud800"`` escape
    decodes to one) written as its ``\\udXXX`` escape, and, with ``limit``, at most ``limit``
    characters plus a note of how many were cut. Valid text is returned unchanged.

    Example: ``safe_text("a\\ud800b")`` → ``"a\\\\ud800b"`` (the six characters ``\\ud800``)."""
    if s is None:
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(s) > limit:
        s = s[:limit] + f"…[{len(s) - limit} more characters not stored]"
    return s


def _ask(call: Any, req: JudgeRequest, retries: int, bounds: list[tuple[int, int]], raws: list[str],
         cost: list[Cost]) -> tuple[Decision | None, dict[str, Any] | None, str | None]:
    """Call ``call(feedback)`` until its output validates (at most ``retries + 1`` times)."""
    feedback: str | None = None
    for _ in range(retries + 1):
        reply = call(feedback)
        raws.append(reply.raw)
        c = cost[0]
        cost[0] = Cost(c.prompt_tokens + reply.cost.prompt_tokens, c.gen_tokens + reply.cost.gen_tokens,
                       c.latency_s + reply.cost.latency_s)
        try:
            obj = parse_json_object(reply.raw, forbidden=_shown_text(req))
            return validate_verdict(obj, req.text, req.units, req.mode, req.answer, bounds), obj, None
        except VerdictError as e:
            feedback = str(e)
    return None, None, feedback


def judge_rollout(
    rollout: Rollout, prompt: Prompt | None, judge: Judge, retries: int = 2, max_unit_chars: int = 200,
    check_answer: bool = True,
) -> tuple[Decision | None, str | None, list[str], Cost, dict[str, Any]]:
    """Ask ``judge`` about one rollout; validate; retry with the error fed back. When the judge
    has ``recheck`` on, a usable verdict goes to its independent re-check call, whose (validated)
    answer replaces it: it may confirm, revise the boundaries or discard. A re-check that never
    validates discards the rollout (its reason says so).

    Returns ``(decision or None, last error, raw outputs, summed cost, meta)``; ``meta["recheck"]``
    records whether the re-check ran and what it changed.
    """
    req, bounds = judge_request(rollout, prompt, judge.mode, max_unit_chars, check_answer)
    raws: list[str] = []
    cost = [Cost()]
    meta: dict[str, Any] = {"n_units": len(req.units), "mode": judge.mode, "answer": req.answer}
    dec, obj, err = _ask(lambda fb: judge.respond(req, fb), req, retries, bounds, raws, cost)
    meta["attempts"] = len(raws)
    if dec is not None and dec.status == "kept" and getattr(judge, "recheck", False):
        first = dec
        dec, _, err = _ask(lambda fb: judge.recheck_call(req, obj, fb), req, retries, bounds, raws, cost)
        if dec is None:
            err = f"re-check: {err}"
        meta["recheck"] = {
            "attempts": len(raws) - meta["attempts"],
            "outcome": ("invalid" if dec is None else "discarded" if dec.status == "discarded"
                        else "confirmed" if np.array_equal(dec.kept_chars, first.kept_chars)
                        and [(s.start, s.end, s.category) for s in dec.excluded]
                        == [(s.start, s.end, s.category) for s in first.excluded] else "revised"),
            "first_excluded": [s.to_dict() for s in first.excluded],
        }
    return dec, err, raws, cost[0], meta


#: end-of-sequence rules (:func:`make_audit`)
EOS_RULES = ("after-answer", "neighbours")


def _final_eos(rollout: Rollout, kept_chars: np.ndarray, answer: str | None, eos_rule: str) -> bool:
    if eos_rule not in EOS_RULES:
        raise ValueError(f"eos_rule must be one of {EOS_RULES}, got {eos_rule!r}")
    if eos_rule == "neighbours":
        return False
    text, bounds = assistant_text_ranges(rollout.messages)
    return kept_ends_with_answer(text, kept_chars, answer, bounds)


def make_audit(
    rollout: Rollout, decision: Decision | None, error: str | None, tokenizer: Any, judge: Judge,
    raws: Sequence[str], cost: Cost, meta: dict[str, Any], eos_rule: str = "after-answer",
) -> Audit:
    """The audit row: a kept decision aligned to the stored tokens, or a discard with its reason.

    End-of-sequence rule (issue 28). ``"after-answer"`` (default): the eos closing the last
    assistant turn is supervised when the kept text ends on the line stating the verified final
    answer (:func:`gfcr.ross.verdict.kept_ends_with_answer`), even when excluded trailing text lies
    between them, so ROSS teaches the model to stop once the answer is given; otherwise, and
    always without a known answer, the neighbours rule. ``"neighbours"`` (the former rule): a
    zero-width token is supervised only when the characters on both sides of it are kept, so an
    eos after excluded chatter never is. Departure: the paper does not say how it treats the
    eos; this is gfcr's choice."""
    n = len(rollout.token_ids)
    final_eos = _final_eos(rollout, decision.kept_chars, meta.get("answer"), eos_rule) \
        if decision is not None and decision.status == "kept" else False
    meta = {**meta, "step": int(rollout.step), "task": rollout.task, "prompt_id": rollout.prompt_id,
            "n_generated": rollout.n_generated, "eos_rule": eos_rule}
    common = dict(rollout_id=rollout.rollout_id, judge=judge.name, judge_version=judge.version,
                  raw_output=safe_text(raws[-1], MAX_REPLY_CHARS) if raws else None, cost=cost)
    if decision is None:
        what = "invalid re-check output" if (error or "").startswith("re-check: ") else "invalid judge output"
        return Audit(status="discarded", reason=safe_text(f"{what} after {len(raws)} attempt(s): {error}"),
                     mask=np.zeros(n, np.uint8), meta=meta, **common)
    if decision.status == "discarded":
        return Audit(status="discarded", reason=safe_text(decision.reason), mask=np.zeros(n, np.uint8), meta=meta,
                     **common)
    try:
        mask = align_mask(tokenizer, rollout.token_ids, rollout.token_role, rollout.messages, decision.kept_chars,
                          final_eos=final_eos)
    except AlignError as e:
        return Audit(status="discarded", reason=f"alignment: {e}", mask=np.zeros(n, np.uint8),
                     excluded=decision.excluded, meta=meta, **common)
    n_gen = rollout.n_generated
    n_sup = int(mask.sum())
    if n_sup == 0:
        return Audit(status="discarded", reason="alignment: no generated token lies wholly inside kept text",
                     mask=mask, excluded=decision.excluded, meta=meta, **common)
    meta["n_supervised"] = n_sup
    meta["eos_supervised"] = _eos_supervised(rollout, mask, tokenizer)
    meta["categories"] = dict(Counter(s.category for s in decision.excluded))
    return Audit(status="kept", mask=mask, excluded=decision.excluded, ter=1.0 - n_sup / max(n_gen, 1),
                 meta=meta, **common)


def _eos_supervised(rollout: Rollout, mask: np.ndarray, tokenizer: Any) -> bool | None:
    """Whether the last generated token is supervised, when it is a special (eos) token."""
    gen = np.flatnonzero(np.asarray(rollout.token_role) == 1)
    if not gen.size or int(rollout.token_ids[gen[-1]]) not in set(getattr(tokenizer, "all_special_ids", []) or []):
        return None
    return bool(mask[gen[-1]])


@dataclass
class AuditSummary:
    """What one audit pass did. ``cost`` sums judge cost over the newly audited rollouts."""

    judge: str
    judge_version: str
    audited: int = 0
    skipped: int = 0
    status: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    cost: Cost = field(default_factory=Cost)
    mean_ter: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"judge": self.judge, "judge_version": self.judge_version, "audited": self.audited,
                "skipped": self.skipped, "status": dict(self.status), "reasons": dict(self.reasons.most_common(10)),
                "cost": self.cost.to_dict(), "mean_ter": self.mean_ter}


def finished_ids(store: Any, judge: str, judge_version: str, rollout_ids: Sequence[str] | None = None) -> set[str]:
    """Rollouts with a ``kept`` or ``discarded`` audit for this judge and version."""
    t = store.audits(judge=judge, rollout_ids=rollout_ids)
    if t.num_rows == 0:
        return set()
    d = t.select(["rollout_id", "judge_version", "status"]).to_pylist()
    return {r["rollout_id"] for r in d if r["judge_version"] == judge_version and r["status"] in ("kept", "discarded")}


def _error_audit(rollout_id: str, judge: str, judge_version: str, n_tokens: int, reason: str) -> Audit:
    return Audit(rollout_id=rollout_id, judge=judge, judge_version=judge_version, status="error",
                 reason=safe_text(reason, 2000), mask=np.zeros(n_tokens, np.uint8))


def _audit_one(r: Rollout, p: Prompt | None, judge: Judge, tokenizer: Any, retries: int, max_unit_chars: int,
               check_answer: bool, eos_rule: str) -> Audit:
    """One rollout's audit, never raising: a judge transport failure, or a reply or record that
    cannot be made into an audit, is an ``error`` row (retried on the next run)."""
    try:
        dec, err, raws, cost, meta = judge_rollout(r, p, judge, retries, max_unit_chars, check_answer)
    except Exception as e:  # judge transport failures
        return _error_audit(r.rollout_id, judge.name, judge.version, len(r.token_ids),
                            f"judge call failed: {type(e).__name__}: {e}")
    try:
        return make_audit(r, dec, err, tokenizer, judge, raws, cost, meta, eos_rule).validate()
    except Exception as e:  # one unusable reply never loses the batch
        return _error_audit(r.rollout_id, judge.name, judge.version, len(r.token_ids),
                            f"audit could not be built: {type(e).__name__}: {e}")


def _write_batch(store: Any, buf: Sequence[Audit]) -> None:
    """Upsert ``buf``; if the store refuses the batch, write its rows one by one and each refused
    row as an ``error`` row (retried next run), so one bad row never loses the others."""
    if not buf:
        return
    try:
        store.upsert_audits(list(buf))
    except (UnicodeError, ValueError, TypeError, pa.ArrowException):
        for a in buf:
            try:
                store.upsert_audits([a])
            except (UnicodeError, ValueError, TypeError, pa.ArrowException) as e:
                store.upsert_audits([_error_audit(a.rollout_id, a.judge, a.judge_version, len(a.mask),
                                                  f"audit not stored: {e}")])


def audit_rollouts(
    store: Any,
    rollouts: Iterable[Rollout],
    judge: Judge,
    tokenizer: Any,
    retries: int = 2,
    concurrency: int = 1,
    batch_size: int = 64,
    max_unit_chars: int = 200,
    check_answer: bool = True,
    progress: bool = False,
    eos_rule: str = "after-answer",
) -> AuditSummary:
    """Audit ``rollouts`` with ``judge`` and upsert the audits (see module doc). Resumable.
    ``eos_rule``: the end-of-sequence rule of :func:`make_audit`."""
    if eos_rule not in EOS_RULES:
        raise ValueError(f"eos_rule must be one of {EOS_RULES}, got {eos_rule!r}")
    rs = list(rollouts)
    summary = AuditSummary(judge.name, judge.version)
    done = finished_ids(store, judge.name, judge.version, [r.rollout_id for r in rs]) if rs else set()
    todo = [r for r in rs if r.rollout_id not in done]
    summary.skipped = len(rs) - len(todo)
    if not todo:
        return summary
    prompts = {p.prompt_id: p for p in store.prompts(ids=sorted({r.prompt_id for r in todo}))}

    def one(r: Rollout) -> Audit:
        return _audit_one(r, prompts.get(r.prompt_id), judge, tokenizer, retries, max_unit_chars, check_answer,
                          eos_rule)

    ters: list[float] = []
    buf: list[Audit] = []

    def flush() -> None:
        _write_batch(store, buf)
        buf.clear()

    bar = _progress(progress, len(todo), f"audit [{judge.name}]")
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
        results = ex.map(one, todo) if concurrency > 1 else map(one, todo)
        for a in results:
            buf.append(a)
            summary.audited += 1
            summary.status[a.status] += 1
            if a.reason:
                summary.reasons[a.reason[:80]] += 1
            c = summary.cost
            summary.cost = Cost(c.prompt_tokens + a.cost.prompt_tokens, c.gen_tokens + a.cost.gen_tokens,
                                c.latency_s + a.cost.latency_s)
            if a.ter is not None:
                ters.append(a.ter)
            if len(buf) >= batch_size:
                flush()
            bar.advance()
    flush()
    bar.close()
    summary.mean_ter = float(np.mean(ters)) if ters else None
    return summary


def realign(store: Any, tokenizer: Any, judge: str, judge_version: str,
            eos_rule: str = "after-answer") -> dict[str, int]:
    """Recompute masks and TER of the stored ``kept`` audits from their excluded spans, with the
    end-of-sequence rule ``eos_rule`` (:func:`make_audit`; the answer is the one the audit recorded)."""
    t = store.audits(judge=judge)
    aus = [a for a in table_to_audits(t) if a.judge_version == judge_version and a.status == "kept"] if t.num_rows else []
    if not aus:
        return {"realigned": 0, "discarded": 0}
    rmap = {r.rollout_id: r for r in table_to_rollouts(store.get([a.rollout_id for a in aus]))}
    out, n_disc = [], 0
    for a in aus:
        r = rmap[a.rollout_id]
        text = assistant_text(r.messages)
        kept = np.ones(len(text), bool)
        for s in a.excluded:
            kept[s.start : s.end] = False
        try:
            mask = align_mask(tokenizer, r.token_ids, r.token_role, r.messages, kept,
                              final_eos=_final_eos(r, kept, a.meta.get("answer"), eos_rule))
            a.mask, a.ter = mask, 1.0 - int(mask.sum()) / max(r.n_generated, 1)
            a.meta = {**a.meta, "eos_rule": eos_rule, "eos_supervised": _eos_supervised(r, mask, tokenizer)}
        except AlignError as e:
            a.status, a.reason, a.mask, a.ter = "discarded", f"alignment: {e}", np.zeros(len(r.token_ids), np.uint8), None
            n_disc += 1
        out.append(a)
    store.upsert_audits(out)
    return {"realigned": len(out) - n_disc, "discarded": n_disc}


def load_kept(store: Any, judge: str, judge_version: str | None = None) -> tuple[list[Audit], dict[str, Rollout]]:
    """Kept audits of ``judge`` (the only stored version if ``judge_version`` is None) and their rollouts."""
    t = store.audits(judge=judge)
    aus = table_to_audits(t) if t.num_rows else []
    versions = sorted({a.judge_version for a in aus})
    if judge_version is None:
        if len(versions) > 1:
            raise ValueError(f"judge {judge!r} has audits of several versions {versions}; pass judge_version")
        judge_version = versions[0] if versions else None
    aus = [a for a in aus if a.judge_version == judge_version and a.status == "kept"]
    if not aus:
        return [], {}
    tab = store.get([a.rollout_id for a in aus])
    rmap = {r.rollout_id: r for r in table_to_rollouts(tab)}
    aus.sort(key=lambda a: a.rollout_id)
    return aus, rmap


class _NoBar:
    def advance(self) -> None: ...

    def close(self) -> None: ...


class _RichBar:
    def __init__(self, total: int, desc: str):
        from rich.console import Console
        from rich.progress import Progress

        self.p = Progress(transient=True, console=Console(stderr=True))  # stdout stays for results
        self.p.start()
        self.t = self.p.add_task(desc, total=total)

    def advance(self) -> None:
        self.p.advance(self.t)

    def close(self) -> None:
        self.p.stop()


def _progress(enabled: bool, total: int, desc: str) -> _NoBar | _RichBar:
    return _RichBar(total, desc) if enabled else _NoBar()
