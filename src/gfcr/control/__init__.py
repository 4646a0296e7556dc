"""gfcr.control: prompt selection, group policies (K allocation, dynamic sampling, GFPO, AR3PO's
staged rollout, StarPO-S), one step's sampling sequence (``gfcr.control.step``), per-sample controls
(overlong filter, early exit, staleness). Name -> class tables, one per family: ``SELECTORS``,
``GROUP_POLICIES`` and ``SAMPLE_CONTROLS``."""

from gfcr.control.groups import (
    SAMPLE_CONTROLS,
    EarlyExit,
    OverlongFilter,
    StalenessBound,
    make_sample_control,
)
from gfcr.control.policies import (
    GFPO,
    GROUP_POLICIES,
    AdaptiveK,
    DynamicSampling,
    GroupPolicy,
    make_group_policy,
)
from gfcr.control.selectors import GRESO, SEC, SELECTORS, VADE, VCRL, PromptSelector, Uniform, make_selector
from gfcr.control.step import StepSampler, observe_step

__all__ = [
    "GFPO", "GRESO", "GROUP_POLICIES", "SAMPLE_CONTROLS", "SEC", "SELECTORS", "VADE", "VCRL", "AdaptiveK",
    "DynamicSampling", "EarlyExit", "GroupPolicy", "OverlongFilter", "PromptSelector", "StalenessBound",
    "StepSampler", "Uniform", "make_group_policy", "make_sample_control", "make_selector", "observe_step",
]
