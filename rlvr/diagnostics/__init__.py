"""Diagnostics: group outcomes, length and truncation, reward-hacking monitors, samples, the rollout
record, ``rlvr diagnose`` and ``rlvr report`` (docs/diagnostics.md, docs/rollout-record.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlvr.diagnostics.diagnose import diagnose
from rlvr.diagnostics.header import fingerprint_checker, fingerprint_rows, run_fingerprints
from rlvr.diagnostics.monitors import MonitorConfig
from rlvr.diagnostics.tracker import Diagnostics

if TYPE_CHECKING:
    from rlvr.diagnostics.report import write_report

__all__ = [
    "Diagnostics",
    "MonitorConfig",
    "diagnose",
    "fingerprint_checker",
    "fingerprint_rows",
    "run_fingerprints",
    "write_report",
]


def __getattr__(name: str) -> Any:
    # The report pulls in matplotlib (~1.3 s of imports on this CPU); the trainer never needs it.
    if name == "write_report":
        from rlvr.diagnostics.report import write_report

        return write_report
    raise AttributeError(f"module 'rlvr.diagnostics' has no attribute {name!r}")
