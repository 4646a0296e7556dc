"""gfcr.ross: relearning from stored self-generated rollouts through selective supervision.

ROSS (arXiv 2609.35954): keep verified-successful historical rollouts, let a judge mark the parts
worth imitating (it never rewrites), and run masked SFT with the full trajectory as context and
the loss only on the selected model-generated tokens. Stages (each a function and a
``gfcr ross`` command): select → audit → align → build → train → evaluate → analyze; the driver
is :func:`gfcr.ross.pipeline.run_ross`. The train stage runs the masked SFT of the Train room
(:func:`gfcr.train.sft.train_masked_sft`). See ``docs/ross.md``.

Importing this package does not import torch or transformers.
"""

from gfcr.ross.align import AlignError, align_mask, decode_with_offsets, token_supervision
from gfcr.ross.audit import audit_rollouts, judge_rollout, realign, select_rollouts, verified_answer
from gfcr.ross.build import build_dataset, labels_from_mask
from gfcr.ross.config import RossConfig, load_config
from gfcr.ross.judges import JUDGES, ArithSteps, KeepAll, LLMJudge, make_judge
from gfcr.ross.units import Unit, split_units
from gfcr.ross.verdict import Decision, VerdictError, validate_verdict

__all__ = [
    "JUDGES", "AlignError", "ArithSteps", "Decision", "KeepAll", "LLMJudge", "RossConfig", "Unit", "VerdictError",
    "align_mask", "audit_rollouts", "build_dataset", "decode_with_offsets", "judge_rollout", "labels_from_mask",
    "load_config", "make_judge", "realign", "select_rollouts", "split_units", "token_supervision",
    "validate_verdict", "verified_answer",
]
