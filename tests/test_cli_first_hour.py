"""The first hour of a new user (issue 45): what the CLI prints and refuses, each found on a fresh clone."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gfcr.cli import app


def _commands(t, prefix=()):
    for info in t.registered_commands:
        yield (*prefix, info.name or info.callback.__name__.replace("_cmd", "").replace("_", "-"))
    for g in t.registered_groups:
        yield from _commands(g.typer_instance, (*prefix, g.name))


def test_no_help_shows_internal_notes():
    """A docstring's "Long because" note is for the code's readers: no --help prints it."""
    cmds = list(_commands(app))
    assert ("eval",) in cmds and len(cmds) > 20
    for c in cmds:
        res = CliRunner().invoke(app, [*c, "--help"], terminal_width=100)
        assert res.exit_code == 0, (c, res.output)
        assert "Long because" not in res.output, c


class _Engine:
    def __init__(self, *a, **kw):
        self.model = a[0] if a else None


@pytest.fixture
def fake_eval(monkeypatch):
    """``gfcr eval`` with the engine and the evaluation replaced: records the verifier it was given."""
    import gfcr.evaluate
    import gfcr.generate.engines.hf
    from gfcr.evaluate import summarize

    seen = {}

    def evaluate_model(engine, prompts, *, verifier, k, **kw):
        seen["verify"], seen["prompts"] = verifier, prompts
        return summarize({p.prompt_id: [True, False, False, True][:k] for p in prompts},
                         greedy={p.prompt_id: i % 2 == 0 for i, p in enumerate(prompts)}, ks=[1, k])

    monkeypatch.setattr(gfcr.generate.engines.hf, "HFEngine", _Engine)
    monkeypatch.setattr(gfcr.evaluate, "evaluate_model", evaluate_model)
    return seen


def test_eval_default_model_uses_the_lenient_reading_and_prints_one_line(fake_eval, tmp_path):
    res = CliRunner().invoke(app, ["eval", "--model", "default", "--tasks", "arith", "--k", "4", "--n", "4"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stdout  # one summary line, not the JSON
    assert lines[0].startswith("4 prompts, k=4: pass@1 0.500 [") and "greedy_pass@1 0.500 [" in lines[0]
    assert "lenient_fallback=true" in res.stderr
    p = fake_eval["prompts"][0]
    # the default model's completions end with the number, not an 'Answer: N' line: the lenient reading passes them
    assert fake_eval["verify"](p, f"so the sum is {p.answer}") is True
    # --verifier-arg wins: the strict reading on request
    res = CliRunner().invoke(app, ["eval", "--n", "4", "--verifier-arg", "lenient_fallback=false"])
    assert res.exit_code == 0 and "lenient_fallback=true" not in res.stderr
    assert fake_eval["verify"](p, f"so the sum is {p.answer}") is False
    # another model is read strictly as asked
    res = CliRunner().invoke(app, ["eval", "--model", "some/model", "--n", "4"])
    assert res.exit_code == 0 and fake_eval["verify"](p, f"so the sum is {p.answer}") is False


def test_eval_json_behind_a_flag_and_in_a_file(fake_eval, tmp_path):
    res = CliRunner().invoke(app, ["eval", "--n", "4", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["n_prompts"] == 4 and d["info"]["verifier"] == {"name": "numeric", "params": {"lenient_fallback": True}}
    out = tmp_path / "e.json"
    res = CliRunner().invoke(app, ["eval", "--n", "4", "--out", str(out)])
    assert res.exit_code == 0 and json.loads(out.read_text())["n_prompts"] == 4
    assert res.stdout.strip().startswith("4 prompts, k=4: ") and f"written: {out}" in res.stderr
