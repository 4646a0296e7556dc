"""Every config file in configs/ loads with its command's loader (issue 46 part 4: a config shape may
change only with a documented, tested migration)."""

from __future__ import annotations

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
    cfg = _loader(path)(path)
    assert cfg is not None
