"""The update phase with and without the shared-prompt forward (``train.shared_prompt_forward``), on one process.

    python benchmarks/update_phase.py                       # CPU fp32, 2 threads: tiny, 27M, 135M-shaped
    python benchmarks/update_phase.py --models llama-27m --repeats 5
    python benchmarks/update_phase.py --pass-cost             # what one more completion pass costs, per model

What is timed, per model, on one micro-batch of ``--rows`` completions (groups of G = 8 rows with one prompt):
``update``: forward + backward of the GRPO (dapo) loss through ``rlvr.policy_logprobs.completion_logprobs``, as
the update phase runs it per micro-batch (the optimizer step, the same on both paths, is left out);
``logprobs``: the same forward under ``no_grad``, as the old/reference log-prob passes run it. Plain and shared
runs are interleaved (plain, shared, plain, shared, ...) so machine noise hits both; medians are printed and
their ratio ``speedup`` (plain / shared). Random weights, float32.

Workloads (``MODELS``): ``tiny``, the shipped tiny-arith model at its default task's shape (prompts of ~7
tokens, completions of 8); ``llama-27m`` (hidden 512, 8 layers, vocabulary 2048) and ``smollm2-135m-shape``
(SmolLM2-135M's config: hidden 576, 30 layers, 9 heads / 3 KV heads, intermediate 1536, vocabulary 49152, tied)
at a GRPO shape: prompts of 70-90 tokens (ragged, left-padded), completions of exactly ``--completion-len``.

``matmul_bound_fraction`` (method of benchmarks/rollout.py): the matmul FLOPs the plain path must do,
6 * body params * N * (P + T) + 6 * head params * N * T for ``update`` (2 * ... for ``logprobs``), over the time
and the FLOP/s of a large float32 matmul measured here on the same threads. For the shared path the same
numerator is used, so its fraction above the plain one is the work it did not need to do.

``--pass-cost``: the price of one more completion pass in token positions, which
``train.length_bucket_pass_cost=auto`` estimates (``rlvr.policy_logprobs.bucket_pass_cost``). Forward and backward
of the model's body over ``rows`` x ``w`` tokens at w = 1, 2, 4, 8, 16; a least-squares line through time against
positions: its intercept is a pass's own cost, its slope a position's, their ratio the price, printed beside the
estimate.

``*_cpu_s``: the process's CPU time (all threads) for the same steps, and ``speedup_cpu_time`` their ratio. On a
machine shared with other jobs, wall time mostly measures the scheduler (a 2-thread step waits at every op's
barrier for a descheduled thread, and the shared path makes twice as many forward calls, so it waits more);
CPU time is the work done. Read wall-time ratios on an idle machine, CPU-time ratios on a busy one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr import core  # noqa: E402
from rlvr.batch import Rollouts, pack  # noqa: E402
from rlvr.config import attention_implementation, load_config  # noqa: E402
from rlvr.policy_logprobs import completion_logprobs  # noqa: E402
from rlvr.rollout.base import Completion  # noqa: E402

G = 8
MODELS = ("tiny", "llama-27m", "smollm2-135m-shape")


def build(name: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name == "tiny":
        from rlvr.models import tiny_model_path

        return AutoModelForCausalLM.from_pretrained(tiny_model_path())
    if name == "llama-27m":
        cfg = LlamaConfig(
            vocab_size=2048,
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=8,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
        )
    elif name == "smollm2-135m-shape":
        cfg = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            tie_word_embeddings=True,
        )
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return LlamaForCausalLM(cfg)


def batch(name: str, vocab: int, rows: int, completion_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    groups = rows // G
    if name == "tiny":
        prompt_lens, t = [int(x) for x in torch.randint(6, 9, (groups,), generator=g)], 8
    else:
        prompt_lens, t = [int(x) for x in torch.randint(70, 91, (groups,), generator=g)], completion_len
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in prompt_lens]
    comps = [
        Completion(i // G, torch.randint(3, vocab, (t,), generator=g).tolist(), "", "length") for i in range(groups * G)
    ]
    return pack(Rollouts(G, [{"prompt": ""}] * groups, prompts, comps), 0, torch.device("cpu"))


def step(model, mb, shared: bool, grad: bool) -> tuple[float, float]:
    """(wall seconds, process CPU seconds over all threads) of one micro-batch."""
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.set_grad_enabled(grad):
        logp_NT, ent_NT = completion_logprobs(
            model,
            mb.input_ids_NL,
            mb.attention_mask_NL,
            mb.position_ids_NL,
            mb.completion_ids_NT,
            1.0,
            with_entropy=grad,
            shared_prompt=shared,
        )
        if grad:
            adv_N = torch.linspace(-1, 1, logp_NT.shape[0])
            loss, _ = core.policy_loss_from(
                core.LossSettings(loss_type="dapo"),
                core.BatchGeometry(num_items_in_batch=mb.mask_NT.sum()),
                logp_NT,
                None,
                adv_N,
                mb.mask_NT,
                entropy_NT=ent_NT,
            )
            loss.backward()
            model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, time.process_time() - c0


def pass_cost(model, rows: int, repeats: int) -> dict:
    """One completion pass's own cost against a position's, measured (module docstring) and estimated."""
    from rlvr.policy_logprobs import bucket_pass_cost

    body, points = model.get_decoder(), []
    for width in (1, 2, 4, 8, 16):
        ids = torch.randint(3, model.config.vocab_size, (rows, width), generator=torch.Generator().manual_seed(0))
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            body(input_ids=ids).last_hidden_state.sum().backward()
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        points.append((rows * width, statistics.median(times[1:])))
    slope, intercept = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return {"rows": rows, "pass_s": round(intercept, 5), "position_s": round(slope, 8),
            "measured_positions": round(intercept / slope), "auto_positions": bucket_pass_cost(model),
            "points": [(x, round(y, 5)) for x, y in points]}


def matmul_flops(size: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * size**3 * reps / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--rows", type=int, default=16, help="completions per micro-batch (G = 8 per prompt)")
    ap.add_argument("--completion-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pass-cost", action="store_true", help="measure one more completion pass's price instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.pass_cost:
        for name in args.models:
            model = build(name).float().train()
            attention = attention_implementation(load_config(None, []), "cpu", model.config.hidden_size)
            model.set_attn_implementation(attention or "sdpa")  # as the trainer loads it
            res = pass_cost(model, 256 if name == "tiny" else args.rows, max(args.repeats, 5))
            print(json.dumps({name: res}), flush=True)
        return
    peak = matmul_flops()
    out = {"threads": args.threads, "dtype": "float32", "group_size": G, "matmul_flops_per_s": peak, "models": {}}
    for name in args.models:
        model = build(name).float().train()
        rows = args.rows if name != "tiny" else 128
        mb = batch(name, model.config.vocab_size, rows, args.completion_len)
        N, L = mb.input_ids_NL.shape
        T = mb.num_completion_tokens
        P = L - T
        head = model.get_output_embeddings().weight.numel()
        body = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
        body -= 0 if model.config.tie_word_embeddings else head  # the untied head is counted apart
        useful = body * N * (P + T) + head * N * T  # multiply-adds of one plain forward
        res = {
            "rows": N,
            "prompt_tokens_padded": P,
            "mean_prompt_tokens": float(mb.attention_mask_NL[:, :P].sum(1).float().mean()),
            "completion_tokens": T,
            "params": sum(p.numel() for p in model.parameters()),
        }
        for phase, grad, factor in (("update", True, 6), ("logprobs", False, 2)):
            step(model, mb, False, grad), step(model, mb, True, grad)  # warm-up
            times = {False: [], True: []}
            for _ in range(args.repeats):
                for shared in (False, True):
                    times[shared].append(step(model, mb, shared, grad))
            wall = {k: [w for w, _ in v] for k, v in times.items()}
            cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
            plain, shared = statistics.median(wall[False]), statistics.median(wall[True])
            res[phase] = {
                "plain_s": round(plain, 4),
                "shared_s": round(shared, 4),
                "speedup": round(plain / shared, 3),
                "plain_best_s": round(min(wall[False]), 4),
                "shared_best_s": round(min(wall[True]), 4),
                "plain_cpu_s": round(cpu[False], 4),
                "shared_cpu_s": round(cpu[True], 4),
                "speedup_cpu_time": round(cpu[False] / cpu[True], 3),
                "matmul_bound_fraction_plain": round(factor * useful / plain / peak, 3),
                "matmul_bound_fraction_shared": round(factor * useful / shared / peak, 3),
            }
        out["models"][name] = res
        print(json.dumps({name: res}), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
