"""Write the verl DataProto fixture used by tests/integrations/test_verl_live.py.

Run with verl installed (verl itself needs no GPU for this; ``pip install --no-deps verl==0.9.1``
plus ``tensordict<=0.10`` and what ``import verl`` asks for):

    python tests/contracts/make_verl_dataproto_fixture.py tests/contracts/fixtures

It builds a batch the way ``RayPPOTrainer.fit`` holds it after ``compute_advantage`` (GRPO): the
batch is a real ``verl.DataProto`` (``DataProto.from_dict``), ``position_ids`` come from
``verl.utils.model.compute_position_id_with_mask`` and ``response_mask`` from
``verl.trainer.ppo.ray_trainer.compute_response_mask`` when those import, and the advantages from
``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` when that imports (otherwise the
same formulas inline; the JSON records which). One row is multi-turn (a tool span inside the
response is masked out of ``response_mask``). The DataProto's tensors are saved to
``verl_dataproto.npz`` (read back through ``DataProto.batch``), and its non-tensor batch,
meta_info, dtypes and the verl version to ``verl_dataproto.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import verl
from verl import DataProto


def build() -> tuple[DataProto, dict[str, str]]:
    g = torch.Generator().manual_seed(7)
    B, P, R, pad = 6, 6, 7, 0
    used: dict[str, str] = {}
    p_len = [6, 4, 5, 3, 6, 2]
    r_len = [7, 3, 5, 1, 6, 4]
    prompts = torch.full((B, P), pad, dtype=torch.int64)
    responses = torch.full((B, R), pad, dtype=torch.int64)
    am = torch.zeros((B, P + R), dtype=torch.int64)
    for i in range(B):
        prompts[i, P - p_len[i]:] = torch.randint(3, 500, (p_len[i],), generator=g)
        responses[i, : r_len[i]] = torch.randint(3, 500, (r_len[i],), generator=g)
        am[i, P - p_len[i]: P + r_len[i]] = 1
    try:
        from verl.utils.model import compute_position_id_with_mask

        position_ids = compute_position_id_with_mask(am)
        used["position_ids"] = "verl.utils.model.compute_position_id_with_mask"
    except ImportError:
        position_ids = torch.clip(torch.cumsum(am, dim=-1) - 1, min=0)
        used["position_ids"] = "inline: clip(cumsum(attention_mask) - 1, 0)"
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
                 "attention_mask": am, "position_ids": position_ids},
        non_tensors={
            "uid": np.array(["u0", "u0", "u1", "u1", "u2", "u2"], dtype=object),
            "data_source": np.array(["openai/gsm8k"] * 4 + ["lighteval/MATH"] * 2, dtype=object),
            "reward_model": np.array([{"ground_truth": str(10 + i // 2), "style": "rule"} for i in range(B)], dtype=object),
            "extra_info": np.array([{"index": i // 2, "split": "train"} for i in range(B)], dtype=object),
            "request_id": np.array([f"req-{i}" for i in range(B)], dtype=object),
        },
        meta_info={"global_steps": 3, "temperature": 1.0},
    )
    try:
        from verl.trainer.ppo.ray_trainer import compute_response_mask

        response_mask = compute_response_mask(data)
        used["response_mask"] = "verl.trainer.ppo.ray_trainer.compute_response_mask"
    except ImportError:
        response_mask = am[:, -R:]
        used["response_mask"] = "inline: attention_mask[:, -R:]"
    response_mask = response_mask.clone()
    response_mask[0, 2:4] = 0  # row 0 is multi-turn: two tool-output tokens inside the response
    data.batch["response_mask"] = response_mask
    logp = -torch.rand((B, R), generator=g, dtype=torch.float32) * 4  # verl leaves values at padding too
    data.batch["old_log_probs"] = logp
    data.batch["rollout_log_probs"] = (logp - 0.01 * torch.rand((B, R), generator=g)) * response_mask
    scores = torch.zeros((B, R), dtype=torch.float32)
    acc = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    for i in range(B):
        scores[i, r_len[i] - 1] = acc[i]
    data.batch["token_level_scores"] = scores
    data.batch["token_level_rewards"] = scores.clone()
    try:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        adv, ret = compute_grpo_outcome_advantage(scores, response_mask, data.non_tensor_batch["uid"])
        used["advantages"] = "verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage"
    except ImportError:
        s = scores.sum(-1)
        adv = torch.zeros(B)
        for u in set(data.non_tensor_batch["uid"]):
            idx = [i for i in range(B) if data.non_tensor_batch["uid"][i] == u]
            grp = s[idx]
            adv[idx] = (grp - grp.mean()) / (grp.std() + 1e-6)
        adv = adv.unsqueeze(-1) * response_mask
        ret = adv
        used["advantages"] = "inline: GRPO outcome advantage (core_algos did not import)"
    data.batch["advantages"] = adv
    data.batch["returns"] = ret
    return data, used


def main(out: str) -> None:
    data, used = build()
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    np.savez(d / "verl_dataproto.npz", **{k: data.batch[k].numpy() for k in data.batch.keys()})
    doc = {
        "verl_version": verl.__version__,
        "made_with": used,
        "dtypes": {k: str(data.batch[k].dtype).removeprefix("torch.") for k in data.batch.keys()},
        "non_tensor_batch": {k: v.tolist() for k, v in data.non_tensor_batch.items()},
        "meta_info": data.meta_info,
        "reward_extra_info": {"acc": [bool(x) for x in data.batch["token_level_scores"].sum(-1).tolist()]},
    }
    (d / "verl_dataproto.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {d}/verl_dataproto.npz and .json ({len(data)} rows; {used})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent / "fixtures"))
