"""gfcr.sim: a model-free simulator comparing Control/Replay strategies (``gfcr simulate``)."""

from gfcr.sim.simulator import SimConfig, StrategyConfig, load_config, run_strategy, simulate

__all__ = ["SimConfig", "StrategyConfig", "load_config", "run_strategy", "simulate"]
