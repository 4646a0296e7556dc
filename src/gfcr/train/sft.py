"""Masked SFT: teacher-forced cross-entropy on the supervised tokens only (ROSS's objective).

ROSS (arXiv 2609.35954) keeps the whole historical trajectory as context and applies the loss
only to selected model-generated tokens. :func:`gfcr.train.losses.masked_nll` is that loss as a
pure function, beside the policy-gradient losses; :func:`train_masked_sft` is a small torch loop
around it (ROSS's train stage calls it): length-grouped batches (rows sorted by
length, cut into batches, batch order shuffled each epoch) with right padding, AdamW, gradient
clipping, a linear warm-up. Departure: the paper's batch size, learning rate and packing are not
public; the defaults here are sized for a 135M model on CPU (the seed's 3 epochs kept).

Bounded padding: a step's batch is not one ``[B, longest]`` tensor. :func:`split_by_padding` cuts it
into micro-batches of similar length whose padding is at most ``max_pad_fraction`` (5%) of their
tokens, and :func:`sft_step` back-propagates each micro-batch's summed NLL over the whole step's
supervised-token count, so the accumulated gradient is the batch's (same loss, same steps). Sorting
48 log-normal lengths into batches of 8 still padded 15-17% as one tensor, because the long tail's
neighbours differ by tens of tokens.

Packing (``packing=True``) is a layout change only: each step still takes ``batch_size`` sequences
(seeded random batches instead of length-grouped ones), :func:`pack_sequences` fits them into rows of
at most ``max_tokens_per_row`` tokens, and :func:`collate_packed` builds one row per pack with
``position_ids`` restarting at 0 per sequence and a block-diagonal causal 4D attention mask, so no
token sees another sequence. The loss is still the mean NLL over the supervised tokens of the batch,
so a packed step computes the same loss and gradient as the same sequences unpacked.

Checkpoints (``checkpoint_dir``, ``checkpoint_every``): every ``checkpoint_every`` optimizer steps and at
each epoch's end the loop writes the weights, AdamW's moments, the schedule, torch's RNG, the position
(epoch, batch) and the result so far to ``checkpoint_dir/sft_state.pt`` (written to a temporary file,
then renamed). A call with the same rows and arguments finds it and continues from the next batch; the
batch order is a function of ``seed + epoch``, so the resumed run ends with the weights of the
uninterrupted one, bit for bit. A checkpoint of other rows or arguments is refused in one line.
Files are read with ``torch.load(weights_only=True)`` (tensors and plain values only).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

#: The dtypes ``autocast`` takes (the forward passes of masked SFT under ``torch.autocast``).
AutocastDtype = Literal["bfloat16"]
AUTOCAST_DTYPES: tuple[str, ...] = get_args(AutocastDtype)


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


def pack_sequences(lengths: Sequence[int], max_tokens: int, balance: bool = False) -> list[list[int]]:
    """First-fit-decreasing plan of sequences into rows of at most ``max_tokens`` tokens.

    Shapes: ``lengths [N]`` (each >= 1) → a list of rows, each a list of indices into ``lengths``;
    every index appears exactly once. Sequences are placed longest first (ties by index), each into
    the first row it fits; a sequence longer than ``max_tokens`` gets a row of its own. Deterministic.

    ``balance``: keep first-fit-decreasing's number of rows ``R`` but spread the sequences evenly
    over them (longest first, each into the least-filled row, ties by row index), so the rows of one
    ``[R, L]`` tensor need little padding; if that breaks ``max_tokens`` the first-fit plan is kept.

    Example: lengths [5, 3, 8, 2, 4, 11], max_tokens 10 → [[5], [2, 3], [0, 4], [1]]
    (11 alone; 8 + 2 = 10; 5 + 4 = 9; 3 fits nowhere else). With ``balance``: [[5], [2], [0, 3], [4, 1]]
    (row loads 11, 8, 7, 7 instead of 11, 10, 9, 3).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    bad = [i for i, n in enumerate(lengths) if n < 1]
    if bad:
        raise ValueError(f"sequences must have at least 1 token; empty at indices {bad[:10]}")
    rows: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = lengths[i]
        for r, u in enumerate(used):
            if u + n <= max_tokens:
                rows[r].append(i)
                used[r] += n
                break
        else:
            rows.append([i])
            used.append(n)
    if not balance or len(rows) < 2:
        return rows
    even: list[list[int]] = [[] for _ in rows]
    load = [0] * len(rows)
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        r = min(range(len(rows)), key=lambda k: (load[k], k))
        even[r].append(i)
        load[r] += lengths[i]
    if all(len(row) == 1 or ld <= max_tokens for row, ld in zip(even, load, strict=True)):
        return even
    return rows


def collate_packed(packs: Sequence[Sequence[dict[str, Any]]], pad_id: int) -> dict[str, Any]:
    """Concatenate each pack's sequences into one row, with no attention across sequences.

    ``packs``: ``B`` packs, each a list of rows (dicts with ``input_ids`` and ``loss_mask``). Returns,
    with ``L`` the longest pack (shorter packs right-padded with ``pad_id``):

    - ``input_ids [B, L]``, ``position_ids [B, L]`` (0, 1, … restarting at each sequence; 0 on padding);
    - ``attention_mask [B, 1, L, L]`` bool, True where query ``q`` may attend to key ``k``: same
      sequence and ``k <= q`` (block-diagonal causal); a padding position attends only to itself;
      pass it to the model through :func:`additive_mask`;
    - ``loss_mask [B, L]``: each sequence's mask, with its first token set to 0 (a sequence's first
      token is never predicted from the previous sequence's last token), 0 on padding;
    - ``labels [B, L]``: ``input_ids`` where ``loss_mask`` is 1, else -100 (HF's ``labels`` convention);
    - ``seq_ids [B, L]``: index of the sequence within its pack, -1 on padding.

    Example: one pack of sequences [7, 8] and [9], mask 1s → input_ids [[7, 8, 9]],
    position_ids [[0, 1, 0]], loss_mask [[0, 1, 0]], token 9 attends only to itself.
    """
    import torch

    if not packs or any(not p for p in packs):
        raise ValueError("collate_packed needs at least one pack and no empty packs")
    lens = [sum(len(r["input_ids"]) for r in p) for p in packs]
    b, t = len(packs), max(lens)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    pos = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.long)
    seg = torch.full((b, t), -1, dtype=torch.long)
    for i, p in enumerate(packs):
        o = 0
        for j, r in enumerate(p):
            n = len(r["input_ids"])
            if len(r["loss_mask"]) != n:
                raise ValueError(f"pack {i} row {j}: loss_mask has {len(r['loss_mask'])} entries for {n} tokens")
            ids[i, o : o + n] = torch.tensor(r["input_ids"], dtype=torch.long)
            mask[i, o : o + n] = torch.tensor(r["loss_mask"], dtype=torch.long)
            mask[i, o] = 0
            pos[i, o : o + n] = torch.arange(n)
            seg[i, o : o + n] = j
            o += n
    idx = torch.arange(t)
    causal = idx[None, :] <= idx[:, None]  # [L, L]: key k <= query q
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
    att = (same & causal) | torch.eye(t, dtype=torch.bool)
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "position_ids": pos, "attention_mask": att[:, None], "loss_mask": mask,
            "labels": labels, "seq_ids": seg}


def additive_mask(mask: Any, dtype: Any) -> Any:
    """Boolean attention mask (True = attend) → additive float mask: 0 where True, the dtype's min elsewhere.

    Shapes: ``mask [B, 1, L, L]`` → same shape in ``dtype``. Transformers passes a 4D mask through
    unchanged; its eager attention adds the mask to the scores, so it must be additive (sdpa accepts both).
    """
    import torch

    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def packed_batches(lengths: Sequence[int], batch_size: int, max_tokens: int, seed: int) -> list[list[list[int]]]:
    """Seeded random batches of ``batch_size`` sequences, each planned into balanced rows by :func:`pack_sequences`.

    Returns batches → rows → indices into ``lengths``. Each batch holds the same sequences a padded
    step of ``batch_size`` would, so the number of optimiser steps does not change.
    """
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    out = []
    for s in range(0, len(order), batch_size):
        chunk = order[s : s + batch_size]
        plan = pack_sequences([lengths[i] for i in chunk], max_tokens, balance=True)
        out.append([[chunk[k] for k in row] for row in plan])
    return out


def split_by_padding(row_lengths: Sequence[int], max_pad_fraction: float = 0.05) -> list[list[int]]:
    """Group one step's rows into micro-batches whose padding is at most ``max_pad_fraction`` each.

    Shapes: ``row_lengths [R]`` (tokens per row; a row is one sequence, or one packed row) → a list of
    micro-batches, each a list of row indices; every index appears exactly once. A micro-batch is a
    ``[r, L]`` tensor with ``L`` its longest row, so its padding is ``1 - sum / (r * L)``. Rows are taken
    longest first (ties by index) and each joins the current micro-batch while that stays within
    ``max_pad_fraction``; otherwise it opens the next one. A shorter row can only raise the padding,
    so the micro-batches are contiguous in that order. ``max_pad_fraction >= 1`` gives one micro-batch
    (the whole step as one tensor); ``0`` gives one per distinct length. Deterministic.

    Example: lengths [100, 400, 390, 120, 98], 5% → [[1, 2], [3], [0, 4]]: 400 + 390 pads 10 of 800
    (1.3%); adding 120 would pad 24%; 120 + 100 would pad 8.3%; 100 + 98 pads 2 of 200 (1%). The
    single tensor would be [5, 400] with 1,108 tokens of 2,000 real: 44.6% padding.
    """
    if max_pad_fraction < 0:
        raise ValueError(f"max_pad_fraction must be >= 0, got {max_pad_fraction}")
    out: list[list[int]] = []
    longest = real = 0
    for i in sorted(range(len(row_lengths)), key=lambda j: (-row_lengths[j], j)):
        n = row_lengths[i]
        if out and 1 - (real + n) / (longest * (len(out[-1]) + 1)) <= max_pad_fraction + 1e-12:
            out[-1].append(i)
            real += n
        else:
            out.append([i])
            longest, real = n, n
    return out


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AVX512-BF16 or AMX, as oneDNN reports).
    Without that, torch falls back to a reference kernel: a masked-SFT step of SmolLM2-135M in bfloat16
    autocast took ~150 s against ~3.8 s in float32 on an AVX2-only AMD EPYC (2 cores, load ~1)."""
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def sft_step(model: Any, rows: Sequence[dict[str, Any]], step_rows: Sequence[Sequence[int]], pad_id: int,
             packing: bool = False, max_pad_fraction: float = 0.05, autocast: str | None = None) -> dict[str, Any]:
    """Forward + backward of one masked-SFT step, as micro-batches of bounded padding (no optimiser step).

    ``step_rows``: the step's rows, each a list of indices into ``rows`` (one index per row unless
    ``packing``). The rows are grouped by :func:`split_by_padding`; each micro-batch is collated
    (:func:`collate`, or :func:`collate_packed` when ``packing``), and its summed NLL divided by the
    **whole step's** supervised-token count is back-propagated. The accumulated gradient is therefore
    that of :func:`~gfcr.train.losses.masked_nll` over the step's sequences as one batch: the mean over
    the batch's supervised tokens, whatever the layout (tested against one sequence per row).

    ``autocast``: ``"bfloat16"`` runs each forward under ``torch.autocast`` in bfloat16 (weights, gradients
    and optimiser state stay in their own dtype; the NLL is taken on the logits cast back to float32).
    On a CPU with AMX a SmolLM2-135M step of 8 × 120 tokens took 5.3 s against 7.8 s in float32
    (``bench/sft_autocast_bench.py``, medians); ``None``: the weights' dtype.

    Returns ``loss`` (float, that mean), ``n`` (supervised targets), ``slots`` (tokens processed,
    padding included), ``real`` (tokens of the sequences) and ``forwards`` (micro-batches run);
    ``n == 0`` means nothing was run; a micro-batch without targets is skipped and not counted.
    Gradients accumulate into ``.grad`` (zero them before).
    """
    import torch

    from gfcr.train.losses import masked_nll

    if autocast is not None and autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast must be one of {sorted(AUTOCAST_DTYPES)} or None, got {autocast!r}")
    n_step = sum(sum(rows[i]["loss_mask"][1:]) for row in step_rows for i in row)
    res = {"loss": 0.0, "n": int(n_step), "slots": 0, "real": 0, "forwards": 0}
    if n_step == 0:
        return res
    param = next(model.parameters())
    dtype = getattr(torch, autocast) if autocast else param.dtype
    lens = [sum(len(rows[i]["input_ids"]) for i in row) for row in step_rows]
    for mb in split_by_padding(lens, max_pad_fraction):
        if packing:
            b = collate_packed([[rows[i] for i in step_rows[k]] for k in mb], pad_id)
            fwd = {"input_ids": b["input_ids"], "position_ids": b["position_ids"],
                   "attention_mask": additive_mask(b["attention_mask"], dtype)}
        else:
            b = collate([rows[i] for k in mb for i in step_rows[k]], pad_id)
            fwd = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
        if b["loss_mask"][:, 1:].sum() == 0:
            continue
        # batches are built on the CPU; the model may live on an accelerator (``.to`` its own device is a no-op)
        fwd = {k: v.to(param.device) for k, v in fwd.items()}
        b = {**b, "input_ids": b["input_ids"].to(param.device), "loss_mask": b["loss_mask"].to(param.device)}
        res["slots"] += b["input_ids"].numel()
        res["real"] += sum(lens[k] for k in mb)
        res["forwards"] += 1
        with torch.autocast(param.device.type, dtype=dtype, enabled=autocast is not None):
            logits = model(**fwd).logits
        mean, n = masked_nll(logits.float() if autocast else logits, b["input_ids"], b["loss_mask"])
        part = mean * n / n_step
        part.backward()
        res["loss"] += float(part.detach())
    return res


@dataclass
class SFTResult:
    out_dir: Path | None
    steps: int
    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    slots: int = 0
    real: int = 0
    forwards: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Summary; ``tokens`` are supervised targets, ``tokens_processed`` the slots of every forward
        (padding included), ``real_tokens`` the sequences' tokens, ``pad_fraction = 1 - real / processed``."""
        return {"out_dir": str(self.out_dir) if self.out_dir else None, "steps": self.steps,
                "first_loss": self.losses[0] if self.losses else None,
                "last_loss": self.losses[-1] if self.losses else None, "tokens": self.tokens,
                "seconds": round(self.seconds, 2), "tokens_processed": self.slots, "real_tokens": self.real,
                "forwards": self.forwards,
                "pad_fraction": round(1 - self.real / self.slots, 4) if self.slots else None}


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
    packing: bool = False,
    max_tokens_per_row: int = 1024,
    max_pad_fraction: float = 0.05,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    autocast: str | None = None,
) -> SFTResult:
    """Train ``model`` (a causal LM, modified in place) on ``rows`` with :func:`~gfcr.train.losses.masked_nll`.

    Long because: the SFT loop in one place: argument checks, batches, epochs, accumulation, the learning-rate
    schedule and the saved checkpoint, in the order they run.

    ``rows``: dicts with ``input_ids`` and ``loss_mask`` (as written by :mod:`gfcr.ross.build`).
    Saves model (and ``tokenizer``) to ``out_dir`` if given (a new folder).
    ``packing``: each step's ``batch_size`` sequences (seeded random batches) are packed into rows of at
    most ``max_tokens_per_row`` tokens without cross-sequence attention (see :func:`collate_packed`);
    off by default (length-grouped padded batches). ``max_pad_fraction``: each step runs as micro-batches
    whose padding is at most this fraction of their tokens (:func:`split_by_padding`, gradients
    accumulated; 1.0 = the whole step as one tensor). The loss is the mean over the step's supervised
    tokens whatever the layout (:func:`sft_step`). Packing needs an attention implementation that
    takes a 4D mask (eager, sdpa). ``checkpoint_dir``: resumable state (see the module docstring), saved every
    ``checkpoint_every`` steps (0: only at epoch ends) and resumed from when it matches these rows and arguments.
    ``autocast``: ``"bfloat16"`` runs the forwards in bfloat16 autocast (see :func:`sft_step`); the saved
    model keeps the weights' dtype.
    """
    import torch

    if not rows:
        raise ValueError("no training rows")
    if out_dir is not None and Path(out_dir).exists() and any(Path(out_dir).iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty; choose a new folder")
    if packing and max_tokens_per_row < 1:
        raise ValueError(f"max_tokens_per_row must be >= 1, got {max_tokens_per_row}")
    if max_pad_fraction < 0:
        raise ValueError(f"max_pad_fraction must be >= 0, got {max_pad_fraction}")
    if packing:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if impl not in (None, "eager", "sdpa"):
            raise ValueError(f"packing builds a 4D attention mask, which attention {impl!r} does not take here; "
                             "load the model with attn_implementation='sdpa' or 'eager', or set packing=False")
    if autocast == "bfloat16" and next(model.parameters()).device.type == "cpu" and not cpu_has_bf16_matmul():
        warnings.warn("bfloat16 autocast on a CPU without bfloat16 matrix units (no AVX512-BF16/AMX): "
                      "each step can run tens of times slower than float32; set autocast to None", stacklevel=2)
    torch.manual_seed(seed)
    lengths = [len(r["input_ids"]) for r in rows]
    steps_per_epoch = math.ceil(len(rows) / batch_size)
    total = steps_per_epoch * epochs
    warm = max(1, int(total * warmup_frac))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    model.train()
    res = SFTResult(Path(out_dir) if out_dir else None, 0)
    ckpt = Path(checkpoint_dir) / "sft_state.pt" if checkpoint_dir is not None else None
    key = sft_fingerprint(rows, epochs=epochs, lr=lr, batch_size=batch_size, grad_clip=grad_clip,
                          warmup_frac=warmup_frac, weight_decay=weight_decay, seed=seed, packing=packing,
                          max_tokens_per_row=max_tokens_per_row, max_pad_fraction=max_pad_fraction,
                          **({"autocast": autocast} if autocast else {}))
    start = (0, 0)
    prior_s = 0.0
    if ckpt is not None and ckpt.exists():
        start, prior_s = _load_sft_state(ckpt, key, model, opt, sched, res)
    t0 = time.perf_counter()
    bar = None
    if progress:
        from rich.console import Console
        from rich.progress import Progress

        bar = Progress(transient=True, console=Console(stderr=True))
        bar.start()
        task = bar.add_task("masked SFT", total=total, completed=start[0] * steps_per_epoch + start[1])
    for ep in range(start[0], epochs):
        if packing:
            batches = packed_batches(lengths, batch_size, max_tokens_per_row, seed + ep)
        else:
            batches = [[[i] for i in idx] for idx in length_grouped_batches(lengths, batch_size, seed + ep)]
        for bi, bt in enumerate(batches):
            if ep == start[0] and bi < start[1]:
                continue
            opt.zero_grad(set_to_none=True)
            st = sft_step(model, rows, bt, pad_id, packing, max_pad_fraction, autocast)
            if st["n"] == 0:
                continue
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            sched.step()
            res.steps += 1
            res.tokens += st["n"]
            res.slots += st["slots"]
            res.real += st["real"]
            res.forwards += st["forwards"]
            res.losses.append(st["loss"])
            if ckpt is not None and checkpoint_every and res.steps % checkpoint_every == 0:
                _save_sft_state(ckpt, key, (ep, bi + 1), model, opt, sched, res, prior_s + time.perf_counter() - t0)
            if bar is not None:
                bar.update(task, advance=1, description=f"masked SFT ep {ep + 1} loss {res.losses[-1]:.3f} "
                                                        f"pad {1 - res.real / max(res.slots, 1):.1%}")
        if ckpt is not None:
            _save_sft_state(ckpt, key, (ep + 1, 0), model, opt, sched, res, prior_s + time.perf_counter() - t0)
    if bar is not None:
        bar.stop()
    model.eval()
    res.seconds = prior_s + time.perf_counter() - t0
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out_dir))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(out_dir))
        (Path(out_dir) / "sft.json").write_text(json.dumps({**res.to_dict(), "epochs": epochs, "lr": lr,
                                                            "batch_size": batch_size, "seed": seed,
                                                            "packing": packing,
                                                            "max_tokens_per_row": max_tokens_per_row,
                                                            "max_pad_fraction": max_pad_fraction,
                                                            "autocast": autocast}, indent=2))
    return res


def sft_fingerprint(rows: Sequence[dict[str, Any]], **args: Any) -> str:
    """SHA-256 over the rows' ``input_ids`` and ``loss_mask`` and the training arguments: what a checkpoint
    must match to be resumed."""
    h = hashlib.sha256(json.dumps(args, sort_keys=True).encode())
    for r in rows:
        h.update(json.dumps([list(map(int, r["input_ids"])), list(map(int, r["loss_mask"]))]).encode())
    return h.hexdigest()


def _save_sft_state(path: Path, key: str, pos: tuple[int, int], model: Any, opt: Any, sched: Any,
                    res: SFTResult, seconds: float) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"key": key, "pos": list(pos), "model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict(), "rng": torch.get_rng_state(), "seconds": seconds,
                "res": {"steps": res.steps, "losses": res.losses, "tokens": res.tokens, "slots": res.slots,
                        "real": res.real, "forwards": res.forwards}}, tmp)
    os.replace(tmp, path)


def _load_sft_state(path: Path, key: str, model: Any, opt: Any, sched: Any, res: SFTResult) -> tuple[tuple[int, int], float]:
    import torch

    st = torch.load(path, map_location="cpu", weights_only=True)
    if st.get("key") != key:
        raise ValueError(f"{path} is a checkpoint of other rows or training arguments; use a new checkpoint_dir "
                         "or delete it to start over")
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    sched.load_state_dict(st["sched"])
    torch.set_rng_state(st["rng"])
    for k, v in st["res"].items():
        setattr(res, k, v)
    return (int(st["pos"][0]), int(st["pos"][1])), float(st["seconds"])


@dataclass
class NLLStats:
    mean_nll: float
    tokens: int


def mean_token_nll(model: Any, rows: Sequence[dict[str, Any]], pad_id: int, batch_size: int = 8) -> NLLStats:
    """Mean per-token NLL of the masked-in tokens of ``rows`` under ``model`` (compatibility).

    Length-grouped batches, each run as micro-batches of at most 5% padding (:func:`split_by_padding`).
    """
    import torch

    from gfcr.train.losses import masked_nll

    tot, n = 0.0, 0
    dev = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        lengths = [len(r["input_ids"]) for r in rows]
        for idx in length_grouped_batches(lengths, batch_size, 0):
            for mb in split_by_padding([lengths[i] for i in idx]):
                b = {k: v.to(dev) for k, v in collate([rows[idx[k]] for k in mb], pad_id).items()}
                out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
                loss, k = masked_nll(out.logits, b["input_ids"], b["loss_mask"])
                tot += float(loss) * int(k)
                n += int(k)
    return NLLStats(tot / max(n, 1), n)
