"""llama.cpp serving SmolLM2-135M-Instruct as rlvr's stale ``openai`` sampler: how exact are its token
ids and how far are its log-probs from the trainer's. Prints JSON.

The server (``python -m llama_cpp.server``, llama-cpp-python) serves the very GGUF file that
``rlvr models get smollm2`` fetched (Q4_1 blocks, a Q8_0 embedding that is also the output head);
the trainer runs the Hugging Face folder converted from that file (every tensor dequantized to
float32). The weights are therefore the same numbers; what differs is measured here, one server at a
time on the same sampled completions' prompts:

- ``q4_1``: the file as shipped, float32 KV cache: llama.cpp's quantized matmuls (each activation
  row is quantized to 8 bits, Q8_1 / Q8_0, for the integer dot products);
- ``q4_1_kv_f16``: the same with llama.cpp's default float16 KV cache;
- ``f32_export``: the converted folder written back as a float32 GGUF (rlvr.rollout.gguf_export):
  float32 matmuls on both sides, the floor set by summation order alone.

For each: sampled completions at temperature 1 with no filters (llama-cpp-python's log-probs are
``log_softmax`` of the raw logits, so that is where they are comparable), |server - trainer| per
token, and greedy agreement. Then, on ``q4_1``, what llama-cpp-python reports at the config's
temperature 0.7 against the trainer's at 1 and at 0.7 (its log-probs ignore the temperature; the
engine therefore reports none there). And
the tokenizer: every id's piece as the server renders it, mapped back to an id the way the engine does.

    rlvr models get smollm2                      # once
    python benchmarks/llamacpp_smollm2.py [--prompts 4 --samples 2 --max-tokens 32]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "llamacpp")]

import torch  # noqa: E402
from llamacpp_server import free_port, start, stop  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlvr.core import token_logprobs  # noqa: E402
from rlvr.models.gguf import fetch_gguf, get_model  # noqa: E402
from rlvr.rollout import SamplingParams, make_engine  # noqa: E402
from rlvr.rollout.openai import _piece_ids, choice_ids  # noqa: E402
from rlvr.tasks.prompts import encode_prompts  # noqa: E402

QUESTIONS = [f"What is {a} {op} {b}? Put the final answer in \\boxed{{}}." for a, op, b in
             [(6, "*", 5), (7, "+", 8), (3, "-", 9), (4, "*", 4), (2, "+", 9), (8, "-", 1), (9, "*", 3), (5, "+", 5)]]


def trainer_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1 : -1]
    return token_logprobs(logits, ids[:, len(prompt) :], temperature=temperature)[0]


def stats(d: torch.Tensor) -> dict:
    d = d.abs().double()
    return {"tokens": d.numel(), "max": d.max().item(), "mean": d.mean().item(),
            "p99": d.quantile(0.99).item(), "median": d.median().item()}


def measure(engine, model, prompts, args) -> dict:
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=7)
    t0 = time.monotonic()
    out = engine.generate(prompts, args.samples, sampling)
    gen_s = time.monotonic() - t0
    with_lp = [c for c in out if c.logprobs is not None and c.token_ids]
    diffs = []
    for c in with_lp:  # a restored EOS has no reported log-prob (NaN): compare the tokens the server scored
        d = torch.tensor(c.logprobs) - trainer_logprobs(model, prompts[c.prompt_index], c.token_ids)
        diffs.append(d[~d.isnan()])
    seq = torch.stack([d.sum() for d in diffs])  # the sequence-level log-ratio GSPO-style corrections see
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    served = engine.generate(prompts, 1, greedy)
    ref = make_engine("hf", model, engine.tokenizer).generate(prompts, 1, greedy)
    agree = []
    for s, r in zip(served, ref, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(s.token_ids, r.token_ids, strict=False)) if a != b),
                 min(len(s.token_ids), len(r.token_ids)))
        agree.append({"equal": s.token_ids == r.token_ids, "common_prefix": n, "served_len": len(s.token_ids)})
    return {"completions": len(out), "with_logprobs": len(with_lp), "generate_s": round(gen_s, 1),
            "ended_with_restored_eos": sum(c.finish_reason == "stop" for c in out),
            "abs_logp_diff": stats(torch.cat(diffs)), "abs_seq_logratio": stats(seq), "greedy": agree}


def raw_logprobs_at(engine, model, prompts, temperature: float, args) -> dict:
    """llama-cpp-python's own log-probs for tokens sampled at ``temperature`` (the engine drops them, as
    they are log_softmax of the raw logits), against the trainer's at temperature 1 and at ``temperature``."""
    sampling = SamplingParams(temperature=temperature, max_tokens=args.max_tokens, seed=7)
    at_1, at_t = [], []
    for i, prompt in enumerate(prompts):
        for choice in engine.request_dialect.choices(engine.client, engine.model_name, engine.tokenizer, prompt,
                                                     args.samples, dataclasses.replace(sampling, seed=7 + 100 * i)):
            ids, lp = choice_ids(choice, engine.tokenizer)
            if lp is None or not ids:
                continue
            at_1.append(torch.tensor(lp) - trainer_logprobs(model, prompt, ids))
            at_t.append(torch.tensor(lp) - trainer_logprobs(model, prompt, ids, temperature))
    return {"vs_trainer_at_T1": stats(torch.cat(at_1)), f"vs_trainer_at_T{temperature}": stats(torch.cat(at_t))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--servers", default="q4_1,q4_1_kv_f16,f32_export")
    args = ap.parse_args()
    torch.set_num_threads(1)
    folder, gguf = get_model("smollm2", quiet=True), fetch_gguf("smollm2", quiet=True)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    prompts = encode_prompts(tok, [[{"role": "user", "content": q}] for q in QUESTIONS[: args.prompts]])
    result: dict = {"gguf": str(gguf), "load_average": os.getloadavg(), "prompts": args.prompts,
                    "samples": args.samples, "max_tokens": args.max_tokens}

    import llama_cpp

    vocab = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
    pieces = [vocab.detokenize([i]).decode("utf-8", errors="ignore") for i in range(vocab.n_vocab())]
    # The engine's recovery (each piece re-tokenized to one id), on every piece the server can render.
    counts: dict[str, int] = {}
    for p in pieces:
        counts[p] = counts.get(p, 0) + 1
    unique = [i for i, p in enumerate(pieces) if counts[p] == 1]
    ids = _piece_ids({"text": "".join(pieces[i] for i in unique),
                      "logprobs": {"tokens": [pieces[i] for i in unique]}}, len(unique), tok)
    result["pieces"] = {"vocab": len(pieces), "unique": len(unique), "recovered_exactly": ids == unique,
                        "shared": {repr(p): n for p, n in counts.items() if n > 1}}

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.servers.split(","):
            served = gguf
            if name == "f32_export":
                from rlvr.rollout.gguf_export import export_llama_gguf

                served = export_llama_gguf(folder, Path(tmp) / "smollm2-f32.gguf")
            port = free_port()
            pid = start(served, port, Path(tmp) / f"{name}.log", alias="smollm2", n_ctx=1024,
                        kv_f32=name != "q4_1_kv_f16")
            try:
                engine = make_engine("openai", model, tok, base_url=f"http://127.0.0.1:{port}/v1",
                                     dialect="llama-cpp-python")
                result[name] = measure(engine, model, prompts, args)
                if name == "q4_1":
                    result["q4_1_raw_logprobs_sampled_at_T0.7"] = raw_logprobs_at(engine, model, prompts, 0.7, args)
            finally:
                stop(pid)
            print(json.dumps({name: result.get(name)}), file=sys.stderr)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
