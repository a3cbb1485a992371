"""Peak memory of one full GRPO step (rollout, scoring, log-probs, update, optimizer step), rlvr and TRL 1.16's
GRPOTrainer side by side, and the plan's estimate (`rlvr plan`) against rlvr's measured peak.

Workload: Qwen3-1.7B's published architecture typed as a config (28 layers, hidden 2048, intermediate 6144,
16 heads / 8 KV heads of 128, vocabulary 151,936, tied embeddings), random weights, bfloat16; 4 prompts x G = 8,
prompts of 128 tokens, completions of 256. `--scale small` keeps the vocabulary (the logits are the point)
and shrinks the body to 4 layers of hidden 512 for development.

Each configuration runs in its own subprocess; a watchdog samples the RSS of its process tree every 0.1 s
and kills it above `--cap-gib` (its result is then "did not fit in X GiB"). The peak reported is the child's
own lifetime peak RSS (getrusage, model loading included) on CPU, or torch.cuda.max_memory_allocated on CUDA.

    python benchmarks/memory.py --scale small [--configs rlvr-lora-0,trl-lora-0] [--cap-gib 14]

Configurations: {rlvr,trl}-{lora,full}-{0,0.04} (framework, LoRA r = 16 on all linear layers or full
fine-tuning, beta). Both frameworks get the same generation batch (32 completions, one optimizer step),
the same micro-batches (`--micro-batch`, default 8, gradient accumulation to 32) and gradient checkpointing
(on unless `--no-checkpointing`), i.e. the knobs `rlvr plan` proposes for a 16 GB machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1024**3
ROOT = Path(__file__).resolve().parent.parent
ARCH = {
    "full": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
    ),
    "small": dict(
        vocab_size=151936,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
    "tiny": dict(  # a check that the script runs (seconds), not a figure
        vocab_size=8192,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
}
PROMPTS, G, PROMPT_TOKENS, COMPLETION_TOKENS = 4, 8, 128, 256


def length_reward(prompts, completions, completion_ids=None, **_):
    """Spread for a random model: a reward that depends on the completion's ids."""
    return [float(sum(ids) % 7) / 7.0 for ids in completion_ids]


# ------------------------------------------------------------------------------------ workload files


def build_workload(scale: str, folder: Path) -> None:
    """Model folder (random bf16 weights, a word-level tokenizer over the whole vocabulary) and prompts."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    arch = ARCH[scale]
    cfg = Qwen3Config(
        **arch,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        rope_theta=1_000_000,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # build in bf16: an fp32 1.7B model would be 6.9 GB first
    model = Qwen3ForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder / "model")
    del model
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, arch["vocab_size"])}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tok.save_pretrained(folder / "model")
    with open(folder / "prompts.jsonl", "w") as f:
        for p in range(2 * PROMPTS):
            words = " ".join(f"w{3 + (p * 131 + i * 17) % 5000}" for i in range(PROMPT_TOKENS))
            f.write(json.dumps({"prompt": words}) + "\n")


# ------------------------------------------------------------------------------------ children


def rlvr_overrides(
    folder: Path, lora: bool, beta: float, mb: int, ckpt: bool, out: Path, ranks: int = 1, parallelism: str = "ddp"
) -> list[str]:
    ga = PROMPTS * G // (mb * ranks)  # the same generation batch over all ranks: each samples 1/ranks of it
    return [
        f"model.path={folder / 'model'}",
        "model.dtype=bfloat16",
        f"model.lora.enabled={str(lora).lower()}",
        f"model.gradient_checkpointing={str(ckpt).lower()}",
        f"data.path={folder / 'prompts.jsonl'}",
        "rewards=[{name: 'memory:length_reward'}]",
        f"algo.beta={beta}",
        "rollout.num_generations=8",
        f"rollout.max_completion_length={COMPLETION_TOKENS}",
        f"rollout.max_prompt_length={PROMPT_TOKENS}",
        f"train.per_device_train_batch_size={mb}",
        f"train.gradient_accumulation_steps={ga}",
        f"train.parallelism={parallelism}",
        "train.max_steps=1",
        "train.learning_rate=1e-6",
        "train.memory_check=skip",
        f"log.output_dir={out}",
        "log.eval_before_after=false",
        "log.report_to=[]",
        "log.progress=false",
        "log.record_rollouts=false",
        "data.eval_size=0",
        "log.logging_steps=1",
    ]


def run_rlvr(
    folder: Path, lora: bool, beta: float, mb: int, ckpt: bool, ranks: int = 1, parallelism: str = "ddp"
) -> dict:
    from rlvr.config import load_config
    from rlvr.memory import estimate, format_plan, model_shape
    from rlvr.train import train

    out = Path(os.environ.get("RLVR_MEM_OUT") or tempfile.mkdtemp(prefix="rlvr-mem-"))  # one folder for all ranks
    extra = json.loads(os.environ.get("RLVR_MEM_SET", "[]"))  # --set: the knobs a configuration needs to fit
    cfg = load_config(None, rlvr_overrides(folder, lora, beta, mb, ckpt, out, ranks, parallelism) + extra)
    plan = estimate(cfg, model_shape(cfg.model.path), "cpu", PROMPT_TOKENS)
    t0 = time.perf_counter()
    train(cfg)
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 writes the metrics; the others report their pid
        return {"pid": os.getpid(), "wall_s": round(time.perf_counter() - t0, 1)}
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    return {
        "pid": os.getpid(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "phase_peaks_gib": {k.split("/", 1)[1]: round(v, 2) for k, v in line.items() if k.startswith("memory/")},
        "plan_peak_gib": round(plan.peak / GIB, 2),
        "plan": format_plan(plan).splitlines(),
    }


def run_trl(folder: Path, lora: bool, beta: float, mb: int, ckpt: bool) -> dict:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    out = tempfile.mkdtemp(prefix="trl-mem-")
    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=PROMPTS * G // mb,
        num_generations=G,
        max_completion_length=COMPLETION_TOKENS,
        beta=beta,
        bf16=True,
        use_cpu=True,
        max_steps=1,
        learning_rate=1e-6,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=ckpt,
        loss_type="dapo",
        temperature=1.0,
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(str(folder / "model"), dtype=torch.bfloat16)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    tok = AutoTokenizer.from_pretrained(str(folder / "model"))
    ds = load_dataset("json", data_files=str(folder / "prompts.jsonl"), split="train")
    t0 = time.perf_counter()
    GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        peft_config=peft_config,
    ).train()
    return {"wall_s": round(time.perf_counter() - t0, 1)}


def child(spec: dict) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # 'memory:length_reward' for rlvr's loader
    sys.path.insert(0, str(ROOT))  # this checkout's rlvr, not an installed one
    import torch

    torch.set_num_threads(spec["threads"])
    args = (Path(spec["folder"]), spec["lora"], spec["beta"], spec["micro_batch"], spec["checkpointing"])
    if spec["framework"] == "rlvr":
        res = run_rlvr(*args, spec.get("ranks", 1), spec.get("parallelism", "ddp"))
    else:
        res = run_trl(*args)
    # rlvr's per-phase meter resets the kernel's peak-RSS counter at each phase start, so getrusage alone
    # would only see the last phase: the peak is the larger of it and the largest phase peak.
    res["peak_gib"] = round(
        max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
            res.get("phase_peaks_gib", {}).get("peak", 0.0),
        ),
        2,
    )
    if torch.cuda.is_available():
        res["cuda_peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
    rank = int(os.environ.get("RANK", "0"))
    Path(spec["result"] + ("" if rank == 0 else f".rank{rank}")).write_text(json.dumps(res))
    if spec.get("ranks", 1) > 1:  # as `rlvr train` does: a rank that finished skips the interpreter's teardown
        from rlvr.distributed import leave

        leave(0)


# ------------------------------------------------------------------------------------ watchdog


def tree_rss(proc, per_pid: dict[int, int]) -> int:
    """RSS of proc and all its descendants; per_pid keeps each process's largest sample."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            rss = p.memory_info().rss
        except Exception:  # a child that just exited
            continue
        total += rss
        per_pid[p.pid] = max(per_pid.get(p.pid, 0), rss)
    return total


def supervise(
    cmd: list[str], cap: int, timeout: float, env: dict | None = None, per_pid: dict[int, int] | None = None
) -> tuple[str, int, float]:
    """Run cmd; kill it when its tree's RSS exceeds cap or it runs past timeout. -> (status, max RSS, seconds).
    per_pid, when given, receives each process's peak sampled RSS (the ranks of a torchrun)."""
    import psutil

    t0 = time.perf_counter()
    popen = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    proc, peak, status = psutil.Process(popen.pid), 0, "ok"
    per_pid = {} if per_pid is None else per_pid
    log = tempfile.NamedTemporaryFile("w+", delete=False, suffix=".log")
    import threading

    pump = threading.Thread(target=lambda: [log.write(line) for line in popen.stdout], daemon=True)
    pump.start()
    while popen.poll() is None:
        peak = max(peak, tree_rss(proc, per_pid))
        if peak > cap:
            status = "killed above cap"
        elif time.perf_counter() - t0 > timeout:
            status = "timeout"
        if status != "ok":
            for p in [*proc.children(recursive=True), proc]:
                try:
                    p.kill()
                except Exception:
                    pass
            break
        time.sleep(0.1)
    popen.wait()
    pump.join(timeout=5)
    log.flush()
    if status == "ok" and popen.returncode != 0:
        status = f"failed (exit {popen.returncode}): " + Path(log.name).read_text()[-1500:]
    return status, peak, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=sorted(ARCH), default="small")
    ap.add_argument(
        "--configs",
        default="rlvr-lora-0,rlvr-lora-0.04,rlvr-full-0,rlvr-full-0.04,"
        "trl-lora-0,trl-lora-0.04,trl-full-0,trl-full-0.04",
    )
    ap.add_argument("--cap-gib", type=float, default=16.0)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration")
    ap.add_argument("--workdir", default=None, help="where the model folder is built (kept for reuse)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="rlvr only: an extra config override for every rlvr configuration (e.g. train.optim=adamw_torch_8bit)",
    )
    ap.add_argument("--ranks", type=int, default=1, help="rlvr only: processes (torchrun, gloo on CPU)")
    ap.add_argument("--parallelism", choices=["ddp", "fsdp"], default="ddp", help="with --ranks > 1")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    folder = Path(a.workdir or Path(tempfile.gettempdir()) / f"rlvr-memory-bench-{a.scale}")
    if not (folder / "prompts.jsonl").exists():
        folder.mkdir(parents=True, exist_ok=True)
        status, rss, _ = supervise(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                f"sys.path.insert(0, {str(Path(__file__).parent)!r}); import memory; "
                f"memory.build_workload({a.scale!r}, __import__('pathlib').Path({str(folder)!r}))",
            ],
            int(a.cap_gib * GIB),
            a.timeout,
        )
        if status != "ok":
            raise SystemExit(f"building the workload: {status}")
    results = []
    for name in a.configs.split(","):
        framework, mode, beta = name.split("-", 2)
        if a.ranks > 1 and framework != "rlvr":
            raise SystemExit(f"--ranks {a.ranks} measures rlvr's parallelism; {name} is not an rlvr configuration")
        result_file = Path(tempfile.mkstemp(suffix=".json")[1])
        spec = {
            "framework": framework,
            "lora": mode == "lora",
            "beta": float(beta),
            "folder": str(folder),
            "micro_batch": a.micro_batch,
            "checkpointing": not a.no_checkpointing,
            "threads": max(1, a.threads // a.ranks),
            "result": str(result_file),
            "ranks": a.ranks,
            "parallelism": a.parallelism,
        }
        cmd, env, per_pid = [sys.executable, __file__, "--child", json.dumps(spec)], None, {}
        if a.set and framework == "rlvr":
            env = {**os.environ, "RLVR_MEM_SET": json.dumps(a.set)}
            name = f"{name}[{' '.join(a.set)}]"
        if a.ranks > 1:  # one process per rank; rank 0's metrics line is the mean over ranks, so each rank's
            # own peak comes from the watchdog's samples of its process
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.ranks}"]
            cmd += [__file__, "--child", json.dumps(spec)]
            env = {**(env or os.environ), "OMP_NUM_THREADS": str(spec["threads"]), "CUDA_VISIBLE_DEVICES": ""}
            env["RLVR_MEM_OUT"] = tempfile.mkdtemp(prefix="rlvr-mem-")
            name = f"{name}-{a.parallelism}-{a.ranks}ranks"
        status, rss, wall = supervise(cmd, int(a.cap_gib * GIB), a.timeout, env, per_pid)
        row = {
            "config": name,
            "key": f"{mode}-{beta}",
            "framework": framework,
            "status": status,
            "sampled_peak_rss_gib": round(rss / GIB, 2),
            "wall_s": round(wall, 1),
        }
        if status == "ok":
            row.update(json.loads(result_file.read_text()))
            row["peak_gib"] = max(row["peak_gib"], row["sampled_peak_rss_gib"])  # model loading is not a phase
            if a.ranks > 1:
                pids = [row["pid"]] + [
                    json.loads(Path(f"{result_file}.rank{r}").read_text())["pid"] for r in range(1, a.ranks)
                ]
                row["per_rank_peak_gib"] = [round(per_pid.get(pid, 0) / GIB, 2) for pid in pids]
                row["peak_gib"] = max(row["per_rank_peak_gib"])  # of one rank; sampled_peak_rss_gib: all together
                row["phase_peaks_note"] = "phase_peaks_gib: mean over ranks"
                for r in range(1, a.ranks):
                    Path(f"{result_file}.rank{r}").unlink(missing_ok=True)
            if "plan_peak_gib" in row and not (a.ranks > 1 and a.parallelism == "fsdp"):  # the plan is per process
                row["plan_over_measured"] = round(row["plan_peak_gib"] / row["peak_gib"], 3)
        elif status == "killed above cap":
            row["result"] = f"did not fit in {a.cap_gib:g} GiB"
        result_file.unlink(missing_ok=True)
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    trl = {r["key"]: r for r in results if r["framework"] == "trl"}
    for r in results:
        other = trl.get(r["key"])
        if r["framework"] == "rlvr" and other and "peak_gib" in r and "peak_gib" in other:
            r["rlvr_over_trl"] = round(r["peak_gib"] / other["peak_gib"], 3)
    print(
        json.dumps(
            {
                "scale": a.scale,
                "arch": ARCH[a.scale],
                "prompts": PROMPTS,
                "G": G,
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "micro_batch": a.micro_batch,
                "ranks": a.ranks,
                "parallelism": a.parallelism if a.ranks > 1 else None,
                "checkpointing": not a.no_checkpointing,
                "cap_gib": a.cap_gib,
                "machine": {"cpus": os.cpu_count(), "note": "shared with other jobs"},
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
