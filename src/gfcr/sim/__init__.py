"""gfcr.sim: a model-free simulator comparing Control/Replay strategies (``gfcr simulate``). It runs
``gfcr train``'s own step sequence (:mod:`gfcr.control.step`: selector, group policy, replay buffer)
over a simulated world and learner, so simulated and trained behaviour cannot drift apart."""

from gfcr.sim.simulator import SimConfig, StrategyConfig, load_config, run_strategy, simulate

__all__ = ["SimConfig", "StrategyConfig", "load_config", "run_strategy", "simulate"]
