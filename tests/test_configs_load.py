"""Every config file in configs/ loads with its command's loader, in the current shape (no note of an
old key), and the older flat shape of a shipped file loads to the same config (issue 46 part 4: a
config shape may change only with a documented, tested migration)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def _loader(path: Path):
    """The loader of the command the file is for, told apart by its top-level keys."""
    keys = set(yaml.safe_load(path.read_text()) or {})
    if "strategies" in keys or "n_prompts" in keys:
        from gfcr.sim.simulator import load_config
    elif "upstream_model" in keys or "store" in keys:
        from gfcr.ross.config import load_config
    elif "sampling" in keys or "batch_prompts" in keys:
        from gfcr.config import load_config_model
        from gfcr.generate.config import GenerateConfig

        return lambda p: load_config_model(GenerateConfig, p, {"store": "runs/x.store"})  # the --store flag
    else:
        from gfcr.train.config import load_config
    return load_config


def test_there_are_configs():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_file_loads(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # written in the current shape: no old key to note
        cfg = _loader(path)(path)
    assert cfg is not None


#: configs/gsm8k-vllm-gpu.yaml's methods as the file wrote them before the one method shape
GSM8K_OLD = """
generate: {engine: vllm, engine_params: {gpu_memory_utilization: 0.35, max_model_len: 2048}, k: 8}
verify: {verifier: math}
control: {selector: greso, group: dynamic_sampling,
          group_params: {train_prompts: 64, gen_prompts: 96, max_num_gen_batches: 4}}
replay: {buffer: exgrpo, params: {mix_ratio: 0.5}}
"""


def test_a_shipped_file_in_the_old_shape_loads_to_the_same_config(tmp_path):
    from gfcr.train.config import load_config

    path = CONFIGS[0].parent / "gsm8k-vllm-gpu.yaml"
    data = yaml.safe_load(path.read_text())
    old = yaml.safe_load(GSM8K_OLD)
    for section, keys in old.items():
        data[section] = {k: v for k, v in data[section].items() if k not in ("engine", "topology", "group", "buffer")}
        data[section] |= keys
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    with pytest.warns(FutureWarning, match="generate.engine_params is the old config shape"):
        migrated = load_config(tmp_path / "old.yaml")
    assert migrated == load_config(path)
    assert migrated.control.group.params["max_num_gen_batches"] == 4 and migrated.generate.k == 8


def test_shipped_ross_and_simulate_files_in_the_old_shape_load_to_the_same_config(tmp_path):
    from gfcr.ross.config import load_config as load_ross
    from gfcr.sim.simulator import load_config as load_sim

    path = CONFIGS[0].parent / "simulate-small.yaml"
    data = yaml.safe_load(path.read_text())
    for s in data["strategies"]:  # the flat keys the file wrote before the one method shape
        if isinstance(s.get("buffer"), dict):
            s["buffer_params"] = s.pop("buffer")["params"]
    assert any("buffer_params" in s for s in data["strategies"])
    (tmp_path / "sim.yaml").write_text(yaml.safe_dump(data))
    with pytest.warns(FutureWarning, match=r"strategies\[repo\].buffer_params is the old config shape"):
        assert load_sim(tmp_path / "sim.yaml") == load_sim(path)
    path = CONFIGS[0].parent / "ross-arith.yaml"
    data = yaml.safe_load(path.read_text())
    data["evaluate"]["verifier_params"] = {"lenient_fallback": True}
    (tmp_path / "ross.yaml").write_text(yaml.safe_dump(data))
    with pytest.warns(FutureWarning, match="evaluate.verifier_params is the old config shape"):
        old = load_ross(tmp_path / "ross.yaml")
    assert old == load_ross(path, {"evaluate.verifier.params": {"lenient_fallback": True}})
    assert old.evaluate.verifier.typed().lenient_fallback is True
