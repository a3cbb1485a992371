"""THE loop. One GRPO step, in the order of DESIGN.md §2:

    rollout -> reward -> advantage -> logprobs -> update -> sync -> log

Each phase is one function below, timed as ``timing/<phase>``. ``train(cfg)`` reads top to bottom;
copy it if you need a different loop. The math lives in ``rlvr.core`` (pure tensor functions),
the checkers in ``rlvr.rewards``, sampling behind ``rlvr.rollout.RolloutEngine``.

Units (TRL's): a *generation batch* holds ``per_device_train_batch_size x steps_per_generation``
completions, B = that / G prompts. It is cut into ``steps_per_generation`` micro-batches;
``gradient_accumulation_steps`` micro-batches make one optimizer step; the whole batch is
reused ``num_iterations`` times. ``max_steps``, ``save_steps`` and ``logging_steps`` count
optimizer steps. Checkpoints are taken between generation batches.

Many processes (``torchrun``, rlvr/distributed.py): every rank runs this same loop on its own
disjoint prompts, so a generation batch is world x that many completions; groups stay whole on one
rank, gradients are averaged by DDP, and rank 0 alone logs, evaluates and writes the run folder.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from rlvr import core, distributed, memory, policy_logprobs
from rlvr.batch import PackedBatch, Rollouts, batch_metrics, completion_records, pack
from rlvr.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlvr.components import (MetricLogger, PhaseTimer, build_optimizer, build_scheduler, load_model,
                             load_tokenizer, write_run_header)
from rlvr.config import Config
from rlvr.console import Console
from rlvr.dapo import GroupFilter
from rlvr.data import PromptStream, eval_rows
from rlvr.evaluate import evaluate
from rlvr.prompts import as_completion_payload, encode_prompts
from rlvr.rollout import check_mismatch, logprob_mismatch_metrics, make_engine
from rlvr.rollout.base import RolloutEngine, SamplingParams
from rlvr.scoring import RewardFn, load_reward_functions, reward_specs, score


@dataclass
class Run:
    """Everything the phases share. Built once by `setup`."""

    cfg: Config
    run_dir: Path
    dist: distributed.Dist
    device: torch.device
    model: torch.nn.Module  # the bare model: engine, no-grad passes, checkpoints
    policy: torch.nn.Module  # what the update forwards through: DDP(model) with several ranks, else model
    ref_model: torch.nn.Module | None
    tokenizer: Any
    engine: RolloutEngine
    reward_fns: list[RewardFn]
    stream: PromptStream
    optimizer: torch.optim.Optimizer
    scheduler: Any
    diagnostics: Any
    groups: GroupFilter
    logger: MetricLogger | None  # rank 0 only
    console: Console
    timer: PhaseTimer = field(default_factory=memory.PhaseMeter)  # timing/<phase>, memory/peak_<phase>
    step: int = 0  # optimizer steps taken
    generation: int = 0  # generation batches sampled (seeds sampling: resumable)
    engine_version: int = 0  # optimizer step whose weights the engine holds (stale samplers lag)
    reward_errors: dict[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ phases


def rollout(run: Run, num_prompts: int) -> Rollouts:
    """Draw prompts and sample G completions each, through the engine."""
    cfg, g = run.cfg, run.cfg.rollout.num_generations
    rows = run.groups.draw(run.stream, num_prompts)
    prompt_ids = encode_prompts(run.tokenizer, [r["prompt"] for r in rows], cfg.rollout.max_prompt_length)
    r = cfg.rollout
    # Each rank its own sampling stream (rank 0 keeps the one-process seeds): resumable, never shared.
    sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
                              repetition_penalty=r.repetition_penalty, max_tokens=r.max_completion_length,
                              stop=tuple(r.stop),
                              seed=cfg.train.seed * 1_000_003 + run.generation + run.dist.rank * 7_919_993)
    run.generation += 1
    completions = run.engine.generate(prompt_ids, g, sampling)
    return Rollouts(g, rows, prompt_ids, completions, policy_lag=run.step - run.engine_version)


def reward(run: Run, batch: Rollouts) -> None:
    """Score every completion with every reward function -> batch.rewards_NK (NaN = not scorable)."""
    g = batch.group_size
    prompts = [batch.rows[i // g]["prompt"] for i in range(len(batch))]
    texts = [as_completion_payload(p, c.text) for p, c in zip(prompts, batch.completions)]
    columns = {k: [batch.rows[i // g].get(k) for i in range(len(batch))]
               for k in batch.rows[0] if k != "prompt"}
    columns["truncated"] = batch.truncated_N()
    res = score(run.reward_fns, prompts, texts, [c.token_ids for c in batch.completions], columns)
    for name, count in res.errors.items():
        run.reward_errors[name] = run.reward_errors.get(name, 0) + count
    for msg in res.error_messages:
        run.console.warn(msg)
    for name, count in res.nan_count.items():
        run.console.warn(f"reward function {name!r} returned NaN for {count} completions; treated as None")
    batch.rewards_NK, batch.verdicts = res.rewards_NK, res.verdicts


def advantage(run: Run, batch: Rollouts) -> torch.Tensor:
    """Group-relative advantages: weighted reward sum, minus the group baseline, over the chosen std.
    Groups are whole on one rank, but batch statistics (scale_rewards="batch", the batch-normalised
    estimators) are over the whole generation batch: with several ranks, gather every rank's rewards
    (one all-gather of N x K floats), compute as one process would, keep this rank's rows."""
    a = run.cfg.algo
    weights_K = torch.tensor([rf.weight for rf in run.reward_fns], dtype=torch.float64)
    n = len(batch)
    adv_N = core.compute_advantages(distributed.all_gather_rows(batch.rewards_NK), group_size=batch.group_size,
                                    weights_K=weights_K, scale_rewards=a.scale_rewards,
                                    estimator=a.advantage_estimator)
    return adv_N[run.dist.rank * n: (run.dist.rank + 1) * n]


def completion_logprobs(run: Run, model: torch.nn.Module, mb: PackedBatch,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward over [prompt | completion]; log-probs (and entropy) of the completion tokens from
    temperature-scaled logits, as the sampler drew them, a chunk of tokens at a time (never [N, T, V])."""
    temp = run.cfg.rollout.temperature or 1.0  # greedy sampling: log-probs of the plain distribution
    return policy_logprobs.completion_logprobs(model, mb.input_ids_NL, mb.attention_mask_NL, mb.position_ids_NL,
                                               mb.completion_ids_NT, temp, with_entropy=with_entropy)


def micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, i + size) for i in range(0, n, size)]


@torch.no_grad()
def logprobs(run: Run, packed: PackedBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """old_logp (only when the ratio can differ from 1) and ref_logp (only when beta > 0).
    Each is one extra forward pass over the generation batch."""
    cfg = run.cfg
    needs_old = (cfg.algo.num_iterations > 1 or cfg.train.spg > cfg.train.gradient_accumulation_steps
                 or not run.engine.samples_live_policy)
    old_NT = ref_NT = None
    mbs = micro_batches(packed.input_ids_NL.shape[0], cfg.train.per_device_train_batch_size)
    if needs_old:
        was_training = run.model.training
        run.model.eval()
        old_NT = torch.cat([completion_logprobs(run, run.model, packed.rows(s))[0] for s in mbs])
        run.model.train(was_training)
    if cfg.algo.beta > 0:
        ref = run.ref_model
        if ref is None:  # LoRA: the reference is the base model, i.e. the adapter switched off
            with run.model.disable_adapter():
                ref_NT = torch.cat([completion_logprobs(run, run.model, packed.rows(s))[0] for s in mbs])
        else:
            ref_NT = torch.cat([completion_logprobs(run, ref, packed.rows(s))[0] for s in mbs])
    return old_NT, ref_NT


def update(run: Run, packed: PackedBatch, adv_N: torch.Tensor, old_NT: torch.Tensor | None,
           ref_NT: torch.Tensor | None, truncated_N: torch.Tensor) -> list[dict[str, float]]:
    """num_iterations passes over the generation batch; one optimizer step per GA micro-batches."""
    cfg, a, t = run.cfg, run.cfg.algo, run.cfg.train
    mask_NT = packed.mask_NT
    if a.mask_truncated_completions:  # DAPO overlong filtering: truncated completions carry no loss
        mask_NT = mask_NT * (~truncated_N).to(mask_NT.dtype).unsqueeze(1)
    # Active tokens of the whole generation batch over all ranks (the dapo/cispo normaliser, TRL's
    # num_items_in_batch): one scalar all-reduce per generation batch.
    num_items = distributed.all_reduce_sum(mask_NT.sum())
    is_w_NT, step_metrics, is_metrics = None, [], {}
    if old_NT is not None and packed.sampler_logp_NT is not None and not run.engine.samples_live_policy \
            and a.sampler_importance_sampling_correction:
        is_w_NT, is_metrics = core.sampler_importance_weights(
            old_NT, packed.sampler_logp_NT, mask_NT, mode=a.sampler_importance_sampling_mode,
            clip_max=a.sampler_importance_sampling_clip_max, clip_min=a.sampler_importance_sampling_clip_min)
    mbs = micro_batches(packed.input_ids_NL.shape[0], t.per_device_train_batch_size)
    for _ in range(a.num_iterations):
        for first in range(0, len(mbs), t.gradient_accumulation_steps):
            sums: dict[str, float] = {}
            window = mbs[first: first + t.gradient_accumulation_steps]
            for j, s in enumerate(window):
                with distributed.no_sync(run.policy, sync=j == len(window) - 1):  # DDP: all-reduce once per step
                    logp_NT, ent_NT = completion_logprobs(run, run.policy, packed.rows(s), with_entropy=True)
                    loss, metrics = core.policy_loss(
                        logp_NT, None if old_NT is None else old_NT[s], adv_N[s].to(logp_NT.dtype), mask_NT[s],
                        loss_type=a.loss_type, beta=a.beta, ref_logp_NT=None if ref_NT is None else ref_NT[s],
                        epsilon=a.epsilon, epsilon_high=a.epsilon_high, delta=a.delta,
                        importance_sampling_level=a.importance_sampling_level,
                        max_completion_length=cfg.rollout.max_completion_length, num_items_in_batch=num_items,
                        gradient_accumulation_steps=t.gradient_accumulation_steps, steps_per_generation=t.spg,
                        num_processes=run.dist.world, kl_estimator=a.kl_estimator,
                        kl_bias_correction=a.use_bias_correction_kl,
                        sapo_temperature_pos=a.sapo_temperature_pos, sapo_temperature_neg=a.sapo_temperature_neg,
                        entropy_NT=ent_NT, top_entropy_quantile=a.top_entropy_quantile,
                        sampler_is_weights_NT=None if is_w_NT is None else is_w_NT[s])
                    loss.backward()
                metrics["loss"] = loss.detach()
                if packed.sampler_logp_NT is not None:  # honest log-probs: sampler vs trainer, every step
                    metrics.update(logprob_mismatch_metrics(packed.sampler_logp_NT[s], logp_NT.detach(), mask_NT[s]))
                # One host sync per micro-batch, after backward: every metric in one stacked copy.
                values = torch.stack([v.detach().float().reshape(()) for v in metrics.values()]).tolist()
                for k, v in zip(metrics, values):
                    # The loss is already scaled for accumulation (its GA parts add up); others are averaged.
                    scale = 1.0 if k == "loss" else 1.0 / t.gradient_accumulation_steps
                    sums[k] = sums.get(k, 0.0) + v * scale
            sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(run.model.parameters(), t.max_grad_norm))
            sums["learning_rate"] = run.scheduler.get_last_lr()[0]
            run.optimizer.step()
            run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
            run.step += 1
            sums.update({k: float(v) for k, v in is_metrics.items()})
            step_metrics.append(sums)
            if run.step >= t.max_steps:
                return step_metrics
    return step_metrics


def sync(run: Run) -> None:
    """Hand new weights to an engine that keeps its own copy (vLLM); live engines need nothing. A stale
    server (``policy_lag`` attribute) only counts the step, or reloads an export every k steps."""
    if not run.engine.samples_live_policy:
        run.engine.load_weights((n, p.detach()) for n, p in run.model.named_parameters())
        if getattr(run.engine, "policy_lag", 0) > 0:
            return  # the engine still serves older weights: engine_version stays where it was
    run.engine_version = run.step


def log(run: Run, batch: Rollouts, adv_N: torch.Tensor, step_metrics: list[dict[str, float]]) -> None:
    """Metrics line, diagnostics (group outcomes, hacking monitors), samples, console. With several
    ranks, rank 0 gathers every rank's batch (one pickled gather per generation batch) and describes
    the whole generation batch, as one process would; per-rank scalars are averaged, counts summed."""
    local = (batch, adv_N, step_metrics, run.reward_errors, run.groups.pop_metrics(), run.timer.pop())
    parts = distributed.gather_to_main(local)
    if parts is None:
        return  # not rank 0: it has logged its share
    if len(parts) > 1:
        batch = Rollouts(batch.group_size)
        for p in parts:
            batch.extend(p[0])
        adv_N = torch.cat([p[1] for p in parts])
        step_metrics = distributed.reduce_step_metrics([p[2] for p in parts])
    m = batch_metrics(batch, run.reward_fns, distributed.sum_counts([p[3] for p in parts]))
    recs = completion_records(batch, run.reward_fns, adv_N, run.step)
    diag_metrics, warnings = run.diagnostics.observe(run.step, recs)
    m.update(diag_metrics)
    m.update(distributed.reduce_metrics([p[4] for p in parts]))  # DAPO counters
    for key in step_metrics[0] if step_metrics else []:
        m[key] = sum(s[key] for s in step_metrics) / len(step_metrics)
    m.update(distributed.reduce_metrics([p[5] for p in parts]))  # phase timings
    del warnings  # Diagnostics already printed them through run.console.raw
    mism = check_mismatch(m)
    if mism:
        run.console.warn(mism)
    m["tokens_per_second"] = m["num_tokens"] / max(1e-9, m.get("timing/rollout", 0.0))
    if run.step % run.cfg.log.logging_steps == 0 or run.step >= run.cfg.train.max_steps:
        run.logger.log(run.step, m)
        run.console.samples(run.step, run.diagnostics.samples(run.step, recs, echo=False), m)
    run.console.progress(run.step, m)


# ------------------------------------------------------------------------------------ setup


def setup(cfg: Config, console: Console | None = None) -> Run:
    from rlvr.diagnostics import Diagnostics
    from rlvr.diagnostics.header import run_fingerprints

    d, device = distributed.init()
    console = console or Console(enabled=cfg.log.progress and d.is_main)
    run_dir = Path(cfg.log.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.train.num_threads is not None:
        torch.set_num_threads(cfg.train.num_threads)
    random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    memory.check_fits(cfg, device)  # refuse up front, with the plan, rather than die of OOM mid-step
    tokenizer = load_tokenizer(cfg.model.path)
    model = load_model(cfg, device)
    # beta = 0 loads no reference model (TRL default); with LoRA the base model is the reference.
    ref_model = load_model(cfg, device, trainable=False) if cfg.algo.beta > 0 and not cfg.model.lora.enabled else None
    engine_options = dict(cfg.rollout.engine_options)
    if cfg.rollout.backend == "openai":  # policy exports for a reloading server live in the run folder
        engine_options.setdefault("export_dir", str(run_dir / "policy-exports"))
        Path(engine_options["export_dir"]).mkdir(parents=True, exist_ok=True)
    engine = make_engine(cfg.rollout.backend, model, tokenizer, **engine_options)
    if not getattr(engine, "receives_weights", True) and not cfg.rollout.allow_stale_sampler:
        raise ValueError(
            f"rollout backend {cfg.rollout.backend!r} cannot receive new weights, so it would sample from a "
            "stale policy. Set rollout.allow_stale_sampler=true to accept that (the lag is logged as policy_lag "
            "and corrected by importance sampling), or use a backend that takes weights (native, hf, vllm).")
    reward_fns = load_reward_functions(reward_specs(cfg))
    stream = PromptStream(cfg, d.rank, d.world)
    policy = distributed.wrap(model, d, device)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_scheduler(cfg, optimizer)
    diagnostics = Diagnostics(run_dir if d.is_main else None, cfg.rollout.num_generations, [rf.name for rf in reward_fns],
                              [rf.weight for rf in reward_fns], {rf.name: rf.kind for rf in reward_fns},
                              reward_funcs={rf.name: rf.fn for rf in reward_fns},
                              record_rollouts=cfg.log.record_rollouts and d.is_main,
                              samples_per_class=cfg.log.samples_per_class, console=console.raw)
    # Fingerprints say which data and checkers made this run: a file dataset whole, a task's stream by
    # its first 1,000 rows (same seed and options => same stream), plus the held-out rows.
    if d.is_main:
        fp_rows = stream.peek(1000) + eval_rows(cfg)
        write_run_header(run_dir, cfg, {"rewards": [rf.name for rf in reward_fns], "device": str(device),
                                        "num_processes": d.world,
                                        **run_fingerprints(fp_rows, {rf.name: rf.fn for rf in reward_fns})})
    return Run(cfg, run_dir, d, device, model, policy, ref_model, tokenizer, engine, reward_fns, stream, optimizer,
               scheduler, diagnostics,
               GroupFilter(cfg.dapo, cfg.rollout.num_generations, cfg.train.seed,
                           torch.tensor([rf.weight for rf in reward_fns], dtype=torch.float64)),
               MetricLogger(run_dir, cfg) if d.is_main else None, console)


def save(run: Run) -> Path:
    """Every rank calls this: its data position, counters and RNG go into the checkpoint beside rank 0's."""
    state = {"step": run.step, "engine_version": run.engine_version, "diagnostics": run.diagnostics.state_dict()}
    rank_state = {"generation": run.generation, "stream": run.stream.state_dict(),
                  "groups": run.groups.state_dict(), "reward_errors": run.reward_errors}
    return save_checkpoint(run.run_dir / "checkpoints", run.step, run.model, run.optimizer, run.scheduler,
                           state, keep=run.cfg.log.save_total_limit, rank_state=rank_state,
                           rank=run.dist.rank, world=run.dist.world)


def _truncate_log(path: Path, step: int) -> None:
    if path.exists():
        lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        path.write_text("".join(ln + "\n" for ln in lines))


def maybe_resume(run: Run) -> None:
    if run.cfg.resume is False:
        return
    path = latest_checkpoint(run.run_dir / "checkpoints") if run.cfg.resume is True else Path(run.cfg.resume)
    if path is None:
        run.console.info(f"resume: no checkpoint in {run.run_dir / 'checkpoints'} yet; starting fresh")
        return
    state, mine = load_checkpoint(path, run.model, run.optimizer, run.scheduler, run.dist.rank, run.dist.world)
    run.step, run.generation, run.engine_version = state["step"], mine["generation"], state["engine_version"]
    run.stream.load_state_dict(mine["stream"])
    run.diagnostics.load_state_dict(state["diagnostics"])
    run.groups.load_state_dict(mine["groups"])
    run.reward_errors = mine["reward_errors"]
    if run.dist.is_main:
        _truncate_log(run.run_dir / "metrics.jsonl", run.step)  # lines the killed attempt wrote after the checkpoint
    sync(run)
    run.console.info(f"resumed from {path} at step {run.step}")


def run_eval(run: Run, label: str) -> dict[str, float]:
    rows = eval_rows(run.cfg)
    if not rows or not run.dist.is_main:  # held-out evaluation is rank 0's; the others go on sampling
        return {}
    out = evaluate(run.engine, run.tokenizer, rows, run.reward_fns, max_tokens=run.cfg.rollout.max_completion_length,
                   stop=tuple(run.cfg.rollout.stop), max_prompt_length=run.cfg.rollout.max_prompt_length)
    run.logger.log(run.step, {f"eval/{k}": v for k, v in out.items()})
    run.console.info(f"held-out greedy accuracy ({label}, step {run.step}): {out['accuracy']:.1%} "
                     f"on {len(rows)} prompts")
    return out


# ------------------------------------------------------------------------------------ the loop


def train(cfg: Config, console: Console | None = None, on_generation: Callable[[Run], None] | None = None) -> dict:
    run = setup(cfg, console)
    maybe_resume(run)
    before = run_eval(run, "before") if cfg.log.eval_before_after and run.step == 0 else {}
    run.console.start(cfg.train.max_steps, run.step)
    while run.step < cfg.train.max_steps:
        batch = Rollouts(cfg.rollout.num_generations)
        need = cfg.prompts_per_generation
        for _round in range(cfg.dapo.max_generation_rounds if cfg.dapo.dynamic_sampling else 1):
            with run.timer("rollout"):
                part = rollout(run, run.groups.prompts_to_draw(need - batch.num_groups))
            with run.timer("reward"):
                reward(run, part)
            batch.extend(run.groups.keep(part))  # DAPO dynamic sampling drops zero-spread groups
            if batch.num_groups >= need:
                break
        batch = run.groups.finalize(batch, need, last_part=part)
        keep = distributed.common_count(batch.num_groups)  # ranks must take the same optimizer steps
        if keep < batch.num_groups:
            batch = batch.select_groups(list(range(keep)))
        with run.timer("advantage"):
            adv_N = advantage(run, batch)
        packed = pack(batch, run.tokenizer.pad_token_id, run.device)
        with run.timer("logprobs"):
            old_NT, ref_NT = logprobs(run, packed)
        step_before = run.step
        with run.timer("update"):
            step_metrics = update(run, packed, adv_N.to(run.device), old_NT, ref_NT,
                                  torch.tensor(batch.truncated_N(), device=run.device))
        with run.timer("sync"):
            sync(run)
        with run.timer("log"):
            log(run, batch, adv_N, step_metrics)
        if cfg.log.eval_steps and run.step // cfg.log.eval_steps > step_before // cfg.log.eval_steps:
            run_eval(run, "during")
        if run.step // cfg.log.save_steps > step_before // cfg.log.save_steps or run.step >= cfg.train.max_steps:
            save(run)
        if on_generation is not None:
            on_generation(run)
    after = run_eval(run, "after") if cfg.log.eval_before_after else {}
    digests = distributed.check_in_sync(run.model, run.dist)  # one gather of a hash; raises if ranks diverged
    if run.dist.is_main:
        final_dir = run.run_dir / "final"
        run.model.save_pretrained(final_dir)
        run.tokenizer.save_pretrained(final_dir)
        if run.dist.enabled:  # per-rank weight digests: the proof that every rank ended on these weights
            (final_dir / "rank-digests.json").write_text(json.dumps(digests))
        run.diagnostics.close()
        run.logger.close()
    run.engine.close()
    distributed.close()
    if run.dist.is_main:
        run.console.finish(before, after, run.run_dir)
    return {"before": before, "after": after, "run_dir": str(run.run_dir), "step": run.step}
