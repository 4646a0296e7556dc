"""gfcr.control: prompt selection, group policies (K allocation, dynamic sampling, GFPO, AR3PO's
staged rollout), early exit, staleness. Name -> class tables: ``SELECTORS``, ``GROUP_POLICIES``
(what the loop calls) and ``GROUP_CONTROLS`` (the rules they use)."""

from gfcr.control.groups import (
    GFPO,
    GROUP_CONTROLS,
    AdaptiveK,
    DynamicSampling,
    EarlyExit,
    OverlongFilter,
    StalenessBound,
    make_group_control,
)
from gfcr.control.policies import GROUP_POLICIES, GroupPolicy, make_group_policy
from gfcr.control.selectors import GRESO, SEC, SELECTORS, VADE, VCRL, PromptSelector, Uniform, make_selector

__all__ = [
    "GFPO", "GRESO", "GROUP_CONTROLS", "GROUP_POLICIES", "SEC", "SELECTORS", "VADE", "VCRL", "AdaptiveK",
    "DynamicSampling", "EarlyExit", "GroupPolicy", "OverlongFilter", "PromptSelector", "StalenessBound",
    "Uniform", "make_group_control", "make_group_policy", "make_selector",
]
