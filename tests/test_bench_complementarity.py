"""bench/complementarity_bench.py on a real (tiny-model) ``gfcr train`` run folder."""

import argparse
import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("complementarity_bench",
                                              Path(__file__).parents[1] / "bench" / "complementarity_bench.py")
cb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cb)


def test_analyzes_the_runs_solved_prompts_with_its_last_checkpoint(tiny_run, tiny_dir, tmp_path):
    from gfcr.store import RolloutStore

    res = tiny_run
    facts = cb.run_facts(Path(res.run_dir))
    assert facts["last"].endswith("step_000001") and facts["start"] == tiny_dir
    assert (facts["temperature"], facts["max_tokens"]) == (0.9, 4)  # the run's own sampling

    rs = RolloutStore.open(res.store_path).rollouts()
    solved = {r.prompt_id for r in rs if r.verified}
    assert solved  # the pattern passes most random completions
    args = argparse.Namespace(n=100, k=3, compat=2, with_start=True, work=str(tmp_path / "work"))
    rec = cb.analyze(Path(res.run_dir), args)
    comp = rec["complementarity"]
    assert comp["n_prompts"] == len(solved)  # every solved prompt (fewer than --n), each sampled k times
    rates = comp["historical_rates"]
    assert rates == sorted(rates) and all(0 < x <= 1 for x in rates)  # hardest (lowest rate) first
    assert comp["solved_any"] <= comp["n_prompts"] and comp["at_most_half"] >= comp["n_prompts"] - comp["solved_any"]
    assert rec["start_complementarity"]["n_prompts"] == len(solved)
    assert rec["compatibility"]["historical"]["rows"] >= 1  # the stored successes were scored
    assert rec["wall_s"] > 0 and rec["cpu_s"] > 0


def test_a_folder_without_checkpoints_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.yaml").write_text("model: default\n")
    with pytest.raises(SystemExit, match="no checkpoints"):
        cb.run_facts(tmp_path)
