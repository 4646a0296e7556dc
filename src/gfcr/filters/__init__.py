"""gfcr.filters: turn rollouts into signals.

- :mod:`~gfcr.filters.verifiers`: ``Verdict``, the ``Verifier`` protocol, ``math``, ``exact``,
  ``numeric``, ``format``, ``code``, ``env``, ``composite`` (:data:`VERIFIERS`, :func:`get_verifier`)
- :mod:`~gfcr.sandbox`: the hardened code sandbox (:func:`run_python`)
- :mod:`~gfcr.filters.apply`: :func:`verify_rollout`, :func:`verify_many`, :func:`reverify_store`
- :mod:`~gfcr.filters.signals`: advantages (GRPO, Dr. GRPO, RLOO, SEED-GRPO), DAPO overlong
  shaping, token entropy, PRM aggregation
- :mod:`~gfcr.filters.judge`: an OpenAI-compatible LLM-judge client
"""

from .apply import reverify_store, verify_many, verify_rollout
from .verifiers import VERIFIERS, Verdict, Verifier, extract_answer, get_verifier

__all__ = [
    "VERIFIERS",
    "Verdict",
    "Verifier",
    "extract_answer",
    "get_verifier",
    "reverify_store",
    "verify_many",
    "verify_rollout",
]
