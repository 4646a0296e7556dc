"""Write the RedNote Relax contract fixture, field by field from its writer (not run in CI).

Framework: redai-infra/Relax @ 2765d18a (not on PyPI; its package needs Ray, SGLang and Megatron, so
its code is not run here). The writer is ``save_debug_rollout_data`` in
``relax/utils/training/train_dump_utils.py``: ``torch.save(dict(rollout_id=rollout_id,
samples=[sample.to_dict() + decoded_tokens]), path)`` with ``path`` the ``--save-debug-rollout-data``
template formatted with the rollout id (``eval_`` before it for evaluation). ``Sample.to_dict``
(``relax/utils/types.py``) is the dataclass's ``__dict__`` with ``status`` as its value and
``spec_info`` / ``prefix_cache_info`` as dicts; every field of that dataclass is written here with
the defaults it has there. Sample 1 carries a ``rollout_log_probs_mask`` with a False position
(Relax: the token and its behaviour log-prob no longer correspond), sample 2 is an evaluation
sample. Run (needs torch):

    python tests/contracts/gen_relax.py tests/contracts/fixtures/relax
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

_DEFAULTS = {  # Sample's fields and defaults, in its order (relax/utils/types.py @ 2765d18a)
    "group_index": None, "index": None, "prompt": "", "tokens": [], "rollout_tokens": [],
    "multimodal_inputs": None, "multimodal_train_inputs": None, "response": "", "response_length": 0,
    "label": None, "reward": None, "custom_advantage": None, "loss_mask": None, "weight_versions": [],
    "rollout_log_probs": None, "rollout_log_probs_mask": None, "rollout_routed_experts": None,
    "remove_sample": False, "abort_count": 0, "teacher_log_probs": None, "student_topk_token_ids": None,
    "student_topk_log_probs": None, "teacher_at_student_topk_log_probs": None, "teacher_topk_token_ids": None,
    "teacher_topk_log_probs": None, "student_at_teacher_topk_log_probs": None, "opd_topk_token_ids": None,
    "opd_topk_student_log_probs": None, "opd_topk_teacher_log_probs": None, "opd_topk_ksz": None,
    "teacher_prompt": None, "teacher_multimodal_inputs": None, "teacher_tokens": None,
    "teacher_prompt_length": None, "teacher_image_data": None, "teacher_image_b64_list": None,
    "teacher_image_grid_thw": None, "status": "pending", "metadata": {}, "generate_function_path": None,
    "train_metadata": None, "session_id": None, "non_generation_time": 0.0,
    "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                  "completion_token_num": 0},
    "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
}


def sample(**kw) -> dict:
    d = {k: (v.copy() if isinstance(v, dict | list) else v) for k, v in _DEFAULTS.items()}
    d.update(kw)
    d["decoded_tokens"] = []  # save_debug_rollout_data without a tokenizer
    return d


def main(out: str) -> None:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    p = [1, 10, 11, 2]
    train = [
        sample(group_index=0, index=0, prompt="2+3?", tokens=p + [20, 21, 2], rollout_tokens=[20, 21, 2],
               response="5", response_length=3, label="5", reward=1.0, loss_mask=[1, 1, 1], weight_versions=["7"],
               rollout_log_probs=[-0.5, -0.25, -0.125], rollout_log_probs_mask=[True, True, True], status="completed"),
        sample(group_index=0, index=1, prompt="2+3?", tokens=p + [22, 23, 2], rollout_tokens=[22, 23, 2],
               response="6!", response_length=3, label="5", reward=-1.0, loss_mask=[1, 1, 1],
               weight_versions=["7", "8"], rollout_log_probs=[-1.0, 0.0, -0.5],
               rollout_log_probs_mask=[True, False, True], status="truncated"),
    ]
    torch.save(dict(rollout_id=7, samples=train), d / "7.pt")
    ev = [sample(group_index=0, index=0, prompt="1+1?", tokens=[1, 12, 2, 30, 2], response="2", response_length=2,
                 label="2", reward=1.0, loss_mask=[1, 1], weight_versions=["8"], rollout_log_probs=[-0.1, -0.2],
                 status="completed")]
    torch.save(dict(rollout_id=7, samples=ev), d / "eval_7.pt")
    (d / "expected.json").write_text(json.dumps({
        "relax": "2765d18a", "train": 2, "eval": 1, "finish": ["stop", "length"], "policy": ["v7", "v7-8"],
        "logprobs": [[0.0] * 4 + [-0.5, -0.25, -0.125], [0.0] * 4 + [-1.0, 0.0, -0.5]], "missing_at": [[], [5]]},
        indent=1))
    print(sorted(str(x) for x in d.rglob("*") if x.is_file()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/relax")
