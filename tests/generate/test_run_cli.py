import json

import numpy as np
from typer.testing import CliRunner


def test_run_generate_into_store(tmp_path, tiny_dir):
    from gfcr.generate.run import GenerateConfig, run_generate
    from gfcr.models import model_hash
    from gfcr.store import RolloutStore

    cfg = GenerateConfig.model_validate({
        "store": str(tmp_path / "s"), "run_id": "run-a", "step": 3, "batch_prompts": 2,
        "tasks": {"source": "arith", "args": {"n": 3, "level": 1}},
        "engine": {"name": "hf", "model": tiny_dir},
        "topology": {"name": "group", "params": {"k": 2}},
        "sampling": {"max_tokens": 8, "temperature": 1.0},
    })
    out = run_generate(cfg, progress=False)
    assert out["rollouts"] == 6 and out["generated_tokens"] > 0
    store = RolloutStore.open(tmp_path / "s")
    rs = store.rollouts(run="run-a")
    assert len(rs) == 6
    from transformers import AutoModelForCausalLM

    version = model_hash(AutoModelForCausalLM.from_pretrained(tiny_dir))
    for r in rs:
        assert r.step == 3 and r.policy_version == version and r.sampling["max_tokens"] == 8
        assert r.cost.gen_tokens == r.n_generated and r.token_ids.dtype == np.int32
    assert {p.prompt_id for p in store.prompts()} == {r.prompt_id for r in rs}
    assert (tmp_path / "s" / "runs" / "run-a" / "generate-step3.yaml").exists()


def test_cli_generate_and_bad_config(tmp_path, tiny_dir):
    from gfcr.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["generate", "--store", str(tmp_path / "c"), "--model", tiny_dir, "--n", "2",
                              "--k", "2", "--max-tokens", "6", "--topology", "tree", "--quiet", "--run-id", "cli"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{"):])
    assert summary["rollouts"] == 2 * 6 * (1 + 2 * 2 * 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("store: x\ntopology: {name: star}\n")
    res = runner.invoke(app, ["generate", str(bad)])
    assert res.exit_code == 2 and "invalid generate config" in res.output
