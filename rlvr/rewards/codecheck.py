"""The code checker: run a completion's program against tests in the sandbox (issue 5).

Two kinds of tests, read from the dataset's tests column:

* assert-style: Python source strings (``"assert add(2, 3) == 5"``), one test per string. The
  parent parses each ``assert`` with ``ast`` (parsing, not running) and sends only the
  *expressions to compute* into the sandbox; the expected side, when it is a literal, never
  leaves the parent. The sandbox reports each computed value as ``repr`` of plain data (an
  object with an always-true ``__eq__`` is not plain data and fails), and the parent compares.
  ``assert not x`` expects a falsy value, ``assert x`` a truthy one, again judged in the parent.
  When neither side of a comparison is a literal, both are computed in the sandbox and
  compared in the parent. Other statements (imports, helper definitions) run as they are.
* stdin/stdout: ``{"input": ..., "output": ...}`` objects; one sandbox run per case, the
  program's stdout compared with the expected output in the parent (trailing whitespace on each
  line and trailing blank lines ignored).

A run passes only when the harness wrote its DONE record with this run's random token, after
every step ran — never from the exit code (``sys.exit(0)`` / ``os._exit(0)`` before the tests
is a failure, not a pass). Lines on the result channel without the token, or two results for one
step, mean the program wrote to the harness's channel: ``tampering``, reward 0.
"""

from __future__ import annotations

import ast
import json
import operator
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rlvr.rewards.base import (
    REWARDS,
    CheckerReward,
    Verdict,
    row_columns,
)
from rlvr.rewards.textscan import fenced_blocks
from rlvr.rewards.sandbox import (
    Isolation,
    Limits,
    NotLiteral,
    RunResult,
    literal_value,
    run_sandboxed,
)

MAX_CODE_CHARS = 100_000

_OPS = {
    ast.Eq: ("==", operator.eq), ast.NotEq: ("!=", operator.ne), ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le), ast.Gt: (">", operator.gt), ast.GtE: (">=", operator.ge),
    ast.In: ("in", lambda a, b: a in b), ast.NotIn: ("not in", lambda a, b: a not in b),
    ast.Is: ("is", operator.is_), ast.IsNot: ("is not", operator.is_not),  # meaningful for None/True/False
}
_FLIP = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE, ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}


@dataclass(frozen=True)
class Check:
    """One condition the parent verifies on the values the sandbox reported."""

    kind: str  # "compare", "truthy", "falsy", "ran"
    step: int
    op: type | None = None
    expected: Any = None  # literal kept in the parent
    other_step: int | None = None  # when the expected side had to be computed too
    source: str = ""


@dataclass
class CompiledTests:
    steps: list[dict[str, str]]
    tests: list[list[Check]]


def extract_code(text: str) -> tuple[str | None, str, int]:
    """(program, path, number of fenced blocks). The last fenced block is the program (models
    show examples first); without fences the whole text after any reasoning block is."""
    if "<think>" in text and "</think>" not in text:
        return None, "unclosed_think", 0
    text = text.rsplit("</think>", 1)[-1]
    blocks = fenced_blocks(text)  # linear: a regex here is quadratic on a long run of backticks
    python_blocks = [b for info, b in blocks if (info.split() or [""])[0].lower() in ("", "python", "py", "python3")]
    if python_blocks:
        return python_blocks[-1], "fenced", len(python_blocks)
    if blocks:
        return None, "no_python_block", len(blocks)
    stripped = text.strip()
    return (stripped or None), "whole", 0


def compile_assert_tests(tests: Sequence[str]) -> CompiledTests:
    """Split assert-style tests into sandbox steps and parent-side checks (see module doc)."""
    compiled = CompiledTests(steps=[], tests=[])

    def step(kind: str, node: ast.AST) -> int:
        compiled.steps.append({"kind": kind, "code": ast.unparse(node)})
        return len(compiled.steps) - 1

    for t, test in enumerate(tests):
        try:
            module = ast.parse(test)
        except SyntaxError as exc:
            raise ValueError(
                f"code reward: test {t} is not valid Python ({exc.msg}, line {exc.lineno}): {test[:120]!r}; "
                "assert-style tests are Python source like 'assert f(2) == 4'"
            ) from None
        checks: list[Check] = []
        for stmt in module.body:
            src = ast.unparse(stmt)
            if not isinstance(stmt, ast.Assert):
                checks.append(Check("ran", step("exec", stmt), source=src))
                continue
            expr = stmt.test
            if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in _OPS:
                left, right, op = expr.left, expr.comparators[0], type(expr.ops[0])
                for computed, literal, this_op in ((left, right, op), (right, left, _FLIP.get(op))):
                    if this_op is None:
                        continue
                    try:
                        expected = literal_value(literal)
                    except (NotLiteral, RecursionError):
                        continue
                    checks.append(Check("compare", step("eval", computed), this_op, expected, source=src))
                    break
                else:
                    a, b = step("eval", left), step("eval", right)
                    checks.append(Check("compare", a, op, other_step=b, source=src))
            elif isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
                checks.append(Check("falsy", step("eval", expr.operand), source=src))
            else:
                checks.append(Check("truthy", step("eval", expr), source=src))
        compiled.tests.append(checks)
    return compiled


def _evaluate(check: Check, values: dict[int, Any], ran: set[int], errors: dict[int, str]) -> str | None:
    """None when the check holds, else why not."""
    if check.step in errors:
        return f"raised {errors[check.step]}"
    if check.kind == "ran":
        return None if check.step in ran else "did not run"
    if check.step not in values:
        return "no value"
    value = values[check.step]
    if check.kind == "truthy":
        return None if value else "falsy"
    if check.kind == "falsy":
        return None if not value else "truthy"
    if check.other_step is not None:
        if check.other_step in errors:
            return f"raised {errors[check.other_step]}"
        if check.other_step not in values:
            return "no value"
        expected = values[check.other_step]
    else:
        expected = check.expected
    _, fn = _OPS[check.op]
    try:
        return None if fn(value, expected) else f"got {value!r:.80}"
    except Exception as exc:  # noqa: BLE001 - e.g. '<' between str and int: the test fails
        return f"cannot compare ({type(exc).__name__})"


def _read_values(run: RunResult) -> tuple[dict[int, Any], set[int], dict[int, str], bool]:
    values: dict[int, Any] = {}
    ran: set[int] = set()
    errors: dict[int, str] = {}
    seen: set[int] = set()
    duplicate = False
    for kind, idx, payload in run.records:
        if kind in ("VALUE", "OK", "ERROR") and idx >= 0:
            if idx in seen:
                duplicate = True
            seen.add(idx)
        if kind == "VALUE":
            try:
                values[idx] = literal_value(payload)
            except (NotLiteral, RecursionError, MemoryError, ValueError):
                errors[idx] = "returned something that is not plain data"
        elif kind == "OK":
            ran.add(idx)
        elif kind == "ERROR":
            errors[idx] = payload
    return values, ran, errors, duplicate


def _normalize_output(s: str) -> str:
    return "\n".join(line.rstrip() for line in s.replace("\r\n", "\n").split("\n")).rstrip("\n")


class CodeReward(CheckerReward):
    """1.0 when the program passes every test (``partial=True``: the fraction passed)."""

    kind = "correctness"

    def __init__(
        self,
        tests_column: str = "tests",
        timeout_s: float = 5.0,
        gold_column: str | None = None,  # alias of tests_column, for uniform configs
        memory_mb: int = 512,
        partial: bool = False,
        isolation: Isolation = "auto",
        max_workers: int | None = None,
        name: str = "code",
    ):
        super().__init__(name)
        if timeout_s <= 0:
            raise ValueError(f"code reward: timeout_s must be > 0 seconds, got {timeout_s}")
        self.gold_column = gold_column or tests_column
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
        self.partial = partial
        self.isolation = isolation
        self.max_workers = max_workers or min(16, 2 * (os.cpu_count() or 1))

    def verdicts(self, prompts, completions, completion_ids=None, **columns) -> list[Verdict]:
        n = len(completions)
        if self.gold_column not in columns:
            raise KeyError(
                f"reward {self.__name__!r} reads tests from column {self.gold_column!r}, which the dataset does not "
                f"have (columns: {', '.join(sorted(columns)) or 'none'}); pass tests_column=<name>"
            )
        rows = [row_columns(columns, n, i) for i in range(n)]
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            futures = [pool.submit(self._checked, c, row) for c, row in zip(completions, rows)]
            return [f.result() for f in futures]

    def check(self, text: str, row: dict[str, Any]) -> Verdict:
        tests = row.get(self.gold_column)
        if tests is None:
            return Verdict(False, None, reason="no_tests")
        return check_code(text, tests, truncated=bool(row.get("truncated", False)), limits=self.limits,
                          partial=self.partial, isolation=self.isolation)


def parse_tests(tests: Any) -> list:
    if isinstance(tests, str):
        stripped = tests.strip()
        if stripped.startswith("["):
            try:
                tests = json.loads(stripped)
            except json.JSONDecodeError:
                tests = [tests]
        else:
            tests = [tests]
    if isinstance(tests, dict) and "input" in tests:
        tests = [tests]
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:  # APPS / TACO layout
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"])]
    if not isinstance(tests, (list, tuple)) or not tests:
        raise ValueError(
            f"code reward: tests must be a non-empty list of assert strings or of {{'input': ..., 'output': ...}} "
            f"objects, got {type(tests).__name__}"
        )
    return list(tests)


def check_code(text: str, tests: Any, *, truncated: bool = False, limits: Limits | None = None, partial: bool = False,
               isolation: Isolation = "auto") -> Verdict:
    """The verdict for one completion against its tests (``limits``: ``Limits()`` when None)."""
    limits = limits or Limits()
    code, path, n_blocks = extract_code(text)
    verdict = Verdict(False, 0.0, extracted=(code or "")[:200] or None, path=path, n_candidates=n_blocks)
    if truncated:
        verdict.reason = "truncated"
        return verdict
    if code is None:
        verdict.reason = "no_code" if path not in ("unclosed_think",) else path
        return verdict
    if len(code) > MAX_CODE_CHARS:
        verdict.reason = "code_too_long"
        return verdict
    cases = parse_tests(tests)
    if all(isinstance(c, dict) for c in cases):
        runs = [(run_sandboxed(code, [], mode="stdio", stdin=str(c.get("input", "")), limits=limits, isolation=isolation), c)
                for c in cases]
        outcomes = [_judge_stdio(run, case) for run, case in runs]
        all_runs = [r for r, _ in runs]
    elif all(isinstance(c, str) for c in cases):
        compiled = compile_assert_tests(cases)
        run = run_sandboxed(code, compiled.steps, mode="assert", limits=limits, isolation=isolation)
        outcomes = _judge_asserts(run, compiled)
        all_runs = [run]
    else:
        raise ValueError("code reward: mix of assert strings and input/output objects in one tests list; use one kind per problem")
    passed = sum(o is None for o in outcomes)
    failures = [(i, o) for i, o in enumerate(outcomes) if o is not None]
    verdict.extra = {
        "isolation": all_runs[0].isolation,
        "passed": passed,
        "total": len(outcomes),
        "failures": failures[:5],
        "killed_after_exit": sum(r.killed_after_exit for r in all_runs),
        "sandbox_seconds": sum(r.seconds for r in all_runs),
    }
    notes = sorted({n for r in all_runs for n in r.notes})
    if notes:
        verdict.extra["notes"] = notes  # e.g. the rlimits fallback could not remove the network
    tamper = [o for o in outcomes if o and o.startswith("tampering")]
    if tamper:
        verdict.reason = "tampering"
    elif any(r.timed_out for r in all_runs):
        verdict.reason = "timeout"
    elif any(r.output_overflow for r in all_runs):
        verdict.reason = "output_limit"
    elif passed == len(outcomes):
        verdict.reason = "ok"
    else:
        verdict.reason = failures[0][1].split(":")[0] if failures else "failed"
    verdict.correct = verdict.reason == "ok"
    if partial and not tamper:
        verdict.reward = passed / len(outcomes)
    else:
        verdict.reward = float(verdict.correct)
    return verdict


def _run_failure(run: RunResult) -> str | None:
    """Why a whole run failed, before looking at individual results."""
    if run.foreign_lines:
        return "tampering: wrote to the result channel"
    if run.timed_out:
        return "timeout"
    if run.output_overflow:
        return "output_limit"
    for kind, idx, payload in run.records:
        if idx == -1 and kind == "EXIT":
            return f"exit_during_import: sys.exit({payload})"
        if idx == -1 and kind == "ERROR":
            return "syntax_error" if payload in ("SyntaxError", "IndentationError", "TabError") else f"import_error: {payload}"
    if not run.done:
        return "crashed: no completion record (exited, killed, or os._exit before the tests finished)"
    return None


def _judge_asserts(run: RunResult, compiled: CompiledTests) -> list[str | None]:
    failure = _run_failure(run)
    values, ran, errors, duplicate = _read_values(run)
    if failure is None and duplicate:
        failure = "tampering: two results for one step"
    if failure is not None:
        return [failure] * len(compiled.tests)
    outcomes = []
    for checks in compiled.tests:
        why = None
        for check in checks:
            why = _evaluate(check, values, ran, errors)
            if why is not None:
                why = f"failed: {check.source[:80]} ({why})"
                break
        outcomes.append(why)
    return outcomes


def _judge_stdio(run: RunResult, case: dict) -> str | None:
    failure = _run_failure(run)
    if failure is not None:
        return failure
    if any(kind == "EXIT" for kind, _, _ in run.records):
        return "failed: non-zero exit"
    got = _normalize_output(run.stdout.decode("utf-8", "replace"))
    want = _normalize_output(str(case.get("output", "")))
    return None if got == want else f"failed: wrong output {got[:60]!r}"


REWARDS.add("code", lambda **options: CodeReward(**options))
