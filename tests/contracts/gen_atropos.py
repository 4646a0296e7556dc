"""Write the Atropos contract fixture, field by field from the writer's own layout
(NousResearch/atropos @ 296a0bc5): ``ScoredDataGroup`` (``atroposlib/envs/base.py``), written one
group per line by ``BaseEnv`` through ``jsonlines`` when ``data_path_to_save_groups`` is set; the
token/mask/log-prob layout of ``ManagedServer._create_sequence_node``
(``atroposlib/envs/server_handling/managed_server.py``): ``-100`` and log-prob ``1.0`` on prompt
positions, and on a multi-turn extension the earlier completion stays unmasked while the new
prompt suffix is masked. atroposlib itself (and its server stack) is not installed here. Run:

    python tests/contracts/gen_atropos.py tests/contracts/fixtures/atropos
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def node(prompt: list[int], out: list[int], lps: list[float], extending: dict | None = None) -> dict:
    """The tokens, masked tokens and log-probs ``_create_sequence_node`` builds."""
    if extending is None:
        return {"tokens": prompt + out, "masked": [-100] * len(prompt) + out, "lp": [1.0] * len(prompt) + lps}
    suffix = len(prompt) - len(extending["tokens"])
    return {"tokens": prompt + out, "masked": extending["masked"] + [-100] * suffix + out,
            "lp": extending["lp"] + [1.0] * suffix + lps}


def main(out: str) -> None:
    p = [1, 10, 11, 12, 2]
    a = node(p, [20, 21, 2], [-0.5, -0.25, -0.125])
    b = node(p, [22, 2], [-1.0, -0.5])
    g1 = {"tokens": [a["tokens"], b["tokens"]], "masks": [a["masked"], b["masked"]], "scores": [1.0, -1.0],
          "advantages": [[0.0] * 5 + [1.0] * 3, [0.0] * 5 + [-1.0] * 2], "ref_logprobs": None,
          "messages": [[{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}],
                       [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "6"}]],
          "generation_params": {"temperature": 1.0}, "inference_logprobs": [a["lp"], b["lp"]],
          "group_overrides": None, "overrides": [{"finish_reason": "stop"}, {"finish_reason": "length"}],
          "images": None, "distill_token_ids": None, "distill_logprobs": None}
    t1 = node(p, [30, 2], [-0.5, -0.5])
    t2 = node(t1["tokens"] + [1, 40, 2], [31, 2], [-0.25, -0.25], extending=t1)  # a tool reply, then more
    g2 = {"tokens": [t2["tokens"]], "masks": [t2["masked"]], "scores": [0.5], "advantages": None,
          "ref_logprobs": None, "messages": None, "generation_params": None, "inference_logprobs": [t2["lp"]],
          "group_overrides": {"group_size": 1}, "overrides": None, "images": None,
          "distill_token_ids": None, "distill_logprobs": None}
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in (g1, g2)))
    print(sorted(str(x) for x in d.iterdir()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/contracts/fixtures/atropos")
