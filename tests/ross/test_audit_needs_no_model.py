"""``gfcr ross audit`` with a rule judge needs no model (issue 45): on the shipped config, whose
``upstream_model`` points at a checkpoint that does not exist here, it aligns with the tokenizer of
the model the store's rollouts record; a config without ``upstream_model`` audits too, and the
stages that do need the model say so in one line."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.store import RolloutStore

from .conftest import make_prompt, make_rollout

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "ross-arith.yaml"


def _store(tmp_path, tok):
    tok_dir = tmp_path / "model"
    tok.save_pretrained(str(tok_dir))
    st = RolloutStore.open(tmp_path / "st", create=True)
    rows, prompts = [], []
    for i in range(3):
        q, a = f"What is {i} + 7?", i + 7
        r = make_rollout(tok, q, f"{i} + 7 = {a + 1}.\nOops. {i} + 7 = {a}.\nAnswer: {a}", gold=str(a), step=i,
                         prompt_id=f"p{i}")
        r.sampling = {"engine": "hf", "model": str(tok_dir)}
        rows.append(r)
        prompts.append(make_prompt(q, str(a), prompt_id=f"p{i}"))
    st.upsert_prompts(prompts)
    st.append(rows)
    return st


def test_rule_judge_audit_on_the_shipped_config_needs_no_model(tmp_path, tok):
    st = _store(tmp_path, tok)
    res = CliRunner().invoke(app, ["ross", "audit", str(SHIPPED), "--set", f"store={st.path}", "--set", "window.steps=[0,3]",
                                   "--set", "variants=[ross]"])
    assert res.exit_code == 0, res.output  # upstream_model runs/run/checkpoints/step_000019 does not exist here
    audits = RolloutStore.open(st.path).audits(judge="arith-steps").to_pylist()
    assert len(audits) == 3 and all(a["status"] == "kept" for a in audits)
    assert all(a["excluded"] and 0 < a["ter"] < 1 for a in audits)  # the slip was excluded, token-aligned


def test_a_config_without_upstream_model_audits_and_the_model_stages_say_what_they_need(tmp_path, tok):
    st = _store(tmp_path, tok)
    cfg = tmp_path / "ross.yaml"
    cfg.write_text(f"store: {st.path}\nwindow: {{steps: [0, 3]}}\nvariants: [ross]\n")
    res = CliRunner().invoke(app, ["ross", "audit", str(cfg)])
    assert res.exit_code == 0, res.output
    assert RolloutStore.open(st.path).count("audits") == 3
    res = CliRunner().invoke(app, ["ross", "run", str(cfg), "--run-dir", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    assert "the train stage needs upstream_model" in res.output and len(res.output.strip().splitlines()) == 1
