"""Masked SFT: teacher-forced cross-entropy on the supervised tokens only (ROSS's objective).

ROSS (arXiv 2609.35954) keeps the whole historical trajectory as context and applies the loss
only to selected model-generated tokens. :func:`masked_nll` is that loss as a pure function;
:func:`train_masked_sft` is a small torch loop around it: length-grouped batches (rows sorted by
length, cut into batches, batch order shuffled each epoch) with right padding, AdamW, gradient
clipping, a linear warm-up. Departure: the paper's batch size, learning rate and packing are not
public; the defaults here are sized for a 135M model on CPU (the seed's 3 epochs kept).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def masked_nll(logits: Any, input_ids: Any, loss_mask: Any) -> tuple[Any, Any]:
    """Mean next-token NLL over exactly the masked-in target tokens.

    Shapes: ``logits [B, T, V]``, ``input_ids [B, T]``, ``loss_mask [B, T]`` (1 = token ``t`` is a
    target, predicted from positions ``< t``). Returns ``(loss, n_tokens)``; ``loss`` is
    ``sum_t mask[t] * -log p(x_t | x_<t) / sum_t mask[t]`` (0 when nothing is masked in).
    Position 0 can never be a target (nothing precedes it).

    Example: one sequence whose two targets have p = 0.5 and 0.25 → loss = (ln 2 + ln 4) / 2.
    """
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    tgt = input_ids[:, 1:].long()
    m = loss_mask[:, 1:].to(logp.dtype)
    nll = -logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    n = m.sum()
    return (nll * m).sum() / n.clamp_min(1.0), n


def length_grouped_batches(lengths: Sequence[int], batch_size: int, seed: int) -> list[list[int]]:
    """Indices sorted by length, cut into batches of ``batch_size``, batches shuffled by ``seed``.

    Example: lengths [5, 1, 4, 2], batch 2 → batches {[1, 3], [2, 0]} in a seeded order.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)
    return batches


def collate(rows: Sequence[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Right-pad ``input_ids``/``loss_mask`` to the batch's longest row; padding is masked out."""
    import torch

    t = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), t), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), t), dtype=torch.long)
    mask = torch.zeros((len(rows), t), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"], dtype=torch.long)
        att[i, :n] = 1
        mask[i, :n] = torch.tensor(r["loss_mask"], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": att, "loss_mask": mask}


@dataclass
class SFTResult:
    out_dir: Path | None
    steps: int
    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir) if self.out_dir else None, "steps": self.steps,
                "first_loss": self.losses[0] if self.losses else None,
                "last_loss": self.losses[-1] if self.losses else None, "tokens": self.tokens,
                "seconds": round(self.seconds, 2)}


def train_masked_sft(
    model: Any,
    rows: Sequence[dict[str, Any]],
    pad_id: int,
    epochs: int = 3,
    lr: float = 1e-5,
    batch_size: int = 8,
    grad_clip: float = 1.0,
    warmup_frac: float = 0.1,
    weight_decay: float = 0.0,
    seed: int = 0,
    out_dir: str | Path | None = None,
    tokenizer: Any = None,
    progress: bool = False,
) -> SFTResult:
    """Train ``model`` (a causal LM, modified in place) on ``rows`` with :func:`masked_nll`.

    ``rows``: dicts with ``input_ids`` and ``loss_mask`` (as written by :mod:`gfcr.ross.build`).
    Saves model (and ``tokenizer``) to ``out_dir`` if given (a new folder).
    """
    import torch

    if not rows:
        raise ValueError("no training rows")
    if out_dir is not None and Path(out_dir).exists() and any(Path(out_dir).iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty; choose a new folder")
    torch.manual_seed(seed)
    lengths = [len(r["input_ids"]) for r in rows]
    steps_per_epoch = math.ceil(len(rows) / batch_size)
    total = steps_per_epoch * epochs
    warm = max(1, int(total * warmup_frac))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    model.train()
    res = SFTResult(Path(out_dir) if out_dir else None, 0)
    t0 = time.perf_counter()
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("masked SFT", total=total)
    for ep in range(epochs):
        for idx in length_grouped_batches(lengths, batch_size, seed + ep):
            b = collate([rows[i] for i in idx], pad_id)
            if b["loss_mask"][:, 1:].sum() == 0:
                continue
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
            loss, n = masked_nll(out.logits, b["input_ids"], b["loss_mask"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            sched.step()
            res.steps += 1
            res.tokens += int(n)
            res.losses.append(float(loss.detach()))
            if bar is not None:
                bar.update(task, advance=1, description=f"masked SFT ep {ep + 1} loss {res.losses[-1]:.3f}")
    if bar is not None:
        bar.stop()
    model.eval()
    res.seconds = time.perf_counter() - t0
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out_dir))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(out_dir))
        (Path(out_dir) / "sft.json").write_text(json.dumps({**res.to_dict(), "epochs": epochs, "lr": lr,
                                                            "batch_size": batch_size, "seed": seed}, indent=2))
    return res


@dataclass
class NLLStats:
    mean_nll: float
    tokens: int


def mean_token_nll(model: Any, rows: Sequence[dict[str, Any]], pad_id: int, batch_size: int = 8) -> NLLStats:
    """Mean per-token NLL of the masked-in tokens of ``rows`` under ``model`` (compatibility)."""
    import torch

    tot, n = 0.0, 0
    model.eval()
    with torch.no_grad():
        for idx in length_grouped_batches([len(r["input_ids"]) for r in rows], batch_size, 0):
            b = collate([rows[i] for i in idx], pad_id)
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
            loss, k = masked_nll(out.logits, b["input_ids"], b["loss_mask"])
            tot += float(loss) * int(k)
            n += int(k)
    return NLLStats(tot / max(n, 1), n)
