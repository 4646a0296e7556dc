"""``reasoning_gym``: prompts from any reasoning-gym dataset, with its scorer.

The gold answer goes into ``Prompt.answer``; the full entry (question, answer, metadata) into
``Prompt.tests`` as ``{"dataset": name, "entry": ...}`` so :func:`score_reasoning_gym` can call the
dataset's own scorer later from the store alone. reasoning-gym scorers are strict (``'30.0'`` scores
0.5): pass the extracted answer, not the whole completion.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gfcr.records import Message, Prompt, json_safe
from gfcr.tasks import ListSource

INSTRUCTION = "{question}\n\nThink step by step, then finish with a final line of the form 'Answer: <answer>'."


def make_reasoning_gym(
    dataset: str, n: int = 64, seed: int = 0, split: str = "train", config: dict[str, Any] | None = None
) -> ListSource:
    """``n`` prompts of reasoning-gym dataset ``dataset`` (e.g. ``"basic_arithmetic"``).

    ``split`` picks a seed stream (``train`` uses ``seed``, ``test`` uses ``seed + 1_000_003``) and
    ``test`` prompts whose question also occurs among ``train`` prompts of the same size are not
    removed: reasoning-gym does not promise disjoint seeds, so prefer a distinct ``config`` for held-out.
    """
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("reasoning_gym is not installed: pip install 'gfcr[tasks]'") from e
    s = seed if split == "train" else seed + 1_000_003
    try:
        ds = reasoning_gym.create_dataset(dataset, size=n, seed=s, **(config or {}))
    except Exception as e:
        raise ValueError(f"reasoning-gym could not create dataset {dataset!r} with config {config}: {e}") from e
    out = []
    for i in range(n):
        entry = json_safe(ds[i])
        q = entry["question"]
        pid = "rg-" + hashlib.blake2b(f"{dataset}|{q}".encode(), digest_size=8).hexdigest()
        md = entry.get("metadata", {}) or {}
        diff = md.get("difficulty")
        out.append(
            Prompt(
                prompt_id=pid,
                task=f"rg:{dataset}",
                messages=[Message("user", INSTRUCTION.format(question=q))],
                answer=None if entry.get("answer") is None else str(entry["answer"]),
                tests={"dataset": dataset, "entry": entry},
                category=dataset,
                difficulty=float(diff) if isinstance(diff, int | float) else None,
                split=split,
                meta={"source": "reasoning_gym", "index": i, "seed": s, "answer_format": "answer_line"},
            )
        )
    return ListSource(f"reasoning_gym:{dataset}", out)


def score_reasoning_gym(prompt: Prompt, answer: str | None) -> float:
    """The dataset's own score (0..1) for an extracted ``answer`` to ``prompt``."""
    import reasoning_gym

    spec = prompt.tests or {}
    if "dataset" not in spec or "entry" not in spec:
        raise ValueError(f"prompt {prompt.prompt_id} has no reasoning-gym entry in tests")
    scorer = reasoning_gym.get_score_answer_fn(spec["dataset"])
    return float(scorer(answer, spec["entry"]))
