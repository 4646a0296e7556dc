"""ROSS end to end on a tiny model: the library driver and the CLI stage commands."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from gfcr.ross.config import load_config
from gfcr.ross.pipeline import run_ross
from gfcr.testing import save_tiny

from .test_judges_audit import _store_with


def _config(tmp_path, tok) -> dict:
    store = _store_with(tmp_path, tok)
    del store
    up, base = save_tiny(str(tmp_path / "up"), seed=0), save_tiny(str(tmp_path / "base"), seed=1)
    return {
        "store": str(tmp_path / "store"), "out_dir": str(tmp_path / "runs"), "upstream_model": up, "base_model": base,
        "variants": ["positive_sft", "ross_nomask", "ross", "ross_from_base"],
        "train": {"epochs": 1, "lr": 1e-3, "batch_size": 4},
        "evaluate": {"benchmarks": [{"name": "arith1", "source": "arith", "params": {"level": 1}, "n_prompts": 3},
                                  {"name": "arith2", "source": "arith", "params": {"level": 2}, "n_prompts": 3,
                                   "domain": "math2"}],
                     "k": 2, "ks": [1, 2], "max_tokens": 6},
        "analyze": {"ter_window": 2, "compatibility_prompts": 2, "complementarity_prompts": 2,
                    "complementarity_k": 2, "max_tokens": 6},
    }


def test_config_rejects_unknown_and_bad_fields(tmp_path):
    with pytest.raises(ValueError, match="extra"):
        load_config(None, {"store": "s", "upstream_model": "m", "bogus": 1})
    with pytest.raises(ValueError, match="ks"):
        load_config(None, {"store": "s", "upstream_model": "m", "evaluate.k": 2, "evaluate.ks": [1, 8]})
    with pytest.raises(ValueError, match="base_model"):
        load_config(None, {"store": "s", "upstream_model": "m", "variants": ["ross_from_base"]})


def test_run_ross_end_to_end_tiny(tmp_path, tok):
    cfg = load_config(None, _config(tmp_path, tok))
    res = run_ross(cfg, log=lambda *_: None)
    r = res.results
    assert r["select"]["rollouts"] == 6
    assert r["audit"]["arith-steps"]["status"] == {"kept": 6}
    b = r["build"]
    assert b["ross"]["supervised_tokens"] < b["ross_nomask"]["supervised_tokens"] == b["positive_sft"]["supervised_tokens"]
    # the judge discarded nothing: ROSS w/o mask is positive SFT's data, one model, not reported twice
    assert b["ross_nomask"]["same_as"] == "positive_sft" and r["train"]["ross_nomask"] == {"same_as": "positive_sft"}
    assert set(r["train"]) == {"positive_sft", "ross_nomask", "ross", "ross_from_base"}
    assert r["train"]["ross_from_base"]["init"] == cfg.base_model
    ev = r["evaluate"]
    assert list(ev["results"]) == ["base", "upstream", "positive_sft", "ross", "ross_from_base"]
    assert ev["aliases"] == {"ross_nomask": "positive_sft"}
    assert list(ev["results"]["ross"]) == ["arith1", "arith2"]
    assert {"pass@1", "pass@2", "greedy_pass@1"} <= set(ev["results"]["ross"]["arith1"]["metrics"])
    paired = {(p["a"], p["b"], p["benchmark"], p["metric"]) for p in ev["paired"]}
    assert ("ross", "upstream", "arith2", "greedy_pass@1") in paired and ("ross", "positive_sft", "arith1", "pass@1") in paired
    assert all(0 <= p["p_value"] <= p["p_holm"] <= 1 for p in ev["paired"])
    assert all(p["n"] == (6 if p["benchmark"] == "all avg" else 3) for p in ev["paired"])
    assert ("ross", "upstream", "all avg", "greedy_pass@1") in paired  # the overall average, tested too
    assert "math2 avg" in res.table and "not significant" in res.table
    an = r["analyze"]
    assert [w["steps"] for w in an["ter_by_window"]] == [[0, 1], [2, 3], [4, 5]]
    assert all(0 < w["ter"] < 1 and w["entropy"] is not None for w in an["ter_by_window"])
    assert [r["step"] for r in an["ter_by_step"]] == list(range(6))
    assert all(r["ter_ma"] is not None for r in an["ter_by_step"])
    assert an["categories"]["arith"]["early"]["shares"] == {"corrected_mistake": 1.0}
    c = an["compatibility"]
    assert {"historical", "current", "other", "common"} <= set(c) and c["filtered_for_correctness"] is True
    assert c["historical"]["rows"] == 2 and c["temperature"] == cfg.evaluate.temperature
    assert an["complementarity"]["n_prompts"] == 2 and len(an["complementarity"]["historical_rates"]) == 2
    assert "| ross |" in res.table and (res.run_dir / "table.md").exists()
    # re-running audits nothing new: the store already holds them
    res2 = run_ross(cfg.model_copy(update={"stages": ["select", "audit"]}), log=lambda *_: None)
    assert res2.results["audit"]["arith-steps"]["skipped"] == 6 and res2.results["audit"]["arith-steps"]["audited"] == 0


@pytest.mark.slow
def test_cli_stage_commands(tmp_path, tok):
    from gfcr.cli import app

    c = _config(tmp_path, tok)
    c["variants"] = ["ross"]
    c["base_model"] = None
    c["analyze"].update({"compatibility_prompts": 0, "complementarity_prompts": 0})
    path = tmp_path / "ross.yaml"
    path.write_text(yaml.safe_dump(c))
    runner = CliRunner()
    out = runner.invoke(app, ["ross", "select", str(path)])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["rollouts"] == 6
    out = runner.invoke(app, ["ross", "audit", str(path)])
    assert out.exit_code == 0, out.output
    rd = tmp_path / "rd"
    for cmd in ("build", "train", "evaluate", "analyze"):
        out = runner.invoke(app, ["ross", cmd, str(path), "--run-dir", str(rd), "--set", "train.epochs=1"])
        assert out.exit_code == 0, (cmd, out.output)
    assert "| ross |" in out.output or "TER" in out.output
    assert (rd / "models" / "ross" / "sft.json").exists() and (rd / "eval.json").exists()
    out = runner.invoke(app, ["ross", "build", str(path), "--run-dir", str(rd)])
    assert out.exit_code != 0  # never overwrites a built dataset
    out = runner.invoke(app, ["ross", "build", str(path), "--run-dir", str(rd), "--no-mask"])
    assert out.exit_code == 0, out.output
    built = json.loads(out.output[out.output.index("{\n") :])["ross_nomask"]
    assert built["supervised_tokens"] == built["generated_tokens"]


def test_shipped_configs_load():
    from pathlib import Path

    paths = sorted((Path(__file__).parents[2] / "configs").glob("ross-*.yaml"))
    assert len(paths) >= 2
    for p in paths:
        cfg = load_config(p)
        assert cfg.train.epochs >= 1 and cfg.evaluate.ks


def test_demo_stage_runs_ross_after_rl(tmp_path, tok):
    from types import SimpleNamespace

    from gfcr.demo import STAGES, Demo, stage_ross

    assert STAGES.index("ross") == STAGES.index("train") + 1
    c = _config(tmp_path, tok)
    said: list[str] = []
    d = Demo(cfg=SimpleNamespace(eval=SimpleNamespace(max_tokens=6), verify=SimpleNamespace(verifier=SimpleNamespace(params={}))), full=False,
             model_path=c["base_model"],
             run_dir=tmp_path / "demo", store_path=c["store"],
             result=SimpleNamespace(checkpoint=c["upstream_model"]))
    stage_ross(d, lambda m: said.append(str(m)))
    out = "\n".join(said)
    assert "| ross |" in out and "| positive_sft |" in out and "| upstream |" in out
    assert d.outputs["ROSS table"].exists()


def test_demo_skips_ross_when_nothing_verified(tmp_path, tok):
    from gfcr.ross.pipeline import run_ross_demo
    from gfcr.store import RolloutStore

    from .conftest import make_rollout

    store = RolloutStore.open(tmp_path / "store", create=True)
    store.append([make_rollout(tok, "q", "3 + 4 = 7", verified=False)])
    said: list[str] = []
    res = run_ross_demo(tmp_path / "store", "unused", out_dir=tmp_path / "ross", log=said.append)
    assert "ROSS skipped" in said[0] and (tmp_path / "ross" / "table.md").exists() and "skipped" in res.results
