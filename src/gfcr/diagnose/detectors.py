"""Detectors for rollout pathologies: a rule over the per-step metrics of one run each.

Each detector reads the series of :func:`gfcr.diagnose.metrics.step_metrics` for one run, applies
a threshold rule from :class:`DetectorConfig`, and when it fires returns a :class:`Finding` that
names the GFCR module to look at and the levers to try. The pathology names follow the GFCR
survey's diagnostic index (Surana et al., 2026; its own table was not retrievable, so the
pathology → lever mapping here is our synthesis from the methods' papers, cited per detector).

Rules look at the last ``window`` steps (a mean over them) unless they are about a trend, which is
fitted over the whole run. A detector with too little data (fewer steps than it needs, or the
metric is null throughout, e.g. no replayed rows) stays quiet.

A detector fires only on the evidence it names, and the finding carries that evidence: ``rows``,
the per-step values of the metrics it read (:attr:`reads`) over the steps it judged. So a store
with no verdicts gets no success-rate finding (``zero_reward`` reads ``verified_rate`` only);
rewards nothing scored (no verdict, empty verifier record: what ``gfcr generate`` writes without a
verifier) are not read as zero-variance waste or noise; a length finding needs the length to have
grown; truncation is its own finding, judged on the 95% lower confidence bound of its rate (one
truncated answer of four is not a 20% truncation rate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import Field

from gfcr.config import StrictModel
from gfcr.diagnose.metrics import by_run, relative_growth

Series = dict[str, np.ndarray]


@dataclass
class Finding:
    """A detector that fired on a run: what it saw, where to look, what to try."""

    detector: str
    run_id: str
    title: str
    message: str
    module: str
    levers: list[str]
    evidence: dict[str, float] = field(default_factory=dict)
    severity: str = "warning"  # "warning" or "critical" (value at least twice past the threshold)
    rows: list[dict[str, float | None]] = field(default_factory=list)  # per judged step: step + the metrics read

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tail_mean(x: np.ndarray, window: int) -> float:
    """Mean of the finite values among the last ``window`` entries of ``x`` (nan if none)."""
    tail = np.asarray(x, float)[-window:]
    tail = tail[np.isfinite(tail)]
    return float(tail.mean()) if len(tail) else float("nan")


def _head_mean(x: np.ndarray, window: int) -> float:
    head = np.asarray(x, float)
    head = head[np.isfinite(head)][:window]
    return float(head.mean()) if len(head) else float("nan")


def wilson_lower(k: float, n: float, z: float = 1.96) -> float:
    """Lower end of the Wilson score interval of a rate ``k / n`` (95% for z = 1.96; Wilson 1927).

    Example: k = 1, n = 4 → 0.046 (the point rate 0.25 is one answer of four); k = 21, n = 48 → 0.307.
    n = 0 → nan.
    """
    if n <= 0:
        return float("nan")
    p = k / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return float((centre - half) / (1 + z2 / n))


def _scored_tail(s: Series, key: str, window: int) -> np.ndarray:
    """``s[key]`` with steps whose rewards nothing scored (``scored_share`` 0) set to nan."""
    x = np.asarray(s[key], float).copy()
    sc = np.asarray(s.get("scored_share", np.ones_like(x)), float)
    x[~(sc > 0)] = np.nan
    return x


def _severity(value: float, threshold: float, higher_is_worse: bool = True) -> str:
    if higher_is_worse:
        return "critical" if threshold > 0 and value >= 2 * threshold else "warning"
    return "critical" if value <= threshold / 2 else "warning"


class _Base(StrictModel):
    """The fields every detector's config has."""

    enabled: bool = Field(True, description="run this detector")
    window: int = Field(3, ge=1, description="number of most recent steps the rule averages over")


class ZeroRewardConfig(_Base):
    max_success: float = Field(0.05, ge=0, le=1, description="fires when the success rate (verified rate, else mean reward) is at or below this")
    min_all_wrong_share: float = Field(0.6, ge=0, le=1, description="or when at least this share of groups is all-wrong")


class RewardHackingConfig(_Base):
    max_disagreement: float = Field(0.1, ge=0, le=1, description="fires when this share of verdict-carrying rollouts fails the strict verifier yet is rewarded like a pass")


class LengthInflationConfig(_Base):
    max_growth: float = Field(0.5, gt=0, description="fires when mean generated length grows by this fraction over the run (fitted line)")
    min_steps: int = Field(4, ge=2, description="steps needed before the trend is judged")


class TruncationConfig(_Base):
    max_trunc_rate: float = Field(0.2, gt=0, le=1, description="fires when the 95% lower confidence bound of the truncation rate over the window reaches this")


class SignalNoiseConfig(_Base):
    max_adv_disagreement: float = Field(0.15, ge=0, le=1, description="fires when this share of rollouts in mixed-verdict groups is ranked against its verdict by the advantage")
    max_low_std_share: float = Field(0.3, ge=0, le=1, description="or when this share of non-constant mixed-verdict groups has a tiny reward std (std normalisation amplifies noise)")


class ComputeWasteConfig(_Base):
    max_waste: float = Field(0.5, ge=0, le=1, description="fires when this share of generated tokens sits in zero-advantage groups")


class LongTailConfig(_Base):
    max_tail_time: float = Field(0.5, gt=0, lt=1, description="fires when this share of a step's generation time comes after most of the batch finished")
    min_rollouts: int = Field(8, ge=2, description="steps with fewer fresh rollouts are not judged")


class ReplayStalenessConfig(_Base):
    max_lag: float = Field(4.0, ge=0, description="fires when replayed samples lag the policy by this many versions on average")
    max_iw: float = Field(5.0, gt=1, description="or when an importance weight reaches this")
    min_iw_mean: float = Field(0.5, gt=0, lt=1, description="or when the mean importance weight drops to this")


class EntropyCollapseConfig(_Base):
    max_drop: float = Field(0.6, gt=0, lt=1, description="fires when token entropy falls by this fraction from the first to the last window")
    min_steps: int = Field(4, ge=2, description="steps needed before the trend is judged")


class DetectorConfig(StrictModel):
    """Thresholds of every detector (YAML-loadable; unknown keys are rejected)."""

    zero_reward: ZeroRewardConfig = Field(default_factory=ZeroRewardConfig, description="zero-reward mode")
    reward_hacking: RewardHackingConfig = Field(default_factory=RewardHackingConfig, description="reward hacking")
    length_inflation: LengthInflationConfig = Field(default_factory=LengthInflationConfig, description="length inflation")
    truncation: TruncationConfig = Field(default_factory=TruncationConfig, description="truncation at the length cap")
    signal_noise: SignalNoiseConfig = Field(default_factory=SignalNoiseConfig, description="signal noise")
    compute_waste: ComputeWasteConfig = Field(default_factory=ComputeWasteConfig, description="compute waste")
    long_tail: LongTailConfig = Field(default_factory=LongTailConfig, description="long-tail generation")
    replay_staleness: ReplayStalenessConfig = Field(default_factory=ReplayStalenessConfig, description="replay staleness")
    entropy_collapse: EntropyCollapseConfig = Field(default_factory=EntropyCollapseConfig, description="entropy collapse")


# ---------------------------------------------------------------------------------------------
# Detectors
# ---------------------------------------------------------------------------------------------


class ZeroRewardMode:
    """Zero-reward mode: the policy almost never succeeds, so groups are all-wrong and carry no signal.

    Rule, judged only on steps whose rollouts carry verdicts (``n_verdicts`` > 0; without verdicts
    there is no success rate to speak of, and a mean reward of 0 from a run with no verifier is no
    evidence): success rate (the verified rate) over the window ≤ ``max_success``, or all-wrong
    group share ≥ ``min_all_wrong_share``. Departure from the earlier rule: the mean reward no
    longer stands in for the success rate. Levers from AR3PO (arXiv 2509.25808: staged
    sampling, reuse of earlier correct responses), RePO (arXiv 2506.09340, replay of past
    successes) and GRESO (arXiv 2506.02177) / VADE (arXiv 2511.18902; skip prompts predicted to be
    zero-variance).
    """

    name = "zero_reward"
    module = "Control (prompt selection, curriculum) + Replay"
    levers = [
        "easier prompts / curriculum (task difficulty, split)",
        "GRESO or VADE selection to skip prompts that stay all-wrong",
        "AR3PO: reuse earlier correct responses for all-wrong groups",
        "RePO / ExGRPO replay of past successes",
        "partial-credit or format reward alongside the strict verifier",
    ]

    reads = ("n_verdicts", "verified_rate", "all_wrong_share")

    def detect(self, run: str, s: Series, cfg: ZeroRewardConfig) -> Finding | None:
        judged = np.asarray(s["n_verdicts"], float) > 0
        n = int(np.isfinite(np.where(judged, s["verified_rate"], np.nan)[-cfg.window:]).sum())
        succ = _tail_mean(np.where(judged, s["verified_rate"], np.nan), cfg.window)
        wrong = _tail_mean(np.where(judged, s["all_wrong_share"], np.nan), cfg.window)
        low = np.isfinite(succ) and succ <= cfg.max_success
        many = np.isfinite(wrong) and wrong >= cfg.min_all_wrong_share
        if not (low or many):
            return None
        return Finding(
            self.name, run, "Zero-reward mode",
            f"verified rate {succ:.2f} and all-wrong group share {wrong:.2f} "
            f"{'on its one judged step' if n == 1 else f'over the last {n} judged steps'}: "
            "most groups have no correct answer, so their advantages are zero.",
            self.module, self.levers, {"success_rate": succ, "all_wrong_share": wrong},
            "critical" if low and many else "warning",
        )


class RewardHacking:
    """Reward hacking: the training reward pays a failing answer like a passing one.

    Judged against the strict verdict, not the shaped reward. Per step, a rollout counts
    (``hack_rate``) when ``verified = false`` and its reward reaches the median reward of the step's
    passing rollouts (the run's, when none passed that step; ``metrics.pass_reward`` when none ever
    did). Designed shaping stays out by construction: partial credit (RLTF's −0.3 + 1.3 × pass
    ratio, arXiv 2307.04349, tops out below a pass), format bonuses and length shaping
    (ShorterBetter, DAPO's overlong penalty) move rewards within the pass and fail bands, but do not
    lift a failure to where passes sit. Rule: the window mean of ``hack_rate`` ≥ ``max_disagreement``.
    Levers: train on the strict verifier (or a composite), audit with a judge, verify by execution.
    """

    name = "reward_hacking"
    module = "Filter (verifiers, reward)"
    levers = [
        "use the strict verifier (or a composite with it) as the reward",
        "add format/exactness checks the hack cannot satisfy",
        "audit high-reward failures with a judge (gfcr ross audit) and inspect them in `gfcr view`",
        "verify by execution (code sandbox, env verifier) instead of a learned/lenient reward",
    ]

    reads = ("n_verdicts", "hack_rate", "verified_rate", "reward_mean")

    def detect(self, run: str, s: Series, cfg: RewardHackingConfig) -> Finding | None:
        rate = _tail_mean(s["hack_rate"], cfg.window)
        if not (np.isfinite(rate) and rate >= cfg.max_disagreement):
            return None
        return Finding(
            self.name, run, "Reward hacking",
            f"{rate:.0%} of verified-known rollouts in the last {cfg.window} steps failed the strict verifier "
            "yet were rewarded like the passing ones.",
            self.module, self.levers, {"disagreement_rate": rate}, _severity(rate, cfg.max_disagreement),
        )


class LengthInflation:
    """Length inflation: generated length grows over the run.

    Rule: relative growth of the fitted mean-length line ≥ ``max_growth`` (needs ``min_steps``).
    Truncation is :class:`Truncation`'s finding: a run whose answers hit the cap while their length
    falls has no length inflation (the earlier rule fired "grew −25%" on 44% truncation). Levers: DAPO overlong shaping (arXiv
    2503.14476), ShorterBetter (arXiv 2504.21370), GFPO (arXiv 2508.09726), Dr. GRPO's
    length-unbiased loss (arXiv 2503.20783).
    """

    name = "length_inflation"
    module = "Control (length control) + Filter (length shaping)"
    levers = [
        "DAPO soft overlong punishment / overlong filtering",
        "ShorterBetter: reward the shortest correct length in the group",
        "GFPO: keep the shortest / most token-efficient k of G responses",
        "Dr. GRPO loss aggregation (no per-sequence length normalisation)",
        "raise max_tokens only if truncated answers are otherwise correct",
    ]

    reads = ("len_mean", "len_p95", "n_rollouts")
    trend = True

    def detect(self, run: str, s: Series, cfg: LengthInflationConfig) -> Finding | None:
        steps, lens = s["step"], s["len_mean"]
        ok = np.isfinite(lens) & (lens > 0)
        growth = relative_growth(steps[ok], lens[ok]) if ok.sum() >= cfg.min_steps else float("nan")
        if not (np.isfinite(growth) and growth >= cfg.max_growth):
            return None
        first, last = float(lens[ok][0]), float(lens[ok][-1])
        return Finding(self.name, run, "Length inflation",
                       f"mean generated length grew {growth:+.0%} over the run (fitted line; {first:.0f} → "
                       f"{last:.0f} tokens, first to last step).", self.module, self.levers,
                       {"length_growth": growth, "len_first": first, "len_last": last},
                       _severity(growth, cfg.max_growth))


class Truncation:
    """Truncation: answers stop at the length cap (``finish_reason = "length"``).

    Rule: over the window, the Wilson 95% lower bound of truncated ÷ rollouts ≥
    ``max_trunc_rate`` (:func:`wilson_lower`: a rate judged on few rollouts needs more of them
    truncated). Truncated answers carry no final answer, so a strict verifier fails them whatever
    their reasoning. Levers: DAPO's overlong filtering and soft overlong punishment (arXiv
    2503.14476), a larger budget when truncated answers are otherwise on track, the repetition
    early exit against runaway generation.
    """

    name = "truncation"
    module = "Generate (max_tokens) + Filter (overlong shaping)"
    levers = [
        "raise max_tokens if truncated answers were on track (look at the truncated bucket in the report)",
        "DAPO overlong filtering: mask truncated samples out of the loss",
        "DAPO soft overlong punishment, so answers learn to finish inside the budget",
        "early exit on repetition (control early_exit) if the truncated answers loop",
    ]
    reads = ("n_rollouts", "n_truncated", "trunc_rate")

    def detect(self, run: str, s: Series, cfg: TruncationConfig) -> Finding | None:
        n = np.nan_to_num(np.asarray(s["n_rollouts"], float)[-cfg.window:])
        k = np.nan_to_num(np.asarray(s["n_truncated"], float)[-cfg.window:])
        if n.sum() <= 0:
            return None
        rate, low = float(k.sum() / n.sum()), wilson_lower(float(k.sum()), float(n.sum()))
        if not low >= cfg.max_trunc_rate:
            return None
        return Finding(self.name, run, "Truncation",
                       f"{int(k.sum())} of {int(n.sum())} answers ({rate:.0%}; at least {low:.0%} at 95% confidence) "
                       f"stopped at the length cap in the last {cfg.window} steps.", self.module, self.levers,
                       {"trunc_rate": rate, "trunc_rate_low95": low, "n_truncated": float(k.sum())},
                       _severity(rate, cfg.max_trunc_rate))


class SignalNoise:
    """Signal noise: the learning signal ranks answers against their outcome, or normalisation
    amplifies differences the outcome does not make.

    Judged against the verdict inside groups that hold both a pass and a fail: a rollout is
    discordant (``adv_disagreement``) when a failing one's advantage reaches a passing one's in the
    same group. A positive advantage on a failure is not noise by itself: with partial credit
    (RLTF) the best failure of a group is meant to beat the worst. Groups of one verdict are left
    out, so shaping that orders answers inside them stays quiet. Rule: over the window, the
    discordant share ≥ ``max_adv_disagreement``, or the share of non-constant mixed-verdict groups
    with reward std below ``min_group_std`` ≥ ``max_low_std_share`` (pass and fail barely differ in
    reward, and GRPO's division by a tiny std blows the difference up to ±1; Dr. GRPO, arXiv
    2503.20783). Levers also from ExGRPO (arXiv 2510.02245: prefer low-entropy trajectories).
    """

    name = "signal_noise"
    module = "Filter (signals, advantages) + Replay"
    levers = [
        "larger groups (more samples per prompt) for a steadier baseline",
        "Dr. GRPO / RLOO advantages (no division by a tiny group std)",
        "fix or tighten the verifier so reward and verdict agree",
        "ExGRPO: replay only the lowest-entropy correct trajectory",
    ]

    reads = ("adv_disagreement", "low_std_share", "scored_share")

    def detect(self, run: str, s: Series, cfg: SignalNoiseConfig) -> Finding | None:
        dis = _tail_mean(s["adv_disagreement"], cfg.window)
        low = _tail_mean(_scored_tail(s, "low_std_share", cfg.window), cfg.window)
        a = np.isfinite(dis) and dis >= cfg.max_adv_disagreement
        b = np.isfinite(low) and low >= cfg.max_low_std_share
        if not (a or b):
            return None
        parts = []
        if a:
            parts.append(f"{dis:.0%} of rollouts in mixed groups are ranked against their verdict by the advantage")
        if b:
            parts.append(f"{low:.0%} of mixed-verdict groups have a reward std below the noise floor")
        sev = "critical" if a and b else (
            _severity(dis, cfg.max_adv_disagreement) if a else _severity(low, cfg.max_low_std_share))
        return Finding(self.name, run, "Signal noise", "; ".join(parts) + f" (last {cfg.window} steps).",
                       self.module, self.levers, {"adv_disagreement": dis, "low_std_share": low}, sev)


class ComputeWaste:
    """Compute waste: generated tokens in groups whose advantage is zero teach nothing.

    Rule: over the window, wasted tokens ÷ generated tokens ≥ ``max_waste``, on steps whose
    rewards were scored (``scored_share`` > 0: rewards that no verifier gave are all 0.0, and
    equal, without meaning a thing). Levers: GRESO
    (arXiv 2506.02177) and VADE (arXiv 2511.18902) skip predicted zero-variance prompts; DAPO dynamic sampling
    (arXiv 2503.14476) refills the batch; AR3PO (arXiv 2509.25808) samples in stages; adaptive K.
    """

    name = "compute_waste"
    module = "Control (selection, K allocation, dynamic sampling)"
    levers = [
        "GRESO or VADE prompt selection (skip predicted zero-variance prompts)",
        "DAPO dynamic sampling (drop zero-variance groups, refill the batch)",
        "AR3PO staged sampling (sample more only where the first stage is mixed)",
        "adaptive K: fewer samples for prompts that are always solved or never solved",
    ]

    reads = ("waste_share", "zero_var_share", "gen_tokens", "wasted_tokens", "scored_share")

    def detect(self, run: str, s: Series, cfg: ComputeWasteConfig) -> Finding | None:
        waste = _tail_mean(_scored_tail(s, "waste_share", cfg.window), cfg.window)
        if not (np.isfinite(waste) and waste >= cfg.max_waste):
            return None
        zv = _tail_mean(s["zero_var_share"], cfg.window)
        return Finding(
            self.name, run, "Compute waste",
            f"{waste:.0%} of generated tokens in the last {cfg.window} steps are in zero-advantage groups "
            f"(zero-variance group share {zv:.0%}).",
            self.module, self.levers, {"waste_share": waste, "zero_var_share": zv},
            "critical" if waste >= min(1.0, 1.5 * cfg.max_waste) else "warning",
        )


class LongTail:
    """Long-tail generation: a few long samples hold the whole synchronous batch.

    Per step (``tail_time_share``): the share of the step's generation time spent after
    ``metrics.tail_quantile`` (90%) of its rollouts had finished. From per-sample finish times
    (``cost.latency_s``) when the store has them, else from generated lengths (a batched decoder
    runs as many decode steps as its longest sample: ``1 − L_q / L_max``). ``tail_token_share`` is
    the share of generated tokens past ``L_q``. Rule: window mean of ``tail_time_share`` ≥
    ``max_tail_time`` on steps with at least ``min_rollouts`` rollouts. The survey (§6.2, §6.4)
    names the pathology — long reasoning rollouts have a long tail that slows synchronous training —
    and puts rollout count, max length, group size, tree width and batch load balancing under one
    budget; its levers are below, the system ones (ReSpec, DAS, TLT, EARL, Seer) outside gfcr.
    """

    name = "long_tail"
    module = "Control (budgeting and scheduling) + Generate (partial rollouts)"
    levers = [
        "cap the length budget: lower max_tokens, or DAPO overlong shaping so the longest answers stop paying",
        "early exit (control early_exit: repetition, confidence) to stop runaway samples",
        "partial rollouts: stop unfinished samples at a token budget and resume them next step",
        "balance the batch under one budget: adaptive K, smaller groups or tree width for prompts that run long",
        "continuous batching (gfcr serve, vLLM) or asynchronous generation with a staleness bound (AReaL)",
        "system levers the survey names: speculative decoding (ReSpec), long-tail load balancing and "
        "dynamic parallelism (DAS, TLT, EARL), similar-sample reuse (Seer)",
    ]

    reads = ("n_rollouts", "tail_time_share", "tail_token_share", "tail_timed", "len_max", "len_mean")

    def detect(self, run: str, s: Series, cfg: LongTailConfig) -> Finding | None:
        ok = np.asarray(s["n_rollouts"], float) >= cfg.min_rollouts
        tail_t = np.where(ok, s["tail_time_share"], np.nan)
        tail = _tail_mean(tail_t, cfg.window)
        if not (np.isfinite(tail) and tail >= cfg.max_tail_time):
            return None
        tok = _tail_mean(np.where(ok, s["tail_token_share"], np.nan), cfg.window)
        timed = _tail_mean(np.where(ok, s["tail_timed"], np.nan), cfg.window)
        basis = "per-sample finish times" if timed >= 0.5 else "generated lengths (decode steps)"
        lmax = _tail_mean(np.where(ok, s["len_max"], np.nan), cfg.window)
        lmean = _tail_mean(np.where(ok, s["len_mean"], np.nan), cfg.window)
        return Finding(
            self.name, run, "Long-tail generation",
            f"{tail:.0%} of each step's generation time in the last {cfg.window} steps came after most of the "
            f"batch had finished ({tok:.0%} of the tokens; longest sample {lmax:.0f} vs mean {lmean:.0f} tokens; "
            f"from {basis}).",
            self.module, self.levers,
            {"tail_time_share": tail, "tail_token_share": tok, "len_max": lmax, "len_mean": lmean},
            "critical" if tail >= min(0.9, 1.5 * cfg.max_tail_time) else "warning",
        )


class ReplayStaleness:
    """Replay staleness: replayed samples lag the policy too far, or their importance weights blow up.

    Rule: over the window, mean version lag ≥ ``max_lag``, max importance weight ≥ ``max_iw``, or
    mean importance weight ≤ ``min_iw_mean``. Levers: AReaL's staleness bound η and decoupled,
    capped importance weights (arXiv 2505.24298); ExGRPO's weight shaping; a smaller replay window.
    """

    name = "replay_staleness"
    module = "Replay (buffers, off-policy mixing) + Control (staleness bound)"
    levers = [
        "AReaL-style staleness bound: drop or refresh samples older than η versions",
        "cap / truncate importance weights (decoupled PPO objective)",
        "smaller replay buffer or shorter window; lower the replay ratio",
        "ExGRPO weight shaping f(w) = w / (w + 0.1) for replayed trajectories",
    ]

    reads = ("n_replayed", "staleness_mean", "iw_mean", "iw_max")

    def detect(self, run: str, s: Series, cfg: ReplayStalenessConfig) -> Finding | None:
        lag = _tail_mean(s["staleness_mean"], cfg.window)
        tail_max = np.asarray(s["iw_max"], float)[-cfg.window:]
        iw_max = float(np.nanmax(tail_max)) if np.isfinite(tail_max).any() else float("nan")
        iw_mean = _tail_mean(s["iw_mean"], cfg.window)
        hits = {
            "lag": np.isfinite(lag) and lag >= cfg.max_lag,
            "iw_max": np.isfinite(iw_max) and iw_max >= cfg.max_iw,
            "iw_mean": np.isfinite(iw_mean) and iw_mean <= cfg.min_iw_mean,
        }
        if not any(hits.values()):
            return None
        parts = []
        if hits["lag"]:
            parts.append(f"replayed samples lag the policy by {lag:.1f} versions on average")
        if hits["iw_max"]:
            parts.append(f"importance weights reach {iw_max:.1f}")
        if hits["iw_mean"]:
            parts.append(f"the mean importance weight fell to {iw_mean:.2f}")
        return Finding(self.name, run, "Replay staleness", "; ".join(parts) + f" (last {cfg.window} steps).",
                       self.module, self.levers, {"staleness_mean": lag, "iw_max": iw_max, "iw_mean": iw_mean},
                       "critical" if sum(hits.values()) >= 2 else "warning")


class EntropyCollapse:
    """Entropy collapse: token entropy of the generated text falls toward zero over the run.

    Rule: mean entropy over the last window ≤ (1 − ``max_drop``) × mean over the first window
    (needs ``min_steps``); uses ``signals.entropy`` when recorded, else the mean negative
    behaviour log-prob. Levers: DAPO clip-higher (arXiv 2503.14476), an entropy bonus or KL
    anchor, higher temperature, entropy-aware selection.
    """

    name = "entropy_collapse"
    module = "Generate (sampling) + Filter (entropy signals) + train loss"
    levers = [
        "DAPO clip-higher (raise ε_high, e.g. 0.28)",
        "entropy bonus or a KL anchor to the reference policy",
        "higher sampling temperature",
        "select prompts / tokens by entropy (high-entropy forking tokens)",
    ]

    reads = ("entropy_mean", "nll_mean")
    trend = True

    def detect(self, run: str, s: Series, cfg: EntropyCollapseConfig) -> Finding | None:
        ent = s["entropy_mean"] if np.isfinite(s["entropy_mean"]).sum() >= cfg.min_steps else s["nll_mean"]
        if np.isfinite(ent).sum() < cfg.min_steps:
            return None
        first, last = _head_mean(ent, cfg.window), _tail_mean(ent, cfg.window)
        if not (first > 0 and last <= (1 - cfg.max_drop) * first):
            return None
        drop = 1 - last / first
        return Finding(self.name, run, "Entropy collapse",
                       f"token entropy fell {drop:.0%}, from {first:.3f} to {last:.3f} nats/token.",
                       self.module, self.levers, {"entropy_first": first, "entropy_last": last, "drop": drop},
                       "critical" if drop >= min(0.95, 1.3 * cfg.max_drop) else "warning")


#: detector name → instance, in the order findings are reported
DETECTORS = {
    d.name: d
    for d in (ZeroRewardMode(), RewardHacking(), LengthInflation(), Truncation(), SignalNoise(), ComputeWaste(),
              LongTail(), ReplayStaleness(), EntropyCollapse())
}


def evidence_rows(s: Series, reads: tuple[str, ...], window: int | None) -> list[dict[str, float | None]]:
    """The per-step rows a rule judged: ``step`` and each metric in ``reads`` (nan → None), over the
    last ``window`` steps (None: every step, for a trend).

    Example: s = {"step": [0, 1, 2], "x": [0.1, nan, 0.3]}, reads ("x",), window 2 →
    [{"step": 1, "x": None}, {"step": 2, "x": 0.3}].
    """
    steps = np.asarray(s["step"])
    sl = slice(None) if window is None else slice(-window, None)
    out = []
    for i in range(len(steps))[sl]:
        row: dict[str, float | None] = {"step": int(steps[i])}
        for k in reads:
            v = float(np.asarray(s[k], float)[i]) if k in s else float("nan")
            row[k] = v if np.isfinite(v) else None
        out.append(row)
    return out


def detect(metrics: pa.Table, config: DetectorConfig | None = None) -> list[Finding]:
    """Run every enabled detector on every run of a :func:`step_metrics` table; each finding carries
    its evidence rows (:func:`evidence_rows`)."""
    cfg = config or DetectorConfig()
    out = []
    for run, series in by_run(metrics).items():
        for name, det in DETECTORS.items():
            c = getattr(cfg, name)
            if c.enabled:
                f = det.detect(run, series, c)
                if f is not None:
                    f.rows = evidence_rows(series, det.reads, None if getattr(det, "trend", False) else c.window)
                    out.append(f)
    return out
