"""What long commands print, and where: results on stdout, progress and notes on stderr; tables
that stay readable at 80 columns; `gfcr eval`'s defaults on a small task split."""

from __future__ import annotations

import io

import numpy as np
import pytest


def test_eval_prompts_takes_a_small_split_whole_with_a_note():
    from gfcr.evaluate import eval_prompts
    from gfcr.tasks import PoolTooSmall, make_source

    # one-digit sums: 100 expressions, a fixed tenth of them held out
    with pytest.raises(PoolTooSmall) as e:
        make_source("arith", n=32, split="test")
    assert isinstance(e.value, ValueError) and 0 < len(e.value.prompts) < 32
    prompts, notes = eval_prompts("arith", n=32)  # the README's `gfcr eval --tasks arith` defaults
    assert len(prompts) == len(e.value.prompts) == len({p.prompt_id for p in prompts})
    assert all(p.split == "test" for p in prompts)
    assert len(notes) == 1 and f"evaluating all {len(prompts)} (asked for 32)" in notes[0]
    prompts, notes = eval_prompts("arith", n=5, level=2)
    assert len(prompts) == 5 and notes == []
    with pytest.raises(ValueError, match="unknown task source"):
        eval_prompts("nosuchtask", n=2)


class _Echo:
    """An engine that answers every prompt with its own gold answer (protocol: ``generate``)."""

    name, policy_version = "echo", "v0"

    def __init__(self, answers):
        self.answers = answers

    def generate(self, reqs):
        from gfcr.generate.engines.base import GenResult

        return [[GenResult(np.zeros(1, np.int32), np.zeros(1, np.float32), "stop", text=f"Answer: {self.answers[r.request_id]}")
                 for _ in range(r.params.n)] for r in reqs]


def test_eval_progress_goes_to_stderr(capsys):
    from gfcr.evaluate import eval_prompts, evaluate_model

    prompts, _ = eval_prompts("arith", n=4, level=2)
    res = evaluate_model(_Echo({p.prompt_id: p.answer for p in prompts}), prompts, k=2, progress=True)
    out, err = capsys.readouterr()
    assert out == ""  # the caller prints the JSON; the bar never touches stdout
    assert "eval" in err
    assert res.metrics["pass@1"].value == 1.0 and res.n_prompts == 4


def test_store_query_is_readable_at_80_columns(monkeypatch):
    from rich.console import Console

    from gfcr.cli import store as store_cli

    buf = io.StringIO()
    monkeypatch.setattr(store_cli, "console", Console(file=buf, width=80))
    rid = "a613f0489b284040874ffa37a85634e1"
    wide = [{"rollout_id": rid, "run_id": "run-a", "step": 0, "prompt_id": "arith-0f3c9a1b2c3d4e5f", "reward": 0.74,
             "verified": False, "finish_reason": "stop", "task": "code", "policy_version": "s3-1a2b3c4d",
             "text": "line one\nline two " + "x" * 200}] * 2
    store_cli.print_rows(wide, title="2 row(s)")
    text = buf.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert rid in text and "arith-0f3c9a1b2c3d4e5f" in text and "s3-1a2b3c4d" in text  # nothing squeezed
    assert text.count("-[ row ") == 2
    buf.seek(0)
    buf.truncate()
    store_cli.print_rows([{"step": 0, "avg(reward)": 0.5}])
    narrow = buf.getvalue()
    assert "avg(reward)" in narrow and "-[ row" not in narrow  # a table when it fits
