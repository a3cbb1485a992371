"""Build the tiny model rlvr ships (rlvr/models/tiny-arith): a character-level Llama that adds
2-digit numbers but, greedily, usually forgets to carry.

Why this model. Reinforcement learning from verifiable rewards can only raise the probability of
answers the model already samples: a group where every completion fails has zero advantage and no
gradient. So the default job needs a model whose *greedy* answer is often wrong while its
*samples* are sometimes right. We get one by supervised training on answers that are right for
problems without a carry, and for problems with a carry are right only ``--p-correct`` of the
time (default 0.3): otherwise the answer is written the way a pupil who never carries writes it,
each column summed on its own and kept mod 10 (``37+45`` -> ``72``, ``73+52`` -> ``25``).
About 76% of 2-digit additions (operands 10-99) carry somewhere, so greedy accuracy starts near
25%, while a group of 8 samples at temperature 1 holds a correct answer for ~95% of problems.
``--p-correct`` is the knob: at 0.4 the per-problem estimate sits so close to 0.5 that greedy
accuracy starts near 50% (measured), too close to the default job's "starts at <= 50%" bound.

What it writes to ``--out`` (Hugging Face format, loads offline with ``AutoTokenizer`` /
``AutoModelForCausalLM``): config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, chat_template.jinja, and recipe.json (these arguments and the measured
accuracies). The tokenizer is one token per character over printable ASCII (plus <pad> <s> </s>
<unk>), so any English prompt tokenises; it prepends <s>, and its chat template just concatenates
message contents, so a chat-format prompt ``[{"role": "user", "content": "37+45="}]`` reads
exactly like the plain one. A fifth of the training sequences omit <s>, so prompts tokenised with
``add_special_tokens=False`` (TRL's habit) are answered the same way.

Training only uses problems from the task's training split (rlvr.tasks.is_held_out), so the
held-out accuracy the trainer reports is on problems the model never saw. The loss sits on a
plateau (~1.0) for ~1,500 steps before the model "groks" the digit alignment; then it falls to
~0.16 (the floor set by the deliberate 30/70 answer mix is ~0.13 per answer token).

Deterministic: same seed, torch version and ``--threads`` give the same weights. Takes about 5
minutes on one free CPU core (15 on a busy shared one)::

    PYTHONPATH=. python scripts/make_tiny_model.py             # rebuild rlvr/models/tiny-arith
    PYTHONPATH=. python scripts/make_tiny_model.py --steps 200 --out /tmp/m   # a quick smoke build
"""

from __future__ import annotations

import argparse
import json
import math
import random
import string
import time
from pathlib import Path

import torch

from rlvr.tasks.arithmetic import ArithmeticTask, format_prompt, operand_range
from rlvr.tasks.base import is_held_out

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
# Printable ASCII except vertical tab and form feed: digits, letters, punctuation, space, \t \n \r.
CHARACTERS = [c for c in string.printable if c not in "\x0b\x0c"]
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "rlvr" / "models" / "tiny-arith"


# --------------------------------------------------------------------------------------------
# Tokenizer


def build_tokenizer(max_length: int):
    """A character-level fast tokenizer built with the ``tokenizers`` library.

    A BPE model with no merges maps every character to its own id (unknown ones to <unk>); the
    Fuse decoder joins tokens back without the spaces a word-level decoder would insert, so
    ``decode(encode(s)) == s`` for printable ASCII.
    """
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    core.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=max_length,
        chat_template=CHAT_TEMPLATE,
    )


CHAR_TO_ID = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(CHARACTERS)}


def encode(text: str) -> list[int]:
    """Same ids as the tokenizer without special tokens (checked against it in ``main``)."""
    return [CHAR_TO_ID.get(c, UNK_ID) for c in text]


# --------------------------------------------------------------------------------------------
# Synthetic supervised data


def has_carry(a: int, b: int) -> bool:
    """Whether any column of ``a + b`` carries, including out of the leftmost column."""
    return sum_without_carrying(a, b) != a + b


def sum_without_carrying(a: int, b: int) -> int:
    """What a pupil who never carries writes: each column summed on its own and kept mod 10,
    carries dropped everywhere, into the hundreds too. ``37+45`` -> ``72``; ``73+52`` -> ``25``."""
    n_columns = max(len(str(a)), len(str(b)))
    return sum(((a // 10**i) % 10 + (b // 10**i) % 10) % 10 * 10**i for i in range(n_columns))


def sft_answer(a: int, b: int, p_correct: float, rng: random.Random) -> int:
    """The answer the supervised data shows for ``a+b``: right when nothing carries, otherwise
    right with probability ``p_correct`` and carry-less the rest of the time."""
    if has_carry(a, b) and rng.random() >= p_correct:
        return sum_without_carrying(a, b)
    return a + b


def sft_batch(
    rng: random.Random, batch_size: int, digits: int, p_correct: float, p_no_bos: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids_BL`` (right-padded) and ``labels_BL`` (-100 except on the answer and EOS).

    A share ``p_no_bos`` of sequences omits <s>, so the model also answers prompts tokenised with
    ``add_special_tokens=False``.
    """
    lo, hi = operand_range(digits)
    seqs, n_prompt = [], []
    while len(seqs) < batch_size:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        prompt = format_prompt(a, "+", b)
        if is_held_out(prompt):
            continue
        prefix = ([] if rng.random() < p_no_bos else [BOS_ID]) + encode(prompt)
        seqs.append(prefix + encode(str(sft_answer(a, b, p_correct, rng))) + [EOS_ID])
        n_prompt.append(len(prefix))
    length = max(map(len, seqs))
    input_ids_BL = torch.full((batch_size, length), PAD_ID, dtype=torch.long)
    labels_BL = torch.full((batch_size, length), -100, dtype=torch.long)
    for i, (seq, p) in enumerate(zip(seqs, n_prompt)):
        input_ids_BL[i, : len(seq)] = torch.tensor(seq)
        labels_BL[i, p : len(seq)] = torch.tensor(seq[p:])
    return input_ids_BL, labels_BL


# --------------------------------------------------------------------------------------------
# Measuring the result


@torch.no_grad()
def answer_samples(model, prompts: list[str], n: int, temperature: float, max_new: int = 6) -> list[list[str]]:
    """``n`` answers per prompt (greedy when ``temperature == 0``), decoded until EOS.

    A full forward per new token without a KV cache: with ~12-token sequences recomputing is as
    cheap as caching and needs no cache bookkeeping.
    """
    prompts_ids = [[BOS_ID] + encode(p) for p in prompts]
    assert len({len(p) for p in prompts_ids}) == 1, "prompts of one length (fixed-digit problems)"
    ids_NL = torch.tensor(prompts_ids).repeat_interleave(n, dim=0)
    done_N = torch.zeros(len(ids_NL), dtype=torch.bool)
    for _ in range(max_new):
        logits_NV = model(input_ids=ids_NL).logits[:, -1, :].float()
        if temperature == 0:
            next_N = logits_NV.argmax(-1)
        else:
            next_N = torch.multinomial(torch.softmax(logits_NV / temperature, -1), 1).squeeze(1)
        next_N = torch.where(done_N, torch.full_like(next_N, PAD_ID), next_N)
        ids_NL = torch.cat([ids_NL, next_N[:, None]], dim=1)
        done_N |= next_N == EOS_ID
        if done_N.all():
            break
    start = len(prompts_ids[0])
    id_to_char = {i: c for c, i in CHAR_TO_ID.items()}
    texts = []
    for row in ids_NL[:, start:].tolist():
        text = ""
        for t in row:
            if t in (EOS_ID, PAD_ID):
                break
            text += id_to_char.get(t, "?")
        texts.append(text)
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def measure(model, n_problems: int = 400, n_samples: int = 8) -> dict[str, float]:
    """Held-out greedy accuracy (all, with carry, without) and the sampled (T=1) accuracy."""
    rows = ArithmeticTask().eval_rows(n_problems, seed=1)
    greedy = [s[0] for s in answer_samples(model, [r["prompt"] for r in rows], 1, 0.0)]
    sampled = answer_samples(model, [r["prompt"] for r in rows], n_samples, 1.0)
    carry = [has_carry(r["a"], r["b"]) for r in rows]
    ok = [g == r["answer"] for g, r in zip(greedy, rows)]
    ok_sampled = [sum(s == r["answer"] for s in group) / n_samples for group, r in zip(sampled, rows)]
    any_ok = [any(s == r["answer"] for s in group) for group, r in zip(sampled, rows)]

    def mean(xs: list[float]) -> float:
        return sum(xs) / max(len(xs), 1)

    return {
        "greedy_acc": mean(ok),
        "greedy_acc_carry": mean([o for o, c in zip(ok, carry) if c]),
        "greedy_acc_no_carry": mean([o for o, c in zip(ok, carry) if not c]),
        "sample_acc_t1": mean(ok_sampled),
        "sample_acc_t1_carry": mean([o for o, c in zip(ok_sampled, carry) if c]),
        f"pass_at_{n_samples}_t1": mean(any_ok),
        "carry_share": mean(carry),
    }


# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="1 is fastest on a shared machine")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--p-correct", type=float, default=0.3, help="share of carry problems shown with the right answer"
    )
    parser.add_argument("--p-no-bos", type=float, default=0.2)
    parser.add_argument("--hidden-size", type=int, default=96)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=256)
    args = parser.parse_args()

    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    digits = ArithmeticTask().digits

    tokenizer = build_tokenizer(max_length=512)
    probe = "367+458=825 Hello, world!\n"
    assert tokenizer(probe, add_special_tokens=False).input_ids == encode(probe), "encode() drifted from the tokenizer"

    config = LlamaConfig(
        vocab_size=len(SPECIAL_TOKENS) + len(CHARACTERS),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters; {args.steps} steps of {args.batch_size}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, args.steps // 20)

    def lr_factor(step: int) -> float:  # linear warm-up, cosine decay to 5%
        if step < warmup:
            return (step + 1) / warmup
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        input_ids_BL, labels_BL = sft_batch(rng, args.batch_size, digits, args.p_correct, args.p_no_bos)
        loss = model(input_ids=input_ids_BL, attention_mask=(input_ids_BL != PAD_ID).long(), labels=labels_BL).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            progress = ""
            if step and step % (4 * args.log_every) == 0:
                model.eval()
                progress = json.dumps({k: round(v, 2) for k, v in measure(model, n_problems=100).items()})
                model.train()
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f}s {progress}", flush=True)

    model.eval()
    metrics = measure(model)
    print(json.dumps({k: round(v, 3) for k, v in metrics.items()}))

    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, max_new_tokens=8, do_sample=False
    )
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    # transformers 5 writes its own class name; the generic one also loads in transformers 4.x.
    tokenizer_config = json.loads((args.out / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (args.out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    recipe = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    (args.out / "recipe.json").write_text(
        json.dumps({"script": "scripts/make_tiny_model.py", "args": recipe, "measured": metrics}, indent=2) + "\n"
    )
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
