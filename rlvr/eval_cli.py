"""What `rlvr eval` evaluates: resolve a run folder / model folder / 'tiny' plus a task or dataset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.config import Config, load_config
from rlvr.scoring import RewardFn, load_reward_functions, reward_specs


@dataclass
class EvalSetup:
    model_path: str
    engine: Any
    tokenizer: Any
    rows: list[dict]
    reward_fns: list[RewardFn]
    max_tokens: int
    stop: tuple[str, ...]


def resolve_eval(model: str, task: str | None, data: str | None, reward: str | None, n_prompts: int,
                 max_tokens: int | None, backend: str, config: str | None = None,
                 config_overrides: list[str] | None = None) -> EvalSetup:
    from rlvr.components import load_model, load_tokenizer, resolve_model_path
    from rlvr.data import eval_rows
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
    cfg = _with_overrides(run_cfg.model_dump(mode="json") if run_cfg else None, overrides)
    rows = eval_rows(cfg)
    if not rows:
        raise ValueError("nothing to evaluate: give --task or --data with held-out prompts")
    tokenizer = load_tokenizer(model_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = load_model(cfg, device, trainable=False)  # the run's dtype, eval mode, no gradients
    engine = make_engine(backend, net, tokenizer)
    mt = max_tokens or cfg.rollout.max_completion_length
    return EvalSetup(model_path, engine, tokenizer, rows, load_reward_functions(reward_specs(cfg)), mt,
                     tuple(cfg.rollout.stop))


def _with_overrides(base: dict | None, overrides: list[str]) -> Config:
    from rlvr.config import _merge, parse_overrides

    tree = _merge(base or {}, parse_overrides(overrides))
    return Config.model_validate(tree)
