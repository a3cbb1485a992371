"""Diagnostics: group outcomes, length and truncation, reward-hacking monitors, samples, the rollout
record, ``rlvr diagnose`` and ``rlvr report`` (docs/diagnostics.md, docs/rollout-record.md)."""

from rlvr.diagnostics.diagnose import diagnose
from rlvr.diagnostics.header import fingerprint_checker, fingerprint_rows
from rlvr.diagnostics.monitors import MonitorConfig
from rlvr.diagnostics.report import write_report
from rlvr.diagnostics.tracker import Diagnostics

__all__ = ["Diagnostics", "MonitorConfig", "diagnose", "fingerprint_checker", "fingerprint_rows", "write_report"]
