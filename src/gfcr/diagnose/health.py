"""Rollout health checks over a store (the checks themselves: :mod:`gfcr.store.checks`).

:func:`run_health_checks` reads the rows in batches (the columns the checks need), screens each
batch column-wise, and runs the token/text check, which needs a tokenizer, over the first
``max_decode`` rows it can judge. The store's write path computes none of it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from gfcr.store.checks import (
    CHECKS,
    COLUMNS,
    TITLES,
    HealthConfig,
    HealthIssue,
    HealthReport,
    Tally,
    decode_mismatch,
    empty_turns,
    logprob_gap,
    runaway,
    screen_batch,
    tail_repeats,
    trainer_logprobs,
    unanswered_tool_calls,
)
from gfcr.store.sql import quote


def _tokenizer_or_skip(store: Any, tokenizer: Any | None, decode: bool, skipped: dict[str, str]) -> Any | None:
    from gfcr.diagnose.tokenizer import resolve_tokenizer

    if not decode:
        skipped["token_text_mismatch"] = "check skipped (decode=False)"
        return None
    tok, info = resolve_tokenizer(store, tokenizer)
    if tok is None:
        skipped["token_text_mismatch"] = (info["note"] or "no tokenizer").replace(
            "tokens are shown as ids (start with --tokenizer to decode)", "check skipped (pass --tokenizer to run it)")
    return tok


def _finish(tally: Tally, tok: Any | None, skipped: dict[str, str]) -> HealthReport:
    if tally.n_pairs == 0:
        skipped["logprob_mismatch"] = "no rollout stores both sampler and trainer log-probs"
    if tok is not None and tally.checked["token_text_mismatch"] >= tally.cfg.max_decode:
        skipped["token_text_mismatch"] = f"decoded the first {tally.cfg.max_decode} rows with tokens and text only (max_decode)"
    return HealthReport(tally.counts, tally.checked, tally.issues, skipped)


def run_health_checks(store: Any, run: str | None = None, tokenizer: Any | None = None,
                      config: HealthConfig | None = None, decode: bool = True) -> HealthReport:
    """Run every check over the store's rollouts (one run with ``run``), in batches.

    Each batch is screened column-wise (numpy / Arrow compute: generated-token counts, repeated
    tails, turn roles and contents, tool-call presence, log-prob sources in ``meta``); only the
    rows a screen flags go through the per-record functions above, for their evidence. The token/
    text check decodes at most ``max_decode`` rows (``checked`` says how many).

    ``tokenizer``: an HF tokenizer or a path/name; None uses the store's own model when its files
    are on this machine (never downloads). ``decode=False`` skips the token/text check.
    """
    cfg = config or HealthConfig()
    skipped: dict[str, str] = {}
    tok = _tokenizer_or_skip(store, tokenizer, decode, skipped)
    flt = None if run is None else f"run_id = {quote(run)}"
    tally = Tally(cfg)
    for batch in store.dataset("rollouts").to_batches(columns=COLUMNS, filter=flt, batch_size=cfg.batch_size):
        screen_batch(pa.Table.from_batches([batch]), tally, tok)
    return _finish(tally, tok, skipped)


__all__ = ["CHECKS", "COLUMNS", "TITLES", "HealthConfig", "HealthIssue", "HealthReport", "decode_mismatch",
           "empty_turns", "logprob_gap", "run_health_checks", "runaway", "tail_repeats", "trainer_logprobs",
           "unanswered_tool_calls"]
