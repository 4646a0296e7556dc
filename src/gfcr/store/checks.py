"""Rollout health checks: per-record faults in what a store holds, each with its evidence.

A detector (:mod:`gfcr.diagnose.detectors`) reads the per-step metrics and names a training
pathology; a health check reads single records and names a fault in the data itself, the kind
that silently poisons a training step. Each check returns evidence (the rollout, what was seen,
the numbers), never a verdict on whether an answer is correct:

* ``runaway`` — hit the length cap (``finish_reason = "length"``) while repeating: the last
  ``ngram`` generated tokens occur ``min_repeats`` times or more among the generated tokens (the
  n-gram count of the repetition early exit, :func:`gfcr.control.groups.tail_ngram_count`).
* ``zero_completion`` — no generated token (``token_role`` holds no 1) in a row that has tokens,
  or, in a token-less import, no assistant text.
* ``token_text_mismatch`` — the generated token ids do not decode to the stored assistant text
  (each run of generated tokens decoded with ``skip_special_tokens``, whitespace collapsed, against
  the assistant turns joined the same way; a decoded run must appear in the text in order). Needs
  a tokenizer: the one given, else the store's model from local files
  (:func:`gfcr.diagnose.tokenizer.resolve_tokenizer`); without one the check is skipped and the
  report says why.
* ``empty_turn`` — an episode with no assistant turn, or a turn whose content is empty and that
  carries no tool call. Rows stored without any text (a token-only import with no tokenizer) are
  not judged: their turns are unknown, not missing.
* ``tool_no_observation`` — an assistant turn with a tool call that no ``tool`` turn follows.
* ``logprob_mismatch`` — sampler vs trainer log-probs, where both are stored: the behaviour
  log-probs (``logprobs``) against the trainer's recomputation of the same tokens
  (:func:`trainer_logprobs`), over generated tokens: fires when the mean |Δ| ≥
  ``max_gap_mean`` or any |Δ| ≥ ``max_gap``. The gap is what truncated importance sampling
  corrects (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
  training"); the thresholds are ours.

The scan reads only the columns the checks need, in batches (``batch_size`` rows), so memory stays
bounded; each batch is screened column-wise and only flagged rows reach Python; ``max_issues`` caps
the evidence kept per check (the counts stay exact); the token/text check decodes at most
``max_decode`` rows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from gfcr.config import StrictModel

CHECKS = ("runaway", "zero_completion", "token_text_mismatch", "empty_turn", "tool_no_observation",
          "logprob_mismatch")
TITLES = {
    "runaway": "Runaway generation (hit the length cap while repeating)",
    "zero_completion": "Zero completion tokens",
    "token_text_mismatch": "Token ids that do not decode to the stored text",
    "empty_turn": "Missing or empty turns",
    "tool_no_observation": "Tool call with no observation after it",
    "logprob_mismatch": "Sampler / trainer log-prob mismatch",
}
COLUMNS = ["rollout_id", "run_id", "step", "finish_reason", "token_ids", "token_role", "logprobs", "messages",
           "tokens_source", "meta"]


class HealthConfig(StrictModel):
    """Thresholds of the health checks."""

    ngram: int = Field(16, ge=1, description="runaway: length of the tail n-gram counted")
    min_repeats: int = Field(4, ge=2, description="runaway: the tail n-gram occurs at least this often")
    max_gap_mean: float = Field(0.1, gt=0, description="logprob_mismatch: mean |sampler − trainer| log-prob (nats) over generated tokens")
    max_gap: float = Field(2.0, gt=0, description="logprob_mismatch: or any one token's |gap| (nats)")
    max_issues: int = Field(50, ge=0, description="evidence kept per check (the counts are exact)")
    batch_size: int = Field(50_000, ge=1, description="rows read per batch")
    max_decode: int = Field(5_000, ge=0, description="token/text check: decode at most this many rows (decoding is the slow part)")


@dataclass
class HealthIssue:
    """One fault in one rollout: which check, where, what was seen."""

    check: str
    rollout_id: str
    run_id: str
    step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HealthReport:
    """What the checks found: ``counts`` per check (exact), ``issues`` (up to ``max_issues`` per
    check), ``checked`` (rows each check looked at) and ``skipped`` (check → why it did not run)."""

    counts: dict[str, int]
    checked: dict[str, int]
    issues: list[HealthIssue]
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "checked": self.checked, "skipped": self.skipped,
                "issues": [i.to_dict() for i in self.issues]}


# ---------------------------------------------------------------------------------------------
# Pure checks over one record
# ---------------------------------------------------------------------------------------------


def tail_ngram_count(tokens: np.ndarray, n: int) -> int:
    """How often the last ``n``-gram of ``tokens`` occurs in ``tokens`` (overlaps counted): the
    count of the repetition early exit (:func:`gfcr.control.groups.tail_ngram_count`, which the
    store room may not import; a test checks the two agree).

    Shapes: ``[T]`` → int; 0 when T < n. Example: [1, 2, 1, 2, 1, 2], n = 2 → 3."""
    t = np.asarray(tokens)
    if n <= 0 or t.size < n:
        return 0
    win = np.lib.stride_tricks.sliding_window_view(t, n)
    return int(np.count_nonzero(np.all(win == t[-n:], axis=1)))


def runaway(token_ids: np.ndarray, token_role: np.ndarray, finish_reason: str | None, ngram: int = 16,
            min_repeats: int = 4) -> dict[str, Any] | None:
    """Evidence of a runaway generation, or None.

    ``token_ids``, ``token_role`` ``[T]``. Only a row stopped by the length cap counts; the
    generated tokens (role 1) must end in an ``ngram``-gram that occurs ``min_repeats``+ times.
    Example: finish "length", generated [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6, 7], ngram 3, min 4 →
    {"repeats": 4, "ngram": 3, "tail": [5, 6, 7], "gen_tokens": 12}.
    """
    if finish_reason != "length":
        return None
    gen = np.asarray(token_ids)[np.asarray(token_role) == 1]
    n = ngram
    if len(gen) < n * min_repeats:
        return None
    reps = tail_ngram_count(gen, n)
    if reps < min_repeats:
        return None
    return {"repeats": int(reps), "ngram": int(n), "tail": gen[-n:].tolist(), "gen_tokens": int(len(gen))}


def empty_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The missing or empty turns of an episode: ``[{"turn", "role", "problem"}]``.

    Example: [user "q", assistant ""] → [{"turn": 1, "role": "assistant", "problem": "empty content, no tool call"}];
    [user "q"] → [{"turn": None, "role": "assistant", "problem": "no assistant turn"}].
    """
    out: list[dict[str, Any]] = []
    if not any(m.get("role") == "assistant" for m in messages):
        out.append({"turn": None, "role": "assistant", "problem": "no assistant turn"})
    for i, m in enumerate(messages):
        if not (m.get("content") or "").strip() and not m.get("tool_calls"):
            out.append({"turn": i, "role": m.get("role"), "problem": "empty content, no tool call"})
    return out


def _n_calls(tool_calls: str | None) -> int:
    if not tool_calls:
        return 0
    try:
        v = json.loads(tool_calls)
    except json.JSONDecodeError:
        return 1
    return len(v) if isinstance(v, list) else 1


def unanswered_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant turns whose tool calls no ``tool`` turn answers before the next assistant turn
    (or the end): ``[{"turn", "calls", "observations"}]``.

    Example: [user, assistant(tool_calls=[a, b]), tool, assistant] → [{"turn": 1, "calls": 2, "observations": 1}];
    [user, assistant(tool_calls=[a])] → [{"turn": 1, "calls": 1, "observations": 0}].
    """
    out = []
    for i, m in enumerate(messages):
        calls = _n_calls(m.get("tool_calls")) if m.get("role") == "assistant" else 0
        if not calls:
            continue
        obs = 0
        for nxt in messages[i + 1:]:
            if nxt.get("role") == "tool":
                obs += 1
            elif nxt.get("role") == "assistant":
                break
        if obs < calls:
            out.append({"turn": i, "calls": calls, "observations": obs})
    return out


def trainer_logprobs(meta: dict[str, Any], n_tokens: int) -> np.ndarray | None:
    """The trainer's log-probs of a row's tokens, aligned with ``token_ids`` (``[T]``), or None.

    Sources, where the behaviour log-probs are stored as ``logprobs``: ``meta["trainer_logprobs"]``
    (a list of ``T`` floats), or a verl batch written by :mod:`gfcr.integrations.verl` whose
    ``logprobs`` came from ``rollout_log_probs`` and whose ``meta["verl"]["per_token"]`` keeps
    ``old_log_probs`` (the trainer's recomputation; response layout: the prompt's positions are
    prepended as 0). Example: meta {"trainer_logprobs": [0, -1.5]}, T 2 → [0.0, -1.5].
    """
    tl = meta.get("trainer_logprobs")
    if isinstance(tl, list) and len(tl) == n_tokens:
        return np.asarray(tl, float)
    v = meta.get("verl")
    if meta.get("logprobs_from") == "rollout_log_probs" and isinstance(v, dict):
        old = (v.get("per_token") or {}).get("old_log_probs")
        lay = (v.get("layout") or {}).get("old_log_probs")
        if isinstance(old, list):
            arr = np.asarray(old, float)
            if lay == "response":
                arr = np.concatenate([np.zeros(int(v.get("n_prompt", 0))), arr])
            if len(arr) == n_tokens:
                return arr
    return None


def logprob_gap(behaviour: np.ndarray, trainer: np.ndarray, token_role: np.ndarray) -> dict[str, float] | None:
    """Sampler − trainer log-prob gap over generated tokens: mean |Δ|, max |Δ| and where.

    All ``[T]``. Example: behaviour [0, -1, -2], trainer [0, -1.2, -1.0], role [0, 1, 1] →
    {"gap_mean": 0.6, "gap_max": 1.0, "at": 2, "n": 2}. No generated token → None.
    """
    gen = np.asarray(token_role) == 1
    if not gen.any():
        return None
    d = np.abs(np.asarray(behaviour, float) - np.asarray(trainer, float))
    d = np.where(gen & np.isfinite(d), d, 0.0)
    at = int(np.argmax(d))
    return {"gap_mean": float(d[gen].mean()), "gap_max": float(d[at]), "at": at, "n": int(gen.sum())}


def _norm(s: str) -> str:
    return " ".join(s.split())


def decode_mismatch(tokenizer: Any, token_ids: np.ndarray, token_role: np.ndarray,
                    messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Do the generated tokens decode to the stored assistant text? None when they do, else
    evidence: the decoded run that is not found, where, and the stored text near there.

    Each run of consecutive generated tokens is decoded on its own (``skip_special_tokens``,
    whitespace collapsed) and must occur in the assistant turns' joined text, in order.
    Example: text "The answer is 4", generated tokens decoding to "The answer is 5" →
    {"run": 0, "decoded": "The answer is 5", "stored": "The answer is 4", ...}.
    """
    role = np.asarray(token_role)
    ids = np.asarray(token_ids)
    text = _norm(" ".join(m.get("content") or "" for m in messages if m.get("role") == "assistant"))
    pos = 0
    starts = np.flatnonzero(np.diff(np.concatenate([[0], (role == 1).astype(np.int8), [0]])) == 1)
    ends = np.flatnonzero(np.diff(np.concatenate([[0], (role == 1).astype(np.int8), [0]])) == -1)
    for k, (a, b) in enumerate(zip(starts, ends, strict=True)):
        piece = _norm(tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=True))
        if not piece:
            continue
        j = text.find(piece, pos)
        if j < 0:
            return {"run": k, "tokens": [int(a), int(b)], "decoded": piece[:200], "stored": text[pos:pos + 200],
                    "stored_from": pos}
        pos = j + len(piece)
    return None


# ---------------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------------



def _flat(col: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """A list column's flat values, each value's row, and each row's length."""
    if isinstance(col, pa.ChunkedArray):  # one chunk as it is (combine_chunks copies even one)
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return pc.list_flatten(arr), np.repeat(np.arange(len(arr)), lengths), lengths


def tail_repeats(gen: np.ndarray, row: np.ndarray, n_rows: int, n: int, seed: int = 0) -> np.ndarray:
    """Per row, how often its last ``n``-gram occurs among its tokens (0 for rows shorter than n).

    ``gen`` ``[M]``: the generated tokens of many rows, flat; ``row`` ``[M]``: each token's row
    (non-decreasing). Vectorised :func:`gfcr.control.groups.tail_ngram_count`: every n-gram gets a
    random-weight 64-bit hash (``Σ w_t·x_(j+t)`` mod 2⁶⁴); a row counts its windows whose hash equals
    its tail window's (a collision is ~2⁻⁶⁴; flagged rows are re-counted exactly by the caller).
    Example: gen [1, 2, 1, 2, 1, 2 | 5, 6, 7], row [0]*6 + [1]*3, n 2 → [3, 1].
    """
    out = np.zeros(n_rows, np.int64)
    m = len(gen)
    if m < n:
        return out
    w = np.random.default_rng(seed).integers(1, 2**63, n, dtype=np.uint64) | np.uint64(1)
    x = gen.astype(np.uint64)
    k = m - n + 1
    h = np.zeros(k, np.uint64)
    with np.errstate(over="ignore"):
        for t in range(n):
            h += w[t] * x[t:t + k]
    valid = row[:k] == row[n - 1:]
    ends = np.flatnonzero(np.r_[row[1:] != row[:-1], True])  # last token of each present row
    starts_tail = ends - (n - 1)
    ok = (starts_tail >= 0) & (row[np.maximum(starts_tail, 0)] == row[ends])
    tail_h = np.zeros(n_rows, np.uint64)
    has_tail = np.zeros(n_rows, bool)
    tail_h[row[ends[ok]]] = h[starts_tail[ok]]
    has_tail[row[ends[ok]]] = True
    r = row[:k]
    hit = valid & has_tail[r] & (h == tail_h[r])
    out += np.bincount(r[hit], minlength=n_rows)
    return out


@dataclass
class Tally:
    """What the checks have found so far (shared by every batch of one pass)."""

    cfg: HealthConfig
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    checked: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    issues: list[HealthIssue] = field(default_factory=list)
    n_pairs: int = 0

    def add(self, check: str, row: dict[str, Any], message: str, evidence: dict[str, Any]) -> None:
        self.counts[check] += 1
        if self.kept[check] < self.cfg.max_issues:
            self.kept[check] += 1
            self.issues.append(HealthIssue(check, row["rollout_id"], row["run_id"], int(row["step"]), message, evidence))


def _rows(t: pa.Table, idx: np.ndarray) -> list[dict[str, Any]]:
    return t.take(pa.array(idx, pa.int64())).to_pylist() if len(idx) else []


def screen_batch(t: pa.Table, tally: Tally, tok: Any | None = None, record_checks: bool = True) -> None:
    """Run the checks over one batch of rows (at least :data:`COLUMNS`), adding to ``tally``.

    Long because: one pass per batch, whose flattened columns every check's screen shares.
    ``tok`` None skips the token/text check; ``record_checks=False`` runs the token/text check only."""
    cfg, checked = tally.cfg, tally.checked
    add = tally.add
    n = t.num_rows
    role_v, role_row, n_tok = _flat(t.column("token_role"))
    gen_mask = role_v.to_numpy(zero_copy_only=False) == 1
    n_gen = np.bincount(role_row[gen_mask], minlength=n)
    msg_v, msg_row, n_msg = _flat(t.column("messages"))
    has_tokens, has_msgs = n_tok > 0, n_msg > 0
    if record_checks:
        m_content = pc.fill_null(pc.struct_field(msg_v, "content"), "")
        m_calls = pc.fill_null(pc.struct_field(msg_v, "tool_calls"), "")
        has_calls = pc.greater(pc.utf8_length(m_calls), 0).to_numpy(zero_copy_only=False)
        # blank: nothing left once whitespace is trimmed = empty or only (Unicode) whitespace; the
        # predicate copies no text, where a trim copied every message's
        blank = pc.or_(pc.equal(pc.binary_length(m_content), 0), pc.utf8_is_space(m_content)).to_numpy(
            zero_copy_only=False)
        is_asst = pc.fill_null(pc.equal(pc.struct_field(msg_v, "role"), "assistant"), False).to_numpy(
            zero_copy_only=False)
        n_asst = np.bincount(msg_row[is_asst], minlength=n)
        n_asst_text = np.bincount(msg_row[is_asst & ~blank], minlength=n)
        n_blank = np.bincount(msg_row[blank & ~has_calls], minlength=n)
        n_calls = np.bincount(msg_row[has_calls & is_asst], minlength=n)
        checked["runaway"] += int(has_tokens.sum())
        checked["zero_completion"] += int((has_tokens | has_msgs).sum())
        checked["empty_turn"] += int(has_msgs.sum())
        checked["tool_no_observation"] += int(has_msgs.sum())

        # runaway: at the cap, long enough, tail n-gram repeated (screened by hash, re-counted exactly)
        cap = pc.fill_null(pc.equal(t.column("finish_reason"), "length"), False).to_numpy(zero_copy_only=False)
        cand = cap & (n_gen >= cfg.ngram * cfg.min_repeats)
        if cand.any():
            ids_v, _, _ = _flat(t.column("token_ids"))
            ids_np = ids_v.to_numpy(zero_copy_only=False)
            sel = gen_mask & cand[role_row]
            reps = tail_repeats(ids_np[sel], role_row[sel], n, cfg.ngram)
            for r in _rows(t, np.flatnonzero(cand & (reps >= cfg.min_repeats))):
                ev = runaway(np.asarray(r["token_ids"]), np.asarray(r["token_role"]), r["finish_reason"],
                             cfg.ngram, cfg.min_repeats)
                if ev:
                    add("runaway", r, f"stopped at the length cap after {ev['gen_tokens']} tokens, its last "
                                      f"{ev['ngram']}-gram repeated {ev['repeats']} times", ev)
        for r in _rows(t, np.flatnonzero((has_tokens & (n_gen == 0)) | (~has_tokens & has_msgs & (n_asst_text == 0)))):
            if r["token_ids"]:
                add("zero_completion", r, f"{len(r['token_ids'])} tokens, none generated (token_role has no 1)",
                    {"tokens": len(r["token_ids"]), "gen_tokens": 0})
            else:
                add("zero_completion", r, "a token-less row with no assistant text", {"tokens": 0, "assistant_chars": 0})
        # turns: rows with messages but no assistant turn, or a blank turn without a tool call
        for r in _rows(t, np.flatnonzero(has_msgs & ((n_asst == 0) | (n_blank > 0)))):
            for e in empty_turns(r["messages"]):
                add("empty_turn", r, f"turn {e['turn']} ({e['role']}): {e['problem']}" if e["turn"] is not None
                    else "no assistant turn in the episode", e)
        for r in _rows(t, np.flatnonzero(n_calls > 0)):
            for e in unanswered_tool_calls(r["messages"]):
                add("tool_no_observation", r, f"assistant turn {e['turn']} made {e['calls']} tool call(s); "
                                              f"{e['observations']} observation(s) follow it", e)
    if tok is not None and checked["token_text_mismatch"] < cfg.max_decode:
        ok = has_tokens & has_msgs & (n_gen > 0) & pc.not_equal(t.column("tokens_source"), "none").to_numpy(
            zero_copy_only=False)
        idx = np.flatnonzero(ok)[: cfg.max_decode - checked["token_text_mismatch"]]
        for r in _rows(t, idx):
            checked["token_text_mismatch"] += 1
            ev = decode_mismatch(tok, np.asarray(r["token_ids"]), np.asarray(r["token_role"]), r["messages"])
            if ev:
                add("token_text_mismatch", r, f"generated tokens {ev['tokens'][0]}–{ev['tokens'][1]} decode to "
                                              f"{ev['decoded'][:60]!r}, not found in the stored text", ev)
    if not record_checks:
        return
    tok_rows = np.flatnonzero(has_tokens)  # only a row with tokens pairs log-probs: only their meta is searched
    meta = t.column("meta") if len(tok_rows) == n else t.column("meta").take(pa.array(tok_rows, pa.int64()))
    meta = pc.fill_null(meta, "")
    lp_cand = pc.or_(pc.match_substring(meta, "trainer_logprobs"), pc.match_substring(meta, "old_log_probs"))
    for r in _rows(t, tok_rows[lp_cand.to_numpy(zero_copy_only=False)]):
        try:
            mt = json.loads(r["meta"])
        except json.JSONDecodeError:
            continue
        tl = trainer_logprobs(mt if isinstance(mt, dict) else {}, len(r["token_ids"]))
        if tl is None:
            continue
        tally.n_pairs += 1
        checked["logprob_mismatch"] += 1
        g = logprob_gap(np.asarray(r["logprobs"], float), tl, np.asarray(r["token_role"]))
        if g and (g["gap_mean"] >= cfg.max_gap_mean or g["gap_max"] >= cfg.max_gap):
            add("logprob_mismatch", r, f"sampler and trainer log-probs differ by {g['gap_mean']:.3f} "
                                       f"nats/token on average, {g['gap_max']:.2f} at token {g['at']}", g)


__all__ = ["CHECKS", "HealthConfig", "HealthIssue", "HealthReport", "Tally", "screen_batch", "COLUMNS", "TITLES", "decode_mismatch", "empty_turns",
           "logprob_gap", "runaway", "tail_repeats", "trainer_logprobs", "unanswered_tool_calls"]
