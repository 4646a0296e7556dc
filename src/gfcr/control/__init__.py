"""gfcr.control: prompt selection, K allocation, dynamic sampling, length control, early exit,
staleness. Name -> class tables: ``SELECTORS`` and ``GROUP_CONTROLS``."""

from gfcr.control.groups import (
    GFPO,
    GROUP_CONTROLS,
    AdaptiveK,
    AdaptThink,
    DynamicSampling,
    EarlyExit,
    OverlongFilter,
    ShorterBetter,
    StalenessBound,
    make_group_control,
)
from gfcr.control.selectors import GRESO, SEC, SELECTORS, VADE, VCRL, PromptSelector, Uniform, make_selector

__all__ = [
    "GFPO", "GRESO", "GROUP_CONTROLS", "SEC", "SELECTORS", "VADE", "VCRL", "AdaptThink", "AdaptiveK",
    "DynamicSampling", "EarlyExit", "OverlongFilter", "PromptSelector", "ShorterBetter", "StalenessBound",
    "Uniform", "make_group_control", "make_selector",
]
