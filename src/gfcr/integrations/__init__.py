"""Live capture: gfcr inside the trainers people already run.

- :mod:`gfcr.integrations.trl`: a recorder that writes every ``GRPOTrainer`` rollout into a store
  while it trains, gfcr verifiers as TRL reward functions, gfcr prompt selectors as TRL's sampler.
- :mod:`gfcr.integrations.verl`: a ``DataProto`` → store writer (and back), with a hook for verl's
  ``RayPPOTrainer``.

Both write off the training thread through :class:`~gfcr.integrations.writer.StepWriter`: one
rollouts commit per step, so a run killed mid-training leaves every committed step whole.
Importing this package imports neither torch, TRL nor verl.
"""

from .writer import StepBatch, StepWriter, WriterError

__all__ = ["StepBatch", "StepWriter", "WriterError"]
