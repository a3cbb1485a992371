"""THE loop. One GRPO step, phase by phase (docs/architecture.md):

    collect (draw -> rollout -> reward -> keep) -> advantage -> logprobs -> update -> sync -> log

Each phase is one function below, timed as ``timing/<phase>``, and returns what it produces. ``train(cfg)`` reads
top to bottom; copy it if you need a different loop. The math lives in ``rlvr.core`` (pure tensor functions), the
checkers in ``rlvr.rewards``, sampling behind ``rlvr.rollout.RolloutEngine``, whose declared capabilities are all the
loop asks of an engine. Units (TRL's: generation batch, micro-batch, optimizer step) and several processes
(``torchrun``: disjoint prompts per rank, groups whole on one rank, DDP or FSDP2, rank 0 logs): architecture page.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rlvr import core, distributed, memory, offload, policy_logprobs
from rlvr.batch import LogProbs, PackedBatch, Rollouts, batch_metrics, completion_records, pack
from rlvr.builders import (UpdateThreads, build_engine, build_loss_settings, build_optimizer, build_scheduler,
                           load_model, load_reference, load_tokenizer, update_threads)
from rlvr.checkpoint import resume_run, save_final, save_run
from rlvr.config import Config
from rlvr.console import Console
from rlvr.diagnostics import Diagnostics
from rlvr.diagnostics.roles import declared_roles
from rlvr.diagnostics.shadow import shadow_grader_for
from rlvr.diagnostics.sinks import MetricLogger, PhaseTimer, write_run_header
from rlvr.dynamic_sampling import GroupFilter
from rlvr.evaluate import evaluate
from rlvr.rewards.scoring import RewardFn, load_reward_functions, reward_specs, score
from rlvr.rollout import check_mismatch, logprob_mismatch_metrics
from rlvr.rollout.base import RolloutEngine, SamplingParams
from rlvr.tasks.prompts import as_completion_payload, encode_prompts
from rlvr.tasks.stream import PromptStream, eval_rows


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
    group_filter: GroupFilter | None  # DAPO dynamic sampling / prompt skipping; None when both are off
    logger: MetricLogger | None  # rank 0 only
    console: Console
    update_threads: UpdateThreads  # torch threads of the trainer's passes (train.update_threads resolved)
    timer: PhaseTimer = field(default_factory=memory.PhaseMeter)  # timing/<phase>, memory/peak_<phase>
    step: int = 0  # optimizer steps taken
    generation: int = 0  # generation batches sampled (seeds sampling: resumable)
    engine_version: int = 0  # optimizer step whose weights the engine holds (stale samplers lag)
    reward_errors: dict[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ phases


def collect(run: Run) -> Rollouts:
    """Batch assembly: draw prompts, sample and score G completions each. With DAPO dynamic sampling,
    zero-spread groups are dropped and more prompts drawn, for at most ``max_generation_rounds``."""
    need, group_filter = run.cfg.prompts_per_generation, run.group_filter
    rounds = run.cfg.dapo.max_generation_rounds if run.cfg.dapo.dynamic_sampling else 1
    batch = Rollouts(run.cfg.rollout.num_generations)
    for _round in range(rounds):
        missing = need - batch.num_groups
        rows = (run.stream.take(missing) if group_filter is None
                else group_filter.draw(run.stream, group_filter.prompts_to_draw(missing)))
        with run.timer("rollout"):
            part = rollout(run, rows)
        with run.timer("reward"):
            part = reward(run, part)
        batch.extend(part if group_filter is None else group_filter.keep(part))
        if batch.num_groups >= need:
            break
    if group_filter is not None:
        batch = group_filter.finalize(batch, need, last_part=part)
    same_on_every_rank = distributed.common_count(batch.num_groups)  # ranks must take the same optimizer steps
    return batch.select_groups(list(range(same_on_every_rank))) if same_on_every_rank < batch.num_groups else batch


def sampling_params(cfg: Config, seed: int | None = None) -> SamplingParams:
    rollout_cfg = cfg.rollout
    return SamplingParams(temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p, top_k=rollout_cfg.top_k,
                          min_p=rollout_cfg.min_p, repetition_penalty=rollout_cfg.repetition_penalty,
                          max_tokens=rollout_cfg.max_completion_length, stop=tuple(rollout_cfg.stop), seed=seed)


def rollout(run: Run, rows: list[dict]) -> Rollouts:
    """Sample G completions for each prompt row, through the engine."""
    cfg, group_size = run.cfg, run.cfg.rollout.num_generations
    prompt_ids = encode_prompts(run.tokenizer, [r["prompt"] for r in rows], cfg.rollout.max_prompt_length)
    # Each rank its own sampling stream (rank 0 keeps the one-process seeds): resumable, never shared.
    seed = cfg.train.seed * 1_000_003 + run.generation + run.dist.rank * 7_919_993
    run.generation += 1
    completions = run.engine.generate(prompt_ids, group_size, sampling_params(cfg, seed))
    return Rollouts(group_size, rows, prompt_ids, completions, policy_lag=run.step - run.engine_version)


def reward(run: Run, batch: Rollouts) -> Rollouts:
    """Score every completion with every reward function: the batch with rewards_NK (NaN = not scorable)."""
    group_size = batch.group_size
    prompts = [batch.rows[i // group_size]["prompt"] for i in range(len(batch))]
    texts = [as_completion_payload(p, c.text) for p, c in zip(prompts, batch.completions)]
    columns = {k: [batch.rows[i // group_size].get(k) for i in range(len(batch))]
               for k in batch.rows[0] if k != "prompt"}
    columns["truncated"] = batch.truncated_N()
    scored = score(run.reward_fns, prompts, texts, [c.token_ids for c in batch.completions], columns)
    for name, count in scored.errors.items():
        run.reward_errors[name] = run.reward_errors.get(name, 0) + count
    for msg in scored.error_messages:
        run.console.warn(msg)
    for name, count in scored.nan_count.items():
        run.console.warn(f"reward function {name!r} returned NaN or inf for {count} completions; treated as None")
    return replace(batch, rewards_NK=scored.rewards_NK, verdicts=scored.verdicts)


def advantage(run: Run, batch: Rollouts) -> torch.Tensor:
    """Group-relative advantages: weighted reward sum, minus the group baseline, over the chosen std.
    Groups are whole on one rank, but batch statistics (scale_rewards="batch", the batch-normalised
    estimators) are over the whole generation batch: with several ranks, gather every rank's rewards
    (one all-gather of N x K floats), compute as one process would, keep this rank's rows."""
    algo = run.cfg.algo
    weights_K = torch.tensor([rf.weight for rf in run.reward_fns], dtype=torch.float64)
    n = len(batch)
    adv_N = core.compute_advantages(distributed.all_gather_rows(batch.rewards_NK), group_size=batch.group_size,
                                    weights_K=weights_K, scale_rewards=algo.scale_rewards,
                                    estimator=algo.advantage_estimator)
    return adv_N[run.dist.rank * n: (run.dist.rank + 1) * n]


def completion_logprobs(run: Run, model: torch.nn.Module, mb: PackedBatch,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward over [prompt | completion] (or, shared_prompt_forward, each group packed as one sequence, or a pass
    per distinct prompt, then the completions by length against its keys/values); log-probs (and entropy) of the
    completion tokens from temperature-scaled logits, as the sampler drew them, a chunk at a time (never [N, T, V])."""
    temp, t = run.cfg.rollout.temperature or 1.0, run.cfg.train  # temperature 0: log-probs of the plain distribution
    with torch.autocast(run.device.type, torch.bfloat16, enabled=t.mixed_precision == "bf16"):
        return policy_logprobs.completion_logprobs(
            model, mb.input_ids_NL, mb.attention_mask_NL, mb.position_ids_NL, mb.completion_ids_NT, temp, with_entropy,
            shared_prompt=t.shared_prompt_forward, pass_cost=t.length_bucket_pass_cost, group_packing=t.group_packing)


@torch.no_grad()
def logprobs(run: Run, packed: PackedBatch, truncated_N: torch.Tensor) -> LogProbs:
    """old_logp (only when the ratio can differ from 1) and ref_logp (only when beta > 0), each one extra
    forward pass over the generation batch; then the loss mask and the sampler importance weights."""
    cfg, algo, engine = run.cfg, run.cfg.algo, run.engine
    needs_old = (algo.num_iterations > 1 or cfg.train.micro_batches_per_generation > cfg.train.gradient_accumulation_steps
                 or not engine.samples_live_policy)
    old_NT = ref_NT = None
    mbs = packed.micro_batches(cfg.train.per_device_train_batch_size)
    if needs_old:
        was_training = run.model.training
        run.model.eval()
        old_NT = torch.cat([completion_logprobs(run, run.model, packed.rows(s))[0] for s in mbs])
        run.model.train(was_training)
    if algo.beta > 0:
        if run.ref_model is None:  # LoRA: the reference is the base model, i.e. the adapter switched off
            with run.model.disable_adapter():
                ref_NT = torch.cat([completion_logprobs(run, run.model, packed.rows(s))[0] for s in mbs])
        else:
            with offload.loaded(run.ref_model):  # train.ref_offload: read from its file for this pass only
                ref_NT = torch.cat([completion_logprobs(run, run.ref_model, packed.rows(s))[0] for s in mbs])
    loss_mask_NT = packed.mask_NT
    if algo.mask_truncated_completions:  # DAPO overlong filtering: truncated completions carry no loss
        loss_mask_NT = loss_mask_NT * (~truncated_N).to(loss_mask_NT.dtype).unsqueeze(1)
    weight_NT, weight_metrics = None, {}
    # A sampler that is not the live policy (vLLM, a stale server) and reports its log-probs: correct for it.
    if (old_NT is not None and packed.sampler_logp_NT is not None and engine.reports_logprobs
            and not engine.samples_live_policy and algo.sampler_importance_sampling_correction):
        weight_NT, weight_metrics = core.sampler_importance_weights(
            old_NT, packed.sampler_logp_NT, loss_mask_NT, mode=algo.sampler_importance_sampling_mode,
            clip_max=algo.sampler_importance_sampling_clip_max, clip_min=algo.sampler_importance_sampling_clip_min)
    return LogProbs(old_NT, ref_NT, loss_mask_NT, weight_NT, weight_metrics)


def update(run: Run, packed: PackedBatch, adv_N: torch.Tensor, logps: LogProbs) -> list[dict[str, float]]:
    """num_iterations passes over the generation batch; one optimizer step per GA micro-batches."""
    cfg, train_cfg = run.cfg, run.cfg.train
    accumulation = train_cfg.gradient_accumulation_steps
    mask_NT, settings = logps.loss_mask_NT, build_loss_settings(cfg.algo)
    # Active tokens of the whole generation batch over all ranks (the dapo/cispo normaliser, TRL's
    # num_items_in_batch): one scalar all-reduce per generation batch.
    geometry = core.BatchGeometry(
        gradient_accumulation_steps=accumulation, steps_per_generation=train_cfg.micro_batches_per_generation,
        num_processes=run.dist.world, num_items_in_batch=distributed.all_reduce_sum(mask_NT.sum()),
        max_completion_length=cfg.rollout.max_completion_length)
    rows = lambda x, s: None if x is None else x[s]  # noqa: E731 - a micro-batch's rows of an optional tensor
    step_metrics = []
    mbs = packed.micro_batches(train_cfg.per_device_train_batch_size)
    for _ in range(cfg.algo.num_iterations):
        for first in range(0, len(mbs), accumulation):
            sums: dict[str, float] = {}
            window = mbs[first: first + accumulation]
            for j, s in enumerate(window):
                with distributed.no_sync(run.policy, sync=j == len(window) - 1):  # DDP: all-reduce once per step
                    logp_NT, ent_NT = completion_logprobs(run, run.policy, packed.rows(s), with_entropy=True)
                    loss, metrics = core.policy_loss_from(
                        settings, geometry, logp_NT, rows(logps.old_NT, s), adv_N[s].to(logp_NT.dtype), mask_NT[s],
                        ref_logp_NT=rows(logps.ref_NT, s), entropy_NT=ent_NT,
                        sampler_is_weights_NT=rows(logps.sampler_weight_NT, s))
                    loss.backward()
                metrics["loss"] = loss.detach()
                if packed.sampler_logp_NT is not None:  # honest log-probs: sampler vs trainer, every step
                    sampler_NT = packed.sampler_logp_NT[s]
                    scored_NT = mask_NT[s] * ~torch.isnan(sampler_NT)  # rows the engine gave no log-probs for: skipped
                    metrics.update(logprob_mismatch_metrics(sampler_NT, logp_NT.detach(), scored_NT))
                # One host sync per micro-batch, after backward: every metric in one stacked copy.
                values = torch.stack([v.detach().float().reshape(()) for v in metrics.values()]).tolist()
                for k, v in zip(metrics, values):
                    # The loss is already scaled for accumulation (its GA parts add up); others are averaged.
                    sums[k] = sums.get(k, 0.0) + v * (1.0 if k == "loss" else 1.0 / accumulation)
            sums["grad_norm"] = float(offload.clip_grad_norm_(run.optimizer, run.model, train_cfg.max_grad_norm))
            sums["learning_rate"] = float(run.scheduler.get_last_lr()[0])  # torchao's optimizers keep a tensor
            run.optimizer.step()
            run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
            run.step += 1
            sums.update({k: float(v) for k, v in logps.sampler_metrics.items()})
            step_metrics.append(sums)
            if run.step >= train_cfg.max_steps:
                return step_metrics
    return step_metrics


def sync(run: Run) -> None:
    """Hand the new weights to the engine: one that keeps its own copy (vLLM, a sharded policy's gathered
    copy on every rank) loads them; one that samples the live policy ignores them. A stale server only
    counts the step, or reloads an export every k steps: while its ``policy_lag`` is above 0 it still
    serves older weights and engine_version stays where it was."""
    run.engine.load_weights((n, p.detach()) for n, p in run.model.named_parameters())
    if run.engine.policy_lag == 0:
        run.engine_version = run.step


def log(run: Run, batch: Rollouts, adv_N: torch.Tensor, step_metrics: list[dict[str, float]]) -> None:
    """Metrics line, diagnostics (group outcomes, hacking monitors), samples, console. With several
    ranks, rank 0 gathers every rank's batch (one pickled gather per generation batch) and describes
    the whole generation batch, as one process would; per-rank scalars are averaged, counts summed."""
    filters = run.group_filter.pop_metrics() if run.group_filter is not None else {}
    held = {**run.timer.pop(), **memory.training_state(run.model, run.optimizer)}  # phase timings, memory
    local = (batch, adv_N, step_metrics, run.reward_errors, filters, held)
    parts = distributed.gather_to_main(local)
    if parts is None:
        return  # not rank 0: it has logged its share
    batches, advantages, rank_steps, reward_errors, filter_counts, timings = zip(*parts)
    if len(parts) > 1:
        batch = Rollouts(batch.group_size)
        for rank_batch in batches:
            batch.extend(rank_batch)
        adv_N = torch.cat(advantages)
        step_metrics = distributed.reduce_step_metrics(list(rank_steps))
    metrics = batch_metrics(batch, run.reward_fns, distributed.sum_counts(list(reward_errors)))
    records = completion_records(batch, run.reward_fns, adv_N, run.step)
    diag_metrics, _warnings = run.diagnostics.observe(run.step, records)  # already printed on the console
    metrics.update(diag_metrics)
    metrics.update(distributed.reduce_metrics(list(filter_counts)))  # DAPO counters
    for key in step_metrics[0] if step_metrics else []:
        metrics[key] = sum(s[key] for s in step_metrics) / len(step_metrics)
    metrics.update(distributed.reduce_metrics(list(timings)))  # phase timings, memory (mean over ranks)
    mismatch_warning = check_mismatch(metrics)
    if mismatch_warning:
        run.console.warn(mismatch_warning)
    metrics["tokens_per_second"] = metrics["num_tokens"] / max(1e-9, metrics.get("timing/rollout", 0.0))
    if run.step % run.cfg.log.logging_steps == 0 or run.step >= run.cfg.train.max_steps:
        run.logger.log(run.step, metrics)
        run.console.samples(run.step, run.diagnostics.samples(run.step, records, echo=False), metrics)
    run.console.progress(run.step, metrics)


# ------------------------------------------------------------------------------------ setup


def setup(cfg: Config, console: Console | None = None) -> Run:
    dist, device = distributed.init()
    console = console or Console(enabled=cfg.log.progress and dist.is_main)
    run_dir = Path(cfg.log.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.train.num_threads is not None:
        torch.set_num_threads(cfg.train.num_threads)
    random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    fit = memory.check_fits(cfg, device)  # refuse up front, with the plan, rather than die of OOM mid-step
    if device.type == "cpu" and memory.heap_release_wanted(cfg.train.release_freed_memory, fit):
        memory.release_freed_memory()  # the resident set follows the tensors, as the plan assumes
    tokenizer = load_tokenizer(cfg.model.path)
    model = load_model(cfg, device)
    ref_model = load_reference(cfg, device, run_dir, dist.rank)  # None: beta = 0, or LoRA's base is the reference
    # Under FSDP the engine samples a gathered full copy, built before the model is sharded.
    engine = distributed.rollout_engine(model, lambda m: build_engine(cfg, m, tokenizer, run_dir), dist,
                                        cfg.train.parallelism)
    reward_fns = load_reward_functions(reward_specs(cfg))
    stream = PromptStream(cfg, dist.rank, dist.world)
    policy = distributed.wrap(model, dist, device, cfg.train.parallelism, cfg.train.fsdp_cpu_offload)
    ref_model = distributed.wrap_reference(ref_model, dist, device, cfg.train.parallelism)
    optimizer = build_optimizer(cfg, model, run_dir, dist.rank)
    scheduler = build_scheduler(cfg, optimizer)
    diagnostics = Diagnostics(run_dir if dist.is_main else None, cfg.rollout.num_generations, [rf.name for rf in reward_fns],
                              [rf.weight for rf in reward_fns], declared_roles(cfg.rewards, reward_fns),
                              reward_funcs={rf.name: rf.fn for rf in reward_fns},
                              shadow=shadow_grader_for(cfg, stream.peek(1), {rf.name: rf.fn for rf in reward_fns}),
                              record_rollouts=cfg.log.record_rollouts and dist.is_main,
                              samples_per_class=cfg.log.samples_per_class, console=console.raw)
    if dist.is_main:  # which data, checkers, machine and decoder made this run
        decoder = engine.describe(sampling_params(cfg))  # decoders draw different random streams: say which
        console.info(f"rollout: {decoder}")
        write_run_header(run_dir, cfg, stream, reward_fns, {"device": str(device), "num_processes": dist.world,
                                                            "rollout_decoder": decoder})
    weights_K = torch.tensor([rf.weight for rf in reward_fns], dtype=torch.float64)
    group_filter = (GroupFilter(cfg.dapo, cfg.rollout.num_generations, cfg.train.seed, weights_K, warn=console.warn)
                    if cfg.dapo.dynamic_sampling or cfg.dapo.skip_solved_prompts else None)
    return Run(cfg, run_dir, dist, device, model, policy, ref_model, tokenizer, engine, reward_fns, stream, optimizer,
               scheduler, diagnostics, group_filter, MetricLogger(run_dir, cfg, console.warn) if dist.is_main else None,
               console, update_threads(cfg, model, device))


def maybe_resume(run: Run) -> None:
    """Restore the newest (or the named) checkpoint when ``resume`` asks for it; hand the engine the weights."""
    path = resume_run(run)
    if path is not None:
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


def train(cfg: Config, console: Console | None = None) -> dict:
    """Claim the run folder (an occupied one is refused, see rlvr.runfolder), check the inputs before any
    model loads (rlvr.preflight), then run the loop."""
    from rlvr.preflight import preflight
    from rlvr.runfolder import claim_run_folder

    console = console or Console(enabled=cfg.log.progress and os.environ.get("RANK", "0") == "0")
    with claim_run_folder(cfg, console, preflight=lambda: preflight(cfg, console)), console.own_warnings():
        return _train(cfg, console)


def _train(cfg: Config, console: Console) -> dict:
    run = setup(cfg, console)
    maybe_resume(run)
    before = run_eval(run, "before") if cfg.log.eval_before_after and run.step == 0 else {}
    run.console.start(cfg.train.max_steps, run.step)
    while run.step < cfg.train.max_steps:
        batch = collect(run)  # times its own rollout and reward phases
        with run.timer("advantage"):
            adv_N = advantage(run, batch)
        packed = pack(batch, run.tokenizer.pad_token_id, run.device)
        with run.timer("logprobs"), run.update_threads.applied():
            logps = logprobs(run, packed, torch.tensor(batch.truncated_N(), device=run.device))
        step_before = run.step
        with run.timer("update"), run.update_threads.applied(measure=True):
            step_metrics = update(run, packed, adv_N.to(run.device), logps)
        with run.timer("sync"):
            sync(run)
        with run.timer("log"):
            log(run, batch, adv_N, step_metrics)
        if cfg.log.eval_steps and run.step // cfg.log.eval_steps > step_before // cfg.log.eval_steps:
            run_eval(run, "during")
        if run.step // cfg.log.save_steps > step_before // cfg.log.save_steps or run.step >= cfg.train.max_steps:
            save_run(run)
    after = run_eval(run, "after") if cfg.log.eval_before_after else {}
    run.engine.close()  # first: under FSDP it frees the rollout copy before the final save gathers the weights
    save_final(run.run_dir / "final", run.model, run.tokenizer, run.dist)  # every rank: FSDP gathers the weights
    offload.close(run.optimizer, run.ref_model)  # the files of train.optim_offload, grad_offload, ref_offload
    if run.dist.is_main:
        run.diagnostics.close()
        run.logger.close()
    distributed.close()
    if run.dist.is_main:
        run.console.finish(before, after, run.run_dir)
    return {"before": before, "after": after, "run_dir": str(run.run_dir), "step": run.step}
