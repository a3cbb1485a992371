"""A complete GRPO loop in one file: rlvr.core for the maths, plain transformers for the model.

Task: "a+1=" -> the digit a + 1, then end-of-sequence. Two verifiable reward functions (programs, not
models) check it: one for the right digit, one for the right digit *and* a clean stop. The policy is a tiny
random Llama built from a config, so everything it learns, it learns here, from reward alone. (It is a toy
on purpose: anything harder takes a randomly initialised model far more than a minute to discover.)

    python examples/minimal_grpo.py                 # ~1 minute on 2 CPU cores
    python examples/minimal_grpo.py --loss-type grpo --steps 100

One step, as in docs/architecture.md: sample G completions per prompt -> score them -> group-relative advantages
-> clipped policy-gradient update (num_iterations passes over the batch; the first is exactly on-policy).
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from transformers import LlamaForCausalLM

from rlvr.core import completion_mask, compute_advantages, policy_loss, rewards_from_lists, token_logprobs
from rlvr.models.toy import toy_model

# A character-level vocabulary is enough for this task and needs no tokenizer files.
VOCAB = list("0123456789+=") + ["<pad>", "<bos>", "<eos>"]
PAD, BOS, EOS = VOCAB.index("<pad>"), VOCAB.index("<bos>"), VOCAB.index("<eos>")
TOKEN_ID = {ch: i for i, ch in enumerate(VOCAB)}


def encode_prompt(a: int, b: int) -> list[int]:
    return [BOS] + [TOKEN_ID[ch] for ch in f"{a}+{b}="]


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] if i < 12 else "" for i in ids)


# --- reward functions: like TRL's, one value (or None) per completion ------------------------------------
def right_digit(completions: list[list[int]], problems: list[tuple[int, int]]) -> list[float | None]:
    """1.0 when the completion starts with the digit a + b (partial credit: it may not stop cleanly)."""
    return [float(ids[:1] == [TOKEN_ID[str(a + b)]]) for ids, (a, b) in zip(completions, problems, strict=True)]


def exact_answer(completions: list[list[int]], problems: list[tuple[int, int]]) -> list[float | None]:
    """1.0 when the completion is exactly the digit a + b followed by <eos>; a truncated answer scores 0."""
    return [float(ids == [TOKEN_ID[str(a + b)], EOS]) for ids, (a, b) in zip(completions, problems, strict=True)]


# Weighted sum: 1.0 for an exact answer, 0.5 for the right digit that runs on. The partial credit matters:
# from a random start, "right digit then <eos>" is about a 1-in-225 event, and a group whose G rewards are all
# equal has zero advantage everywhere and teaches nothing.
REWARD_FUNCS, REWARD_WEIGHTS = [right_digit, exact_answer], [0.5, 0.5]


def build_policy(seed: int) -> LlamaForCausalLM:
    # rlvr's toy-model factory: a transformers LlamaForCausalLM from a config, random weights.
    return toy_model(
        "llama",
        len(VOCAB),
        seed=seed,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=32,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=True,
    )


@torch.no_grad()
def sample(model, prompt_ids_BP: torch.Tensor, group_size: int, max_new_tokens: int, temperature: float):
    """G completions per prompt; returns completion ids [N, T] with N = B·G, rows grouped by prompt."""
    out = model.generate(
        prompt_ids_BP,
        attention_mask=torch.ones_like(prompt_ids_BP),
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        num_return_sequences=group_size,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    return out[:, prompt_ids_BP.shape[1] :]


def completion_logprobs(model, prompt_ids_NP, completion_ids_NT, mask_NT, temperature):
    """log π(token) for every completion token, from temperature-scaled logits (what was sampled from)."""
    ids = torch.cat([prompt_ids_NP, completion_ids_NT], dim=1)
    attention = torch.cat([torch.ones_like(prompt_ids_NP), mask_NT], dim=1)
    logits = model(input_ids=ids, attention_mask=attention).logits
    P = prompt_ids_NP.shape[1]
    # Position t predicts token t+1: the logits for completion token j sit at P - 1 + j.
    return token_logprobs(logits[:, P - 1 : -1], completion_ids_NT, temperature)


@torch.no_grad()
def greedy_accuracy(model, problems: list[tuple[int, int]]) -> float:
    prompts = torch.tensor([encode_prompt(a, b) for a, b in problems])
    out = model.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        do_sample=False,
        max_new_tokens=2,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    completions = out[:, prompts.shape[1] :].tolist()
    return sum(exact_answer(completions, problems)) / len(problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8, help="G, completions per prompt (num_generations)")
    parser.add_argument(
        "--loss-type", default="dapo", help="grpo | bnpo | dr_grpo | dapo | gspo | cispo | sapo | luspo"
    )
    parser.add_argument("--num-iterations", type=int, default=1, help="updates per generation batch (μ)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--beta", type=float, default=0.0, help="KL weight; > 0 keeps a frozen copy as reference")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)  # an 83k-parameter model: threading overhead outweighs the parallel work
    random.seed(args.seed)
    model = build_policy(args.seed)
    reference = build_policy(args.seed).eval() if args.beta > 0 else None  # same init = the starting policy
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    all_problems = [(a, 1) for a in range(9)]
    G, max_new_tokens = args.group_size, 3
    print(
        f"params {sum(p.numel() for p in model.parameters()) / 1e3:.0f}k | greedy accuracy before "
        f"{greedy_accuracy(model, all_problems):.2f} | loss_type={args.loss_type}"
    )

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        # Rollout: B prompts, G samples each, rows ordered prompt by prompt (what compute_advantages expects).
        problems = random.sample(all_problems, args.prompts_per_step)
        prompt_ids_BP = torch.tensor([encode_prompt(a, b) for a, b in problems])
        model.eval()
        completion_ids_NT = sample(model, prompt_ids_BP, G, max_new_tokens, args.temperature)
        mask_NT = completion_mask(completion_ids_NT, EOS)
        prompt_ids_NP = prompt_ids_BP.repeat_interleave(G, dim=0)
        problems_N = [p for p in problems for _ in range(G)]

        # Reward: each function returns one value per completion (only the tokens up to the first <eos>).
        completions = [ids[: int(m.sum())] for ids, m in zip(completion_ids_NT.tolist(), mask_NT, strict=True)]
        rewards_NK = rewards_from_lists([f(completions, problems_N) for f in REWARD_FUNCS])
        adv_N = compute_advantages(rewards_NK, group_size=G, weights_K=REWARD_WEIGHTS, scale_rewards="group")

        # Old log-probs are needed only from the second pass on: on the first, the ratio is exactly 1.
        model.train()
        old_logp_NT = None
        if args.num_iterations > 1:
            with torch.no_grad():
                old_logp_NT = completion_logprobs(model, prompt_ids_NP, completion_ids_NT, mask_NT, args.temperature)
        ref_logp_NT = None
        if reference is not None:
            with torch.no_grad():
                ref_logp_NT = completion_logprobs(
                    reference, prompt_ids_NP, completion_ids_NT, mask_NT, args.temperature
                )

        # Update: the whole generation batch is one micro-batch here (one process, no accumulation).
        for iteration in range(args.num_iterations):
            logp_NT = completion_logprobs(model, prompt_ids_NP, completion_ids_NT, mask_NT, args.temperature)
            loss, metrics = policy_loss(
                logp_NT,
                old_logp_NT if iteration > 0 else None,
                adv_N,
                mask_NT,
                loss_type=args.loss_type,
                beta=args.beta,
                ref_logp_NT=ref_logp_NT,
                max_completion_length=max_new_tokens,
                epsilon_high=5.0 if args.loss_type == "cispo" else 0.28,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

        if step % 25 == 0 or step == 1:
            correct = rewards_NK[:, 1]  # exact answers
            all_same = (correct.view(-1, G).std(dim=1) == 0).float().mean()
            clip = metrics.get("clip_ratio/region_mean", torch.tensor(float("nan")))
            print(
                f"step {step:3d} | reward {correct.mean():.2f} | zero-std groups {all_same:.2f} | "
                f"len {mask_NT.sum(1).float().mean():.2f} | loss {loss.item():+.4f} | grad {grad_norm:.3f} | "
                f"clip {clip:.3f} | {time.perf_counter() - start:.0f}s"
            )
    print(f"greedy accuracy after {greedy_accuracy(model, all_problems):.2f}")
    shown = [(3, 1), (7, 1)]
    samples = sample(model.eval(), torch.tensor([encode_prompt(a, b) for a, b in shown]), 1, 3, 1.0).tolist()
    print("samples at temperature 1:", [f"{a}+{b}={decode(ids)}" for (a, b), ids in zip(shown, samples, strict=True)])


if __name__ == "__main__":
    main()
