"""Held-out evaluation: greedy accuracy, pass@k at a temperature, mean length, truncation rate.

Used by `rlvr train` (before and after training, and every ``log.eval_steps``) and `rlvr eval`
(``resolve_eval`` turns its arguments, a run folder / model folder / 'tiny' plus a task or dataset,
into what ``evaluate`` needs).
A completion is *correct* when the verdict of the first correctness checker among the run's reward
functions says so (the built-in ``math``, ``code``, ``json_schema``, ``arithmetic``, ``countdown``:
strict extraction, no partial credit; a truncated completion is never correct). With no such checker,
when the first reward function's value is >= 1. To judge a custom reward's run strictly, add the
checker with weight 0 (``rewards=[myrewards:fn, {name: math, weight: 0}]``): it then judges without
changing the training signal. ``correctness_rule`` says which rule a run uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.config import Config, load_config, override_config
from rlvr.rewards.scoring import RewardFn, load_reward_functions, reward_specs, score
from rlvr.rollout.base import RolloutEngine, SamplingParams
from rlvr.tasks.prompts import as_completion_payload, encode_prompts


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, 'Evaluating LLMs trained on code'):
    1 - C(n-c, k) / C(n, k), computed as a product to stay exact for large n."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def correctness_fn(reward_fns: list[RewardFn]) -> RewardFn:
    for rf in reward_fns:
        if rf.kind == "correctness":
            return rf
    return reward_fns[0]


def correctness_rule(reward_fns: list[RewardFn]) -> str:
    """What counts as correct in this evaluation, in words (printed with the accuracy)."""
    rf = correctness_fn(reward_fns)
    if rf.kind == "correctness" and hasattr(rf.fn, "verdicts"):
        return f"correct = the {rf.name!r} checker's verdict"
    return (
        f"correct = reward of {rf.name!r} >= 1 (no correctness checker among the rewards; add one with "
        "weight 0, e.g. {name: math, weight: 0}, to judge strictly)"
    )


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    rows: list[dict],
    reward_fns: list[RewardFn],
    *,
    max_tokens: int,
    n: int = 1,
    temperature: float = 0.0,
    ks: tuple[int, ...] = (1,),
    seed: int = 0,
    stop: tuple[str, ...] = (),
    max_prompt_length: int | None = None,
    chunk: int = 512,
) -> dict[str, float]:
    """temperature 0 = greedy (then n is 1). Returns accuracy (mean correct over all samples),
    pass@k for each k <= n, mean completion length in tokens, and the truncation rate."""
    if not rows:
        return {}
    if temperature == 0.0:
        n = 1
    checker = correctness_fn(reward_fns)
    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, stop=tuple(stop), seed=seed)
    correct_per_prompt: list[int] = []
    lengths, truncated = [], []
    for start in range(0, len(rows), max(1, chunk // n)):
        part = rows[start : start + max(1, chunk // n)]
        prompts = [r["prompt"] for r in part]
        comps = engine.generate(encode_prompts(tokenizer, prompts, max_prompt_length), n, sampling)
        trunc = [c.truncated for c in comps]
        cols = {k: [r.get(k) for r in part for _ in range(n)] for k in part[0] if k != "prompt"}
        cols["truncated"] = trunc
        flat_prompts = [p for p in prompts for _ in range(n)]
        res = score(
            [checker],
            flat_prompts,
            [as_completion_payload(p, c.text) for p, c in zip(flat_prompts, comps)],
            [c.token_ids for c in comps],
            cols,
        )
        strict = checker.kind == "correctness"  # another checker's verdict (format, ...) is not correctness
        ok = [
            (v.correct if v is not None and strict else (not math.isnan(r) and r >= 1.0))
            for v, r in zip(res.verdicts or [None] * len(comps), res.rewards_NK[:, 0].tolist())
        ]
        correct_per_prompt += [sum(ok[i * n : (i + 1) * n]) for i in range(len(part))]
        lengths += [len(c.token_ids) for c in comps]
        truncated += trunc
    out = {
        "accuracy": sum(correct_per_prompt) / (n * len(correct_per_prompt)),
        "mean_length": sum(lengths) / len(lengths),
        "truncation_rate": sum(truncated) / len(truncated),
        "num_prompts": float(len(correct_per_prompt)),
        "samples_per_prompt": float(n),
    }
    for k in ks:
        if k <= n and temperature > 0:
            out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct_per_prompt) / len(correct_per_prompt)
    return out


@dataclass
class EvalSetup:
    model_path: str
    engine: Any
    tokenizer: Any
    rows: list[dict]
    reward_fns: list[RewardFn]
    max_tokens: int
    stop: tuple[str, ...]


def resolve_eval(
    model: str,
    task: str | None,
    data: str | None,
    reward: str | None,
    n_prompts: int,
    max_tokens: int | None,
    backend: str,
    config: str | None = None,
    config_overrides: list[str] | None = None,
) -> EvalSetup:
    from rlvr.builders import load_model, load_tokenizer, resolve_model_path
    from rlvr.tasks.stream import eval_rows
    from rlvr.rollout import make_engine

    run_cfg: Config | None = None
    p = Path(model)
    if (p / "config.yaml").exists():  # a run folder: its final weights and its own task/rewards
        run_cfg = load_config(p / "config.yaml")
        if not (p / "final").exists():
            raise ValueError(f"run folder {model!r} has no final/ model yet (is it still training?)")
        model_path = str(p / "final")
    else:
        model_path = resolve_model_path(model)
        if config is not None:  # a model folder evaluated the way a config would train it
            run_cfg = load_config(config, config_overrides)
    overrides = [f"data.eval_size={n_prompts}", f"model.path={model_path}"]
    if data is not None:
        overrides += [f"data.path={data}", f"data.eval_path={data}"]
        if reward is None and (run_cfg is None or not run_cfg.rewards):
            raise ValueError("--data needs --reward (the correctness checker, e.g. --reward math)")
    if task is not None:
        overrides += [f"data.task={task}", "data.path=null", "data.eval_path=null"]
    if reward is not None:
        overrides += [f"rewards=[{{name: {reward}}}]"]
    cfg = override_config(run_cfg.model_dump(mode="json") if run_cfg else None, overrides)
    rows = eval_rows(cfg)
    if not rows:
        raise ValueError("nothing to evaluate: give --task or --data with held-out prompts")
    tokenizer = load_tokenizer(model_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = load_model(cfg, device, trainable=False)  # the run's dtype, eval mode, no gradients
    engine = make_engine(backend, net, tokenizer)
    mt = max_tokens or cfg.rollout.max_completion_length
    return EvalSetup(
        model_path, engine, tokenizer, rows, load_reward_functions(reward_specs(cfg)), mt, tuple(cfg.rollout.stop)
    )
