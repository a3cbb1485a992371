"""Reward functions and the checkers under them.

Importing this package registers every built-in reward factory in ``REWARDS``:
``math``, ``code``, ``json_schema``, ``format``, ``overlong``.
"""

from rlvr.rewards import codecheck, formatcheck, jsoncheck, length, mathcheck  # noqa: F401  (registration)
from rlvr.rewards.base import REWARDS, CheckerReward, Verdict, completion_text
from rlvr.rewards.codecheck import CodeReward, check_code
from rlvr.rewards.formatcheck import FormatReward, check_tags
from rlvr.rewards.jsoncheck import JSONSchemaReward, check_json, strict_loads
from rlvr.rewards.length import OverlongPenalty
from rlvr.rewards.mathcheck import MathReward, check_math, equivalent

__all__ = [
    "REWARDS",
    "CheckerReward",
    "CodeReward",
    "FormatReward",
    "JSONSchemaReward",
    "MathReward",
    "OverlongPenalty",
    "Verdict",
    "check_code",
    "check_json",
    "check_math",
    "check_tags",
    "completion_text",
    "equivalent",
    "strict_loads",
]
