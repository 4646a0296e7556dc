"""The policy update: stored rollouts + advantages → optimizer steps on the policy (one per PPO mini-batch and epoch).

Rollouts are right-padded into ``[B, T]`` batches straight from their stored ``token_ids``; the loss
mask is ``token_role == 1`` (only generated tokens learn) and the behaviour log-probs are the stored
``logprobs`` (aligned to each token, 0 on context). Micro-batches accumulate gradients with the
batch's global denominators, so the step is the same as one big batch (tested in test_losses).
An advantage is one float per rollout (group advantages) or a per-token array aligned to its
``token_ids`` (tree advantages, TreeRL); a batch mixing both is padded to ``[B, T]``.
The training forward divides logits by the sampling temperature, so the importance ratio of an
on-policy rollout is 1 up to numerics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gfcr.records import GENERATED, Rollout
from gfcr.train import dist
from gfcr.train.config import LossConfig, OptimConfig
from gfcr.train.losses import (
    masked_row_mean,
    policy_gradient_loss,
    token_entropy,
    token_logprobs,
    truncated_is_weight,
)


@dataclass
class Batch:
    """Padded tensors of a list of rollouts. Shapes: ``[B, T]``; ``advantages`` ``[B]`` or ``[B, T]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logp: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor | None = None  # [B] loss weight per row (None = all 1)
    shaping: torch.Tensor | None = None  # [B] ExGRPO γ per row (0 = the clipped ratio)


Advantage = float | np.ndarray  # one per rollout, or per token (aligned to token_ids)


def is_live(advantage: Advantage) -> bool:
    """Whether an advantage (a float or a per-token array) is non-zero anywhere."""
    return bool(np.any(np.asarray(advantage) != 0.0))


def _advantage_tensor(rollouts: Sequence[Rollout], advantages: Sequence[Advantage], T: int) -> torch.Tensor:
    """``[B]`` when every advantage is a float, else ``[B, T]`` (floats broadcast over their row)."""
    if all(np.ndim(a) == 0 for a in advantages):
        return torch.tensor([float(a) for a in advantages], dtype=torch.float32)
    out = torch.zeros((len(rollouts), T), dtype=torch.float32)
    for i, (r, a) in enumerate(zip(rollouts, advantages, strict=True)):
        if np.ndim(a) == 0:
            out[i, :] = float(a)
            continue
        a = np.asarray(a, dtype=np.float32)
        if a.shape != (len(r.token_ids),):
            raise ValueError(
                f"rollout {r.rollout_id}: per-token advantages have shape {a.shape}, expected ({len(r.token_ids)},) "
                "(one per token_ids entry)"
            )
        out[i, : len(a)] = torch.from_numpy(a)
    return out


def collate(rollouts: Sequence[Rollout], advantages: Sequence[Advantage], pad_id: int, mask_truncated: bool = False,
            weights: Sequence[float] | None = None, shaping: Sequence[float] | None = None) -> Batch:
    """Right-pad rollouts into a :class:`Batch`; ``mask_truncated`` drops rollouts cut at max length
    (DAPO's overlong filter, :func:`gfcr.control.groups.overlong_mask`)."""
    from gfcr.control.groups import overlong_mask

    if len(rollouts) != len(advantages):
        raise ValueError(f"{len(rollouts)} rollouts but {len(advantages)} advantages")
    B = len(rollouts)
    T = max(len(r.token_ids) for r in rollouts)
    ids = torch.full((B, T), int(pad_id), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    blp = torch.zeros((B, T), dtype=torch.float32)
    keep = overlong_mask([r.finish_reason for r in rollouts]) if mask_truncated else np.ones(B, dtype=np.uint8)
    for i, r in enumerate(rollouts):
        n = len(r.token_ids)
        ids[i, :n] = torch.from_numpy(np.asarray(r.token_ids, dtype=np.int64))
        attn[i, :n] = 1
        if keep[i]:
            mask[i, :n] = torch.from_numpy(np.asarray(r.token_role) == GENERATED)
        blp[i, :n] = torch.from_numpy(np.asarray(r.logprobs, dtype=np.float32))
    mask[:, 0] = False  # the first token has no prediction
    w = None if weights is None or all(float(x) == 1.0 for x in weights) else torch.tensor([float(x) for x in weights])
    sh = None if shaping is None or not any(shaping) else torch.tensor([float(x or 0.0) for x in shaping])
    return Batch(ids, attn, mask, blp, _advantage_tensor(rollouts, advantages, T), w, sh)


class PolicyTrainer:
    """Owns the optimizer; ``update(rollouts, advantages)`` runs ``epochs`` optimizer steps.

    ``ref_model`` (frozen) is needed only when ``loss.kl_coef > 0``. After an update,
    ``last_importance_weight`` ``[B]`` holds each rollout's mean importance weight ``π_θ/μ`` over its
    generated tokens at the start of the update (truncated at ``tis_cap`` when set; ``nan`` for a
    rollout not run forward): ~1 for fresh rollouts, the off-policy gap for replayed ones.
    """

    def __init__(
        self,
        model: Any,
        loss: LossConfig,
        optim: OptimConfig,
        pad_id: int,
        temperature: float = 1.0,
        ref_model: Any = None,
    ):
        self.model = model
        self.loss_cfg = loss
        self.optim_cfg = optim
        self.pad_id = int(pad_id)
        self.temperature = float(temperature)
        self.ref_model = ref_model
        if loss.kl_coef > 0 and ref_model is None:
            raise ValueError("loss.kl_coef > 0 needs a reference model")
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=optim.lr, weight_decay=optim.weight_decay, betas=tuple(optim.betas)
        )
        self.last_importance_weight = np.zeros(0)

    def _logits(self, model: Any, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False)
        return out.logits.float() / self.temperature

    def _logp_no_grad(self, model: Any, batch: Batch, mb: int) -> torch.Tensor:
        dev = next(model.parameters()).device
        outs = []
        with torch.no_grad():
            for s in range(0, batch.input_ids.shape[0], mb):
                ids = batch.input_ids[s : s + mb].to(dev)
                outs.append(token_logprobs(self._logits(model, ids, batch.attention_mask[s : s + mb].to(dev)), ids).cpu())
        return torch.cat(outs)

    def rollout_entropy(self, rollouts: Sequence[Rollout]) -> np.ndarray:
        """Mean token entropy of each rollout's generated tokens under the current policy, ``[B]``.

        The entropy is that of ``softmax(logits / temperature)``, the distribution sampled from (with
        ``top_p = 1``); taken before the update it is the sampling policy's. One no-grad forward per
        micro-batch; a rollout without generated tokens gets ``nan``.
        """
        if not rollouts:
            return np.zeros(0)
        batch = collate(rollouts, [0.0] * len(rollouts), self.pad_id)
        dev = next(self.model.parameters()).device
        mb = self.optim_cfg.micro_batch
        out = []
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            for s in range(0, batch.input_ids.shape[0], mb):
                ids = batch.input_ids[s : s + mb].to(dev)
                ent = token_entropy(self._logits(self.model, ids, batch.attention_mask[s : s + mb].to(dev)))
                out.append(masked_row_mean(ent, batch.loss_mask[s : s + mb].to(dev)).cpu())
        self.model.train(was_training)
        return torch.cat(out).numpy().astype(np.float64)

    def update(self, rollouts: Sequence[Rollout], advantages: Sequence[Advantage], weights: Sequence[float] | None = None,
               shaping: Sequence[float | None] | None = None) -> dict[str, float]:
        """Train on the rollouts; returns statistics (last epoch). ``weights`` (loss weight per row) and
        ``shaping`` (ExGRPO γ per row; None/0 = the clipped ratio) come from the batch's ``TrainItem`` s.

        The batch is cut, in order, into PPO mini-batches of ``optim.mini_batch`` rollouts (``None``:
        the whole batch is one); each epoch takes one optimizer step per mini-batch with that
        mini-batch's denominators; ``micro_batch`` only splits the forward/backward inside a step
        (``n_optimizer_steps = epochs × mini-batches``). ``kl``, ``clip_frac``, ``ratio_mean`` and
        ``entropy`` are means over the generated tokens of the rollouts run forward in the last epoch
        (non-zero advantage, or all when ``kl_coef > 0``); ``grad_norm`` is the mean over its steps. A
        mini-batch whose advantages are all 0 takes no step; with none to take, ``skipped = 1``.
        """
        self.last_importance_weight = np.full(len(rollouts), np.nan)
        if not rollouts:
            return {}
        lc, oc = self.loss_cfg, self.optim_cfg
        def batch_of(rows: Sequence[int]) -> Batch:
            return collate([rollouts[i] for i in rows], [advantages[i] for i in rows], self.pad_id, lc.mask_truncated,
                           None if weights is None else [weights[i] for i in rows],
                           None if shaping is None else [shaping[i] for i in rows])

        size = oc.mini_batch or len(rollouts)
        chunks = [list(range(s, min(s + size, len(rollouts)))) for s in range(0, len(rollouts), size)]
        n_tok_all, plans = 0.0, []
        for c in chunks:
            full = batch_of(c)
            n_tok = float(full.loss_mask.sum())
            n_tok_all += n_tok
            # Rollouts with advantage 0 add exactly zero loss and gradient when there is no KL term: they
            # count in the denominators (n_tok, n_seq, of their mini-batch) but are not run forward.
            live = [i for i in c if is_live(advantages[i])] if lc.kl_coef == 0 else list(c)
            if n_tok > 0 and live:
                plans.append((live, n_tok, float(len(c))))
        n_seq_all = float(len(rollouts))
        if n_tok_all == 0:
            return {"n_tokens": 0.0, "n_seqs": n_seq_all, "skipped": 1.0}
        if not plans:
            return {"n_tokens": n_tok_all, "n_seqs": n_seq_all, "n_forward": 0.0, "skipped": 1.0}
        mb = oc.micro_batch
        batches = []
        for live, n_tok, n_seq in plans:
            mine = dist.shard(live)  # data parallel: this rank's rows (all of them in one process)
            batch = batch_of(mine) if mine else None
            ref = self._logp_no_grad(self.ref_model, batch, mb) if lc.kl_coef > 0 and batch is not None else None
            prox = self._logp_no_grad(self.model, batch, mb) if lc.tis_cap is not None and batch is not None else None
            batches.append((live, mine, batch, n_tok, n_seq, ref, prox))
        self.model.train()
        stats: dict[str, float] = {}
        for epoch in range(oc.epochs):
            acc = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip": 0.0, "ratio": 0.0, "entropy": 0.0, "live_tok": 0.0}
            norms = []
            for _live, mine, batch, n_tok, n_seq, ref, prox in batches:
                gn, iw = self._optimizer_step(batch, n_tok, n_seq, ref, prox, acc, record_iw=epoch == 0)
                norms.append(gn)
                if batch is not None:
                    acc["live_tok"] += float(batch.loss_mask.sum())
                if epoch == 0:  # π_θ/μ per rollout at the first pass over its mini-batch
                    for rows, ws in dist.all_gather((mine, iw)):
                        if ws is not None:
                            self.last_importance_weight[rows] = ws
            acc = dist.all_reduce_sums(acc)
            live_tok = max(acc["live_tok"], 1.0)
            stats = {
                "loss": acc["loss"],
                "pg_loss": acc["pg_loss"],
                "kl": acc["kl"] / live_tok,
                "clip_frac": acc["clip"] / live_tok,
                "ratio_mean": acc["ratio"] / live_tok,
                "entropy": acc["entropy"] / live_tok,
                "grad_norm": float(np.mean(norms)),
                "n_tokens": n_tok_all,
                "n_seqs": n_seq_all,
                "n_forward": float(sum(len(b[0]) for b in batches)),
                "world_size": float(dist.world()),
                "n_optimizer_steps": float(oc.epochs * len(batches)),
            }
        self.model.eval()
        self.optimizer.zero_grad(set_to_none=True)
        return stats

    def _optimizer_step(self, batch: Batch | None, n_tok: float, n_seq: float, ref: torch.Tensor | None,
                        prox: torch.Tensor | None, acc: dict[str, float], record_iw: bool) -> tuple[float, np.ndarray | None]:
        """One optimizer step over ``batch`` (gradients accumulated over micro-batches with the
        mini-batch's denominators ``n_tok``/``n_seq``, then summed over ranks); adds to ``acc``;
        returns the gradient norm and, when ``record_iw``, each row's mean importance weight before
        the step. ``batch`` is None on a rank that holds none of the mini-batch's rows: it still
        joins the gradient sum and the step."""
        lc, oc = self.loss_cfg, self.optim_cfg
        mb = oc.micro_batch
        dev = next(self.model.parameters()).device
        self.optimizer.zero_grad(set_to_none=True)
        row_iw: list[torch.Tensor] = []
        n_rows = 0 if batch is None else batch.input_ids.shape[0]
        for s in range(0, n_rows, mb):
            sl = slice(s, s + mb)
            ids = batch.input_ids[sl].to(dev)
            logits = self._logits(self.model, ids, batch.attention_mask[sl].to(dev))
            logp = token_logprobs(logits, ids)
            m = batch.loss_mask[sl].to(dev)
            out = policy_gradient_loss(
                logp,
                batch.behaviour_logp[sl].to(dev),
                batch.advantages[sl].to(dev),
                m,
                clip_low=lc.clip_low if lc.clip else float("inf"),  # inf: the clamp is the identity (no clip)
                clip_high=lc.clip_high if lc.clip else float("inf"),
                agg=lc.agg,
                norm_len=lc.norm_len,
                n_tokens=n_tok,
                n_seqs=n_seq,
                ref_logp=None if ref is None else ref[sl].to(dev),
                kl_coef=lc.kl_coef,
                proximal_logp=None if prox is None else prox[sl].to(dev),
                tis_cap=lc.tis_cap,
                tis_mode=lc.tis_mode,
                sample_weight=None if batch.weights is None else batch.weights[sl].to(dev),
                shaping=None if batch.shaping is None else batch.shaping[sl].to(dev),
            )
            out.loss.backward()
            with torch.no_grad():
                ent = token_entropy(logits.detach())
                acc["entropy"] += float(ent[m].sum())
                if record_iw:
                    w = torch.exp(logp.detach() - batch.behaviour_logp[sl].to(dev))
                    if lc.tis_cap is not None:
                        w = truncated_is_weight(logp.detach(), batch.behaviour_logp[sl].to(dev), lc.tis_cap, lc.tis_mode)
                    row_iw.append(masked_row_mean(w, m).cpu())
            acc["loss"] += float(out.loss.detach())
            acc["pg_loss"] += out.pg_loss
            acc["kl"] += out.kl
            acc["clip"] += out.clip_frac
            acc["ratio"] += out.ratio_mean
            del logits, logp, out
        dist.all_reduce_grads([p for p in self.model.parameters() if p.requires_grad])
        gn = (
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), oc.grad_clip)
            if oc.grad_clip > 0
            else torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in self.model.parameters() if p.grad is not None))
        )
        self.optimizer.step()
        return float(gn), (torch.cat(row_iw).numpy() if record_iw and row_iw else None)
