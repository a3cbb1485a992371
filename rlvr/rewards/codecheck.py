"""The code checker: run a completion's program against tests in the sandbox.

Two kinds of tests, read from the dataset's tests column:

* assert-style: Python source strings (``"assert add(2, 3) == 5"``), one test per string. The
  parent parses each ``assert`` with ``ast`` (parsing, not running) and judges the whole
  condition itself: comparisons (chained too), ``and``/``or``/``not``, arithmetic, subscripts,
  and the pure builtins ``abs``, ``round``, ``len``, ``sorted``, ``min``, ``max``, ``sum``,
  ``all``, ``any``, ``set``, ``list``, ``tuple``, ... and ``math.isclose``/``sqrt``/...; only the
  sub-expressions that call the program (``f(x)``) are computed in the sandbox, and they come
  back as plain data (an exact encoding of builtin types: an object with its own ``__eq__``,
  ``__sub__`` or ``__abs__`` is not plain data and fails). So in ``assert abs(f(x) - 12.566) <
  1e-6`` the subtraction, the ``abs``, the comparison and both literals stay in the parent, where
  the program cannot patch ``abs`` or ``math.isclose``. Loops over literal cases (``for x, y in
  [(1, 2), ...]: assert f(x) == y``, including a list bound to a name first, and ``all(f(x) == y
  for ...)``) are unrolled in the parent, at most ``MAX_UNROLLED`` checks per test.
  A test whose expected value cannot be kept outside (an ``assert`` inside a helper function or
  a loop over computed values, or a comparison of two computed values such as ``f(x) ==
  reference(x)``) still runs, but is reported as not tamper-proof in ``Verdict.extra`` and by
  ``rlvr audit``. Other statements (imports, helper definitions) run as they are.
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
import math
import operator
import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
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
    decode_value,
    literal_value,
    run_sandboxed,
)

MAX_CODE_CHARS = 100_000
RLIMITS_WARNING = (
    "isolation=rlimits: the program saw the host filesystem and could reach unix sockets on it; "
    "install bubblewrap (apt-get install bubblewrap) or run as root with CAP_SYS_ADMIN for an empty root"
)

_CMP = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,  # meaningful for None/True/False
}
_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
# Builtins the parent applies itself to plain data (the sandbox's copies may be patched).
_PURE = {
    "abs": abs,
    "round": round,
    "len": len,
    "sorted": sorted,
    "min": min,
    "max": max,
    "sum": sum,
    "all": all,
    "any": any,
    "set": set,
    "frozenset": frozenset,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "reversed": lambda x: list(reversed(x)),
    "isinstance": isinstance,
    "type": type,
    "math.isclose": math.isclose,
    "math.sqrt": math.sqrt,
    "math.fabs": math.fabs,
    "math.floor": math.floor,
    "math.ceil": math.ceil,
    "math.isnan": math.isnan,
    "math.isinf": math.isinf,
    "math.isfinite": math.isfinite,
    "math.log": math.log,
    "math.exp": math.exp,
    "math.prod": math.prod,
    "range": lambda *a: _bounded_range(*a),
    "Fraction": Fraction,
    "fractions.Fraction": Fraction,
    "Decimal": Decimal,
    "decimal.Decimal": Decimal,
    "Counter": Counter,
    "collections.Counter": Counter,
    "OrderedDict": dict,
    "collections.OrderedDict": dict,
    "enumerate": lambda *a: list(enumerate(*a)),
    "zip": lambda *a: list(zip(*a)),
}


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > 10_000_000:
        raise _Fail("range too large to evaluate")
    return r


_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "set": set,
    "frozenset": frozenset,
    "bytes": bytes,
    "complex": complex,
    "type(None)": type(None),
}
MAX_UNROLLED = 2000  # checks per test after unrolling literal loops


@dataclass(frozen=True)
class Check:
    """One condition the parent verifies on the values the sandbox reported."""

    kind: str  # "assert" (plan judged in the parent) or "ran" (a statement that must not raise)
    plan: Any = None  # nested tuples: ("const", v) | ("leaf", step) | ("bin", op, a, b) | ...
    step: int = -1  # for "ran"
    tamper_proof: bool = True
    source: str = ""


@dataclass
class CompiledTests:
    steps: list[dict[str, str]]
    tests: list[list[Check]]

    def not_tamper_proof(self) -> list[int]:
        """Indices of tests with a check judged (partly) inside the sandbox."""
        return [t for t, checks in enumerate(self.tests) if any(not c.tamper_proof for c in checks)]


class _NotInParent(Exception):
    """This node cannot be evaluated in the parent: compute it in the sandbox."""


def _const_of(node: ast.AST, env: dict[str, Any]) -> Any:
    """The value of a literal node (names bound to literals in ``env`` included), else _NotInParent."""
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_const_of(e, env) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_const_of(k, env): _const_of(v, env) for k, v in zip(node.keys, node.values)}
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("range", "zip", "enumerate")
        and not node.keywords
        and node.func.id not in env
    ):
        args = [_const_of(a, env) for a in node.args]
        if node.func.id == "range" and all(isinstance(a, int) for a in args) and len(range(*args)) <= MAX_UNROLLED:
            return list(range(*args))
        if node.func.id == "zip":
            return [tuple(x) for x in zip(*args)]
        if node.func.id == "enumerate" and len(args) == 1:
            return list(enumerate(args[0]))
        raise _NotInParent
    try:
        return literal_value(node)
    except (NotLiteral, RecursionError, ValueError, TypeError):
        raise _NotInParent from None


def _literal_node(value: Any) -> ast.expr:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 10_000:
        return ast.parse(f"int('{value:x}', 16)", mode="eval").body  # repr() refuses past 4300 digits
    return ast.parse(repr(value), mode="eval").body


class _Substitute(ast.NodeTransformer):
    """Replace names bound by the parent (loop variables, literal case lists) by their values."""

    def __init__(self, env: dict[str, Any]):
        self.env = env

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.env and isinstance(node.ctx, ast.Load):
            return ast.copy_location(_literal_node(self.env[node.id]), node)
        return node


def _bind(target: ast.AST, value: Any, env: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        env[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        items = list(value)
        if len(items) != len(target.elts):
            raise _NotInParent
        for t, v in zip(target.elts, items):
            _bind(t, v, env)
    else:
        raise _NotInParent


_PURE_MODULES = ("math", "fractions", "decimal", "collections")


def _call_name(func: ast.AST, aliases: dict[str, str]) -> str | None:
    """The _PURE name a call refers to, through the test's own imports (``from math import
    isclose``, ``import math as m``), or None."""
    if isinstance(func, ast.Name):
        return aliases.get(func.id, func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module = aliases.get(func.value.id, func.value.id)
        if module in _PURE_MODULES:
            return module + "." + func.attr
    return None


def _imported_names(stmt: ast.stmt) -> dict[str, str]:
    """Names a test's import binds to a pure module or one of its functions."""
    if isinstance(stmt, ast.ImportFrom) and stmt.module in _PURE_MODULES and not stmt.level:
        return {a.asname or a.name: f"{stmt.module}.{a.name}" for a in stmt.names if a.name != "*"}
    if isinstance(stmt, ast.Import):
        return {a.asname or a.name: a.name for a in stmt.names if a.name in _PURE_MODULES}
    return {}


class _Planner:
    """Turns an assert's condition into a plan the parent evaluates, with sandbox steps as leaves."""

    def __init__(self, compiled: CompiledTests):
        self.compiled = compiled
        self.aliases: dict[str, str] = {}  # this test's imports of pure functions and modules
        self.no_leaves = False  # planning a value the parent must compute alone (an assignment)

    def leaf(self, node: ast.AST, env: dict[str, Any]) -> tuple:
        if self.no_leaves:
            raise _NotInParent
        code = ast.unparse(_Substitute(env).visit(ast.parse(ast.unparse(node), mode="eval")).body)
        self.compiled.steps.append({"kind": "eval", "code": code})
        return ("leaf", len(self.compiled.steps) - 1)

    def plan(self, node: ast.AST, env: dict[str, Any]) -> tuple:
        try:
            return ("const", _const_of(node, env))
        except _NotInParent:
            pass
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            return ("bin", type(node.op), self.plan(node.left, env), self.plan(node.right, env))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return ("unary", type(node.op), self.plan(node.operand, env))
        if isinstance(node, ast.BoolOp):
            return ("bool", type(node.op), [self.plan(v, env) for v in node.values])
        if isinstance(node, ast.Compare) and all(type(op) in _CMP for op in node.ops):
            rest = [(type(op), self.plan(c, env)) for op, c in zip(node.ops, node.comparators)]
            return ("compare", self.plan(node.left, env), rest)
        if isinstance(node, ast.Subscript):
            return ("subscript", self.plan(node.value, env), self.plan(node.slice, env))
        if isinstance(node, ast.Slice):
            bounds = (node.lower, node.upper, node.step)
            parts = [self.plan(p, env) if p is not None else ("const", None) for p in bounds]
            return ("slice", *parts)
        if isinstance(node, ast.IfExp):
            return ("ifexp", self.plan(node.test, env), self.plan(node.body, env), self.plan(node.orelse, env))
        name = _call_name(node.func, self.aliases) if isinstance(node, ast.Call) else None
        if name in _PURE and name not in env and not any(isinstance(a, ast.Starred) for a in node.args):
            if name == "isinstance" and len(node.args) == 2:
                types = self.types(node.args[1])
                if types is not None:
                    return ("call", name, [self.plan(node.args[0], env), ("const", types)], {})
            elif len(node.args) == 1 and isinstance(node.args[0], ast.GeneratorExp):
                gen = self.generator(node.args[0], env)
                if gen is not None:
                    return ("call", name, [gen], {k.arg: self.plan(k.value, env) for k in node.keywords if k.arg})
            elif name != "isinstance" and all(k.arg for k in node.keywords):
                kwargs = {k.arg: self.plan(k.value, env) for k in node.keywords}
                return ("call", name, [self.plan(a, env) for a in node.args], kwargs)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            gen = self.generator(node, env)
            if gen is not None:
                return gen
        return self.leaf(node, env)

    def value(self, node: ast.AST, env: dict[str, Any]) -> Any:
        """``expected = [1] * 3``, ``cases = list(zip(xs, ys))``: computed in the parent when it
        needs nothing from the program; else _NotInParent."""
        self.no_leaves = True
        try:
            return _run_plan(self.plan(node, env), {}, {})
        except (_Fail, TypeError, ValueError, ArithmeticError, KeyError, IndexError, RecursionError):
            raise _NotInParent from None
        finally:
            self.no_leaves = False

    def types(self, node: ast.AST) -> tuple | None:
        nodes = node.elts if isinstance(node, ast.Tuple) else [node]
        names = [ast.unparse(n) for n in nodes]
        return tuple(_TYPES[n] for n in names) if all(n in _TYPES for n in names) else None

    def generator(self, node: ast.AST, env: dict[str, Any]) -> tuple | None:
        """``all(f(x) == y for x, y in CASES)``: one plan per literal case, unrolled in the parent."""
        if len(node.generators) != 1 or node.generators[0].is_async:
            return None
        comp = node.generators[0]
        try:
            items = list(_const_of(comp.iter, env))
        except (_NotInParent, TypeError):
            return None
        if len(items) > MAX_UNROLLED:
            return None
        plans = []
        for item in items:
            inner = dict(env)
            try:
                _bind(comp.target, item, inner)
            except _NotInParent:
                return None
            conds = [self.plan(c, inner) for c in comp.ifs]
            plans.append((conds, self.plan(node.elt, inner)))
        return ("list", plans)


def _names_used_inside(body: list[ast.stmt]) -> set[str]:
    """Names read by the statements that run in the sandbox as they are (calls, helper functions,
    ``with`` blocks, ...): values bound to these must exist there, since those statements may
    read or mutate them (``data = [3, 1, 2]; sort_in_place(data); assert data == [1, 2, 3]``)."""
    used: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.Assert):
            continue
        if isinstance(stmt, ast.Assign):
            nodes = [stmt.value]
        elif isinstance(stmt, ast.For) and _has_assert(stmt):
            nodes = []  # unrolled in the parent (if it cannot be, the names it needs are still bound there)
            used |= _names_used_inside(stmt.body)
        else:
            nodes = [stmt]
        used |= {
            n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
    return used


def _calls_test_import(node: ast.AST, imported: set[str]) -> bool:
    """``assert numpy.allclose(f(x), [1, 2])``: a helper the test imported decides, inside the
    sandbox, where the program may have patched it; its literal arguments entered the sandbox."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            root = n.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in imported:
                return True
    return False


def _has_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


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
    planner = _Planner(compiled)

    def exec_step(stmt: ast.stmt, env: dict[str, Any], checks: list[Check]) -> None:
        node = _Substitute(env).visit(ast.parse(ast.unparse(stmt)))
        compiled.steps.append({"kind": "exec", "code": ast.unparse(node)})
        # an assert that runs inside the sandbox (in a helper, or a loop over computed values) is judged there
        checks.append(
            Check("ran", step=len(compiled.steps) - 1, tamper_proof=not _has_assert(stmt), source=ast.unparse(stmt))
        )

    def statements(body: list[ast.stmt], env: dict[str, Any], checks: list[Check]) -> None:
        for stmt in body:
            if len(checks) > MAX_UNROLLED:
                raise ValueError(
                    f"code reward: a test unrolls to more than {MAX_UNROLLED} checks; split it into several tests"
                )
            if isinstance(stmt, ast.Assert):
                plan = planner.plan(stmt.test, env)
                judged_inside = plan[0] == "leaf" and _calls_test_import(stmt.test, imported)
                checks.append(
                    Check(
                        "assert",
                        plan=plan,
                        tamper_proof=_tamper_proof(plan) and not judged_inside,
                        source=ast.unparse(stmt)[:200],
                    )
                )
            elif isinstance(stmt, ast.For) and not stmt.orelse and _has_assert(stmt):
                try:
                    items = list(planner.value(stmt.iter, env))
                    if len(items) > MAX_UNROLLED:
                        raise _NotInParent
                    envs = []
                    for item in items:
                        inner = dict(env)
                        _bind(stmt.target, item, inner)
                        envs.append(inner)
                except (_NotInParent, TypeError):
                    exec_step(stmt, env, checks)
                    continue
                for inner in envs:
                    statements(stmt.body, inner, checks)
            else:
                planner.aliases.update(_imported_names(stmt))
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    imported.update(a.asname or a.name.split(".")[0] for a in stmt.names)
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    targets = {n.id for n in ast.walk(stmt.targets[0]) if isinstance(n, ast.Name)}
                    try:
                        _bind(stmt.targets[0], planner.value(stmt.value, env), env)
                        if not targets & used_inside:
                            # The value lives only in the parent (and in the leaves it is substituted
                            # into): a program cannot read `expected` from its globals or frames.
                            continue
                        for name in targets:  # a statement run in the sandbox uses it (and may mutate it)
                            env.pop(name, None)
                    except (_NotInParent, TypeError):
                        for name in ast.walk(stmt.targets[0]):
                            if isinstance(name, ast.Name):
                                env.pop(name.id, None)  # rebound to something the parent cannot know
                exec_step(stmt, env, checks)

    for t, test in enumerate(tests):
        try:
            module = ast.parse(test)
        except (SyntaxError, ValueError) as exc:
            raise ValueError(
                f"code reward: test {t} is not valid Python ({exc}): {test[:120]!r}; "
                "assert-style tests are Python source like 'assert f(2) == 4'"
            ) from None
        checks: list[Check] = []
        planner.aliases = {}
        imported: set[str] = set()
        used_inside = _names_used_inside(module.body)
        statements(module.body, {}, checks)
        compiled.tests.append(checks)
    return compiled


def _walk(plan: Any):
    """Every plan node inside ``plan`` (constants are values, not nodes: not entered)."""
    if isinstance(plan, tuple) and plan and isinstance(plan[0], str):
        yield plan
        if plan[0] == "const":
            return
    if isinstance(plan, (tuple, list)):
        for part in plan:
            yield from _walk(part)
    elif isinstance(plan, dict):
        for part in plan.values():
            yield from _walk(part)


def _tamper_proof(plan: tuple) -> bool:
    """False when a comparison has computed values on every side: its expected value came from
    the sandbox too (``f(x) == reference(x)``), so a program that patches what the reference uses
    could pass it."""
    for node in _walk(plan):
        if node[0] == "compare":
            sides = [node[1]] + [c for _, c in node[2]]
            if all(any(n[0] == "leaf" for n in _walk(side)) for side in sides):
                return False
    return True


class _Fail(Exception):
    """A leaf the parent needs raised in the sandbox or returned no plain data."""


def _guard_pow(a: Any, b: Any) -> None:
    # a test's own literal like 3 ** 20000 is cheap; a computed exponent must not make the parent build a 1 GB int
    if isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and b > 0 and b * abs(a).bit_length() > 10_000_000:
        raise _Fail("exponent too large to evaluate")


def _guard_mul(a: Any, b: Any) -> None:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > 10_000_000:
            raise _Fail("repetition too large to evaluate")


def _run_plan(plan: tuple, values: dict[int, Any], errors: dict[int, str]) -> Any:
    kind = plan[0]
    if kind == "const":
        return plan[1]
    if kind == "leaf":
        if plan[1] in errors:
            raise _Fail(errors[plan[1]])
        if plan[1] not in values:
            raise _Fail("no value")
        return values[plan[1]]
    if kind == "bin":
        a, b = _run_plan(plan[2], values, errors), _run_plan(plan[3], values, errors)
        if plan[1] is ast.Pow:
            _guard_pow(a, b)
        if plan[1] is ast.Mult:
            _guard_mul(a, b)
        return _BIN[plan[1]](a, b)
    if kind == "unary":
        return _UNARY[plan[1]](_run_plan(plan[2], values, errors))
    if kind == "bool":
        result = None
        for sub in plan[2]:
            result = _run_plan(sub, values, errors)
            if (plan[1] is ast.And and not result) or (plan[1] is ast.Or and result):
                return result
        return result
    if kind == "compare":
        left = _run_plan(plan[1], values, errors)
        for op, right_plan in plan[2]:
            right = _run_plan(right_plan, values, errors)
            if not _CMP[op](left, right):
                return False
            left = right
        return True
    if kind == "subscript":
        return _run_plan(plan[1], values, errors)[_run_plan(plan[2], values, errors)]
    if kind == "slice":
        return slice(*(_run_plan(p, values, errors) for p in plan[1:]))
    if kind == "ifexp":
        return _run_plan(plan[2] if _run_plan(plan[1], values, errors) else plan[3], values, errors)
    if kind == "call":
        args = [_run_plan(a, values, errors) for a in plan[2]]
        kwargs = {k: _run_plan(v, values, errors) for k, v in plan[3].items()}
        return _PURE[plan[1]](*args, **kwargs)
    if kind == "list":
        out = []
        for conds, elt in plan[1]:
            if all(_run_plan(c, values, errors) for c in conds):
                out.append(_run_plan(elt, values, errors))
        return out
    raise _Fail(f"unknown plan {kind}")


def _evaluate(check: Check, values: dict[int, Any], ran: set[int], errors: dict[int, str]) -> str | None:
    """None when the check holds, else why not."""
    if check.kind == "ran":
        if check.step in errors:
            return f"raised {errors[check.step]}"
        return None if check.step in ran else "did not run"
    try:
        return None if _run_plan(check.plan, values, errors) else "false"
    except _Fail as exc:
        return f"raised {exc}" if not str(exc).startswith(("no value", "exponent", "repetition")) else str(exc)
    except Exception as exc:  # noqa: BLE001 - e.g. '<' between str and int on returned data: the test fails
        return f"cannot evaluate ({type(exc).__name__})"


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
                values[idx] = decode_value(payload)
            except (NotLiteral, RecursionError, MemoryError, ValueError):
                errors[idx] = (
                    "returned a value over the 8 MiB transfer limit"
                    if payload == "<too large>"
                    else "returned something that is not plain data"
                )
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
        return check_code(
            text,
            tests,
            truncated=bool(row.get("truncated", False)),
            limits=self.limits,
            partial=self.partial,
            isolation=self.isolation,
        )


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


def check_code(
    text: str,
    tests: Any,
    *,
    truncated: bool = False,
    limits: Limits | None = None,
    partial: bool = False,
    isolation: Isolation = "auto",
) -> Verdict:
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
    not_tamper_proof: list[int] = []
    if all(isinstance(c, dict) for c in cases):
        runs = [
            (
                run_sandboxed(
                    code, [], mode="stdio", stdin=str(c.get("input", "")), limits=limits, isolation=isolation
                ),
                c,
            )
            for c in cases
        ]
        outcomes = [_judge_stdio(run, case) for run, case in runs]
        all_runs = [r for r, _ in runs]
    elif all(isinstance(c, str) for c in cases):
        compiled = compile_assert_tests(cases)
        run = run_sandboxed(code, compiled.steps, mode="assert", limits=limits, isolation=isolation)
        outcomes = _judge_asserts(run, compiled)
        all_runs = [run]
        not_tamper_proof = compiled.not_tamper_proof()
    else:
        raise ValueError(
            "code reward: mix of assert strings and input/output objects in one tests list; use one kind per problem"
        )
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
    if not_tamper_proof:
        # these tests' expected values were judged inside the sandbox: a passing verdict on them
        # is only as strong as the sandbox's own Python (see docs/checkers.md)
        verdict.extra["not_tamper_proof"] = not_tamper_proof
    notes = sorted({n for r in all_runs for n in r.notes})
    if all_runs[0].isolation == "rlimits":
        notes.append(RLIMITS_WARNING)
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
            return (
                "syntax_error"
                if payload in ("SyntaxError", "IndentationError", "TabError")
                else f"import_error: {payload}"
            )
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
