"""Synthetic policies for the monitor tests: step records shaped exactly like the trainer's.

A ``Policy`` says, as a function of the step, how likely a completion is correct, formatted,
truncated or sprayed, and how long correct and incorrect completions are. ``make_step`` draws
one step of B prompts × G completions from it with a seeded ``random.Random``, scores them with a
strict or lenient checker, and computes TRL-style group advantages. Everything is deterministic
per seed, so detection delays are reproducible numbers, not flaky ones.
"""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

Schedule = Callable[[int], float]


def const(v: float) -> Schedule:
    return lambda step: v


def ramp(start: float, end: float, begin: int, until: int) -> Schedule:
    """``start`` before step ``begin``, linear to ``end`` at ``until``, ``end`` after."""

    def f(step: int) -> float:
        if step <= begin:
            return start
        if step >= until:
            return end
        return start + (end - start) * (step - begin) / (until - begin)

    return f


@dataclass
class Policy:
    p_correct: Schedule = field(default_factory=lambda: ramp(0.25, 0.6, 0, 60))
    p_format_if_correct: Schedule = field(default_factory=lambda: ramp(0.5, 0.95, 0, 30))
    p_format_if_incorrect: Schedule = field(default_factory=lambda: ramp(0.3, 0.6, 0, 30))
    p_spray: Schedule = field(default_factory=lambda: const(0.0))  # of incorrect answers, turned into sprays
    p_truncate_incorrect: Schedule = field(default_factory=lambda: const(0.04))
    len_correct: Schedule = field(default_factory=lambda: ramp(120, 140, 0, 60))
    len_incorrect: Schedule = field(default_factory=lambda: ramp(150, 170, 0, 60))
    p_tamper: Schedule = field(default_factory=lambda: const(0.0))  # of passing programs (code tasks)
    code: bool = False
    max_len: int = 512
    format_weight: float = 0.2
    lenient_checker: bool = False  # "any number in the tail equals the gold": sprays pass
    truncated_rewarded: bool = False  # a checker that forgets the truncated column
    spray_style: str = "four"  # "four": g-1 or g or g+1 or g+2; "two": "g g+10"; "concat": "gg+10"; "three"
    checker: Callable | None = None  # overrides the strict / lenient choice


def lenient_numbers_checker(prompts, completions, completion_ids, answer, **columns):
    """A deliberately gameable checker: reward 1 if the gold appears among the tail's numbers."""
    out = []
    for text, gold in zip(completions, answer):
        tail = text[-80:]
        out.append(1.0 if str(gold) in re.findall(r"-?\d+", tail) else 0.0)
    return out


lenient_numbers_checker.gold_column = "answer"


def answer_in_tail(prompts, completions, completion_ids=None, answer=None, **columns):
    """Lenient the way a substring test is: reward 1 if the gold's digits appear at the end."""
    return [1.0 if str(gold) in text[-40:] else 0.0 for text, gold in zip(completions, answer)]


def has_think(prompts, completions, completion_ids=None, **columns):
    """A format reward as users write it: 1 when the completion opens with a think block."""
    return [1.0 if text.startswith("<think>") else 0.0 for text in completions]


SPRAYS = {
    "four": lambda g: f"Let me think. The answer is {g - 1} or {g} or {g + 1} or {g + 2}",
    "two": lambda g: f"Let me think. The answer is {g} {g + 10}",
    "concat": lambda g: f"Let me think. The answer is {g}{g + 10}",
    "three": lambda g: f"Let me think. The answer is {g} or {g + 10} or {g + 11}",
}


def strict_checker(prompts, completions, completion_ids, answer, **columns):
    """Exactly one number after 'The answer is', equal to the gold."""
    out = []
    for text, gold in zip(completions, answer):
        m = re.search(r"The answer is (.*)$", text)
        nums = re.findall(r"-?\d+", m.group(1)) if m else []
        out.append(1.0 if len(set(nums)) == 1 and nums[0] == str(gold) else 0.0)
    return out


strict_checker.gold_column = "answer"


def _advantages(rewards: list[float]) -> list[float]:
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [(r - mean) / (std + 1e-4) for r in rewards]


def make_step(
    policy: Policy, step: int, rng: random.Random, B: int = 8, G: int = 8, n_prompts: int = 32
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for b in range(B):
        prompt_index = (step * B + b) % n_prompts
        gold = 10 + 7 * prompt_index
        # Prompts differ in difficulty around the policy's mean, so groups are all-fail, mixed and all-pass.
        difficulty = (prompt_index % 5 - 2) * 0.12
        p = min(1.0, max(0.0, policy.p_correct(step) - difficulty))
        group = []
        for g in range(G):
            correct = rng.random() < p
            sprayed = not correct and rng.random() < policy.p_spray(step)
            truncated = not correct and not sprayed and rng.random() < policy.p_truncate_incorrect(step)
            formatted = rng.random() < (
                policy.p_format_if_correct(step) if correct else policy.p_format_if_incorrect(step)
            )
            mean_len = policy.len_correct(step) if correct else policy.len_incorrect(step)
            n_tokens = (
                policy.max_len
                if truncated
                else max(5, min(policy.max_len - 1, int(rng.gauss(mean_len, mean_len * 0.15))))
            )
            wrong = gold + rng.choice([-3, -2, 2, 5, 11])
            if policy.code:
                body = "def solve():\n    return %d\n" % (gold if correct else wrong)
                if correct and rng.random() < policy.p_tamper(step):
                    body = "import sys\ndef solve():\n    sys.exit(0)\n"
                text = f"```python\n{body}```\nThe answer is {gold if correct else wrong}"
            elif sprayed:
                text = SPRAYS[policy.spray_style](gold)
            elif truncated:
                text = "Let me think step by step. " * 20 + f"{gold - 4} + 4 = {gold}"
            else:
                text = f"We add 3 and 4 to get 7. The answer is {gold if correct else wrong}"
            if formatted:
                text = "<think>...</think>" + text
            group.append((text, n_tokens, truncated, formatted, correct or sprayed))
        checker = policy.checker or (lenient_numbers_checker if policy.lenient_checker else strict_checker)
        texts = [t for t, *_ in group]
        scores = checker([""] * G, texts, [[]] * G, answer=[str(gold)] * G)
        for g, ((text, n_tokens, truncated, formatted, _), score) in enumerate(zip(group, scores)):
            if truncated and not policy.truncated_rewarded:
                score = 0.0
            elif truncated and policy.truncated_rewarded:
                score = 1.0
            rewards = {"correct": score, "format": 1.0 if formatted else 0.0}
            records.append(
                {
                    "step": step,
                    "prompt_id": f"p{prompt_index}",
                    "group": b,
                    "index": g,
                    "prompt": f"Q{prompt_index}",
                    "completion": text,
                    "n_tokens": n_tokens,
                    "finish_reason": "length" if truncated else "stop",
                    "truncated": truncated,
                    "rewards": rewards,
                    "reward": rewards["correct"] + policy.format_weight * rewards["format"],
                    "advantage": 0.0,
                    "correct": bool(score > 0),
                    "verdict": None,
                    "data_source": "code" if policy.code else ("easy" if prompt_index % 2 else "hard"),
                    "columns": {"answer": str(gold)},
                }
            )
        adv = _advantages([r["reward"] for r in records[-G:]])
        for record, a in zip(records[-G:], adv):
            record["advantage"] = a
    return records


REWARD_NAMES = ["correct", "format"]
REWARD_KINDS = {"correct": "correctness", "format": "format"}


def plain_functions(policy: Policy) -> dict[str, Callable]:
    """The policy's rewards as the plain functions a user would pass (no roles declared)."""
    checker = policy.checker or (lenient_numbers_checker if policy.lenient_checker else strict_checker)
    return {"correct": checker, "format": has_think}


def strict_shadow():
    """rlvr's math checker as the shadow grader of the synthetic texts ("... The answer is N")."""
    from rlvr.diagnostics.shadow import ShadowGrader
    from rlvr.rewards.mathcheck import MathReward

    return ShadowGrader(MathReward(), "answer", "gold column 'answer'")


def run_policy(
    policy: Policy, steps: int, seed: int = 0, run_dir=None, reward_funcs=None, plain: bool = False, **kwargs
):
    """Feed ``steps`` synthetic steps through a ``Diagnostics``; returns (diag, [(step, metrics, warnings)]).

    ``plain=True`` is a user's run: plain functions, no roles declared (inferred from the first step),
    and the math checker shadow-grading every completion."""
    from rlvr.diagnostics import Diagnostics

    rng = random.Random(seed)
    messages: list[str] = []
    if plain:
        kwargs.setdefault("shadow", strict_shadow())
    diag = Diagnostics(
        run_dir,
        group_size=8,
        reward_names=REWARD_NAMES,
        reward_weights=[1.0, policy.format_weight],
        reward_kinds={name: None for name in REWARD_NAMES} if plain else REWARD_KINDS,
        reward_funcs=plain_functions(policy) if plain else reward_funcs,
        console=messages.append,
        **kwargs,
    )
    diag.messages = messages
    out = []
    for step in range(steps):
        records = make_step(policy, step, rng)
        metrics, warnings = diag.observe(step, records)
        out.append((step, metrics, warnings))
    return diag, out


def first_warning(trace, monitor: str) -> int | None:
    for step, metrics, _ in trace:
        if metrics.get(f"hacking/{monitor}/fired"):
            return step
    return None


def all_warnings(trace) -> list[tuple[int, str]]:
    return [(step, w) for step, _, warnings in trace for w in warnings]


def write_fake_run(run_dir, policy: Policy | None = None, steps: int = 40, seed: int = 0, eval_every: int = 10):
    """A run folder as the trainer leaves it: metrics.jsonl (trainer keys + diagnostics keys),
    samples.jsonl, warnings.jsonl, the rollout record, prompt history and header.json."""
    import json
    import math
    from pathlib import Path

    from rlvr.diagnostics import Diagnostics

    run_dir = Path(run_dir)
    policy = policy or Policy()
    rng = random.Random(seed)
    diag = Diagnostics(
        run_dir,
        group_size=8,
        reward_names=REWARD_NAMES,
        reward_weights=[1.0, policy.format_weight],
        reward_kinds=REWARD_KINDS,
        console=lambda m: None,
        reward_funcs={"correct": lenient_numbers_checker if policy.lenient_checker else strict_checker},
    )
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(steps):
            records = make_step(policy, step, rng)
            metrics, _ = diag.observe(step, records)
            if step % 5 == 0:
                diag.samples(step, records, echo=False)
            row = {
                "step": step,
                "reward": statistics.fmean(r["reward"] for r in records),
                "reward_std": statistics.pstdev(r["reward"] for r in records),
            }
            for name in REWARD_NAMES:
                row[f"rewards/{name}/mean"] = statistics.fmean(r["rewards"][name] for r in records)
            row |= {
                "entropy": 1.2 * math.exp(-step / 60),
                "kl": 0.001 * step,
                "loss": 0.0,
                "grad_norm": 0.5,
                "clip_ratio/low_mean": 0.01,
                "clip_ratio/high_mean": 0.02,
                "clip_ratio/region_mean": 0.03,
                "completions/mean_length": statistics.fmean(r["n_tokens"] for r in records),
            }
            row |= {
                f"timing/{p}": t
                for p, t in zip(
                    ("rollout", "reward", "advantage", "logprobs", "update", "sync", "log"),
                    (2.0, 0.2, 0.01, 0.4, 0.8, 0.05, 0.02),
                )
            }
            if step % eval_every == eval_every - 1:
                row["eval/accuracy"] = policy.p_correct(step)
            f.write(json.dumps(row | metrics) + "\n")
    (run_dir / "header.json").write_text(
        json.dumps({"run_name": "synthetic", "git_revision": "abc1234", "config": {"num_generations": 8}})
    )
    diag.close()
    return run_dir


def switch(before: float, after: float, onset: int) -> Schedule:
    """``before`` until step ``onset``, ``after`` from it on (an abrupt change of behaviour)."""
    return lambda step: after if step >= onset else before


ONSET = 10

# Each hacking policy behaves healthily until ONSET, then games its checker.
HACKING_POLICIES = {
    "answer_spraying": lambda: Policy(lenient_checker=True, p_correct=const(0.3), p_spray=switch(0.0, 0.5, ONSET)),
    "format_farming": lambda: Policy(
        p_correct=const(0.25),
        format_weight=0.5,
        p_format_if_correct=switch(0.1, 0.95, ONSET),
        p_format_if_incorrect=switch(0.1, 0.95, ONSET),
    ),
    "length_inflation": lambda: Policy(p_correct=const(0.3), len_incorrect=ramp(150, 450, ONSET, ONSET + 30)),
    "truncation_gaming": lambda: Policy(p_correct=const(0.3), p_truncate_incorrect=switch(0.04, 0.5, ONSET)),
    "test_tampering": lambda: Policy(code=True, p_tamper=switch(0.0, 0.3, ONSET)),
}
