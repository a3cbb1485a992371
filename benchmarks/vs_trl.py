"""The whole GRPO step, rlvr against TRL 1.16's ``GRPOTrainer`` on identical workloads (CPU).

    python benchmarks/vs_trl.py                                   # tiny + 27M, fp32 and bf16, 3 repeats
    python benchmarks/vs_trl.py --workloads tiny --repeats 1      # a quick look (~2 minutes)
    python benchmarks/vs_trl.py --workloads smollm2 --repeats 1 --no-bf16
    python benchmarks/vs_trl.py --rlvr-bf16 "model.dtype=bfloat16"   # another rlvr side for the bf16 column

JSON on stdout (``> out.json``), a readable table on stderr.

**Identical workloads.** Each workload is written once into a folder (``--workdir``): a model folder
that both frameworks load with ``from_pretrained`` (the shipped tiny model's own folder, a random 27M
Llama saved there, or the cached SmolLM2 folder) and a ``prompts.jsonl`` that both read (rlvr as
``data.path``, TRL through ``datasets``). The settings the two share are written once, in TRL's names
(``shared_settings``): TRL gets them as ``GRPOConfig`` fields, rlvr as bare ``key=value`` overrides,
which rlvr routes to its own options (``rlvr.config``: a TRL name means the same number). So both run
the same G, completions per step, micro-batch and gradient accumulation, ``max_completion_length``,
temperature, loss (``dapo``), ``beta`` 0, learning rate and schedule, clip range, reward scaling and
seed. The reward functions are the same Python objects: rlvr's loader builds them from the run's
``rewards`` and the TRL child hands that list to ``GRPOTrainer``. Both run on the CPU in float32 on
``--threads`` threads (``torch.set_num_threads`` and ``OMP_NUM_THREADS``), TRL with transformers'
``generate`` (no vLLM), no evaluation, no checkpoints (``save_strategy="no"``), one log line per run.
rlvr keeps its per-step diagnostics and rollout record (what a user gets), logs every step (its
``timing/*`` come from there), and saves once at the end of the run (cancelled out, below).

Workloads (``WORKLOADS``):

- ``tiny``: the shipped ``rlvr/models/tiny-arith`` on its own task, the default job's shape
  (``rlvr/configs/default.yaml``: 32 prompts x G 8 = 256 completions per step, one micro-batch of 256,
  at most 8 completion tokens, temperature 1, real EOS: the completions stop where the model stops);
- ``27m``: a random Llama (hidden 512, 8 layers, 8 heads, MLP 1536: 27.3M matmul parameters; character
  vocabulary), 4 prompts of 64 tokens x G 8 = 32 completions per step, micro-batches of 16 x 2, exactly
  64 completion tokens: the tokenizer's EOS is a token the model cannot emit (an id past its vocabulary),
  so every completion runs to the limit in both frameworks;
- ``smollm2``: SmolLM2-135M-Instruct (the real weights, ``rlvr models get smollm2``; a missing cache is an
  error that says so), chat prompts of 70-95 tokens (word problems in its chat template, system message
  included), G 8, up to 128 completion tokens, temperature 0.7, real EOS; ``--smollm2-prompts`` prompts
  per step (default 2: 16 completions, micro-batches of 8 x 2), kept small so a repeat fits a 2-core
  machine in minutes.

**Timing.** Each (framework, dtype) runs in its own process, twice per repeat: for ``k1`` and for
``k2`` optimizer steps (``--steps K1,K2``; per-workload defaults in ``WORKLOADS``; ``--steps K``: one
run of K steps, no whole-run estimate). The runs are interleaved (TRL fp32, rlvr fp32, TRL bf16, rlvr
bf16, each at k1 then k2; the order flips every repeat) so machine noise hits both alike. Two
estimates of s/step come from the same runs:

- ``*_s_per_step`` (the headline): each child stamps the end of every optimizer step (rlvr: when the
  loop's ``log`` phase, its last, returns; TRL: ``on_step_end``, right after the optimizer step), and a
  step's time is the interval between consecutive stamps, so each step is counted whole (generation,
  scoring, update, optimizer, logging, data loading, whatever sits between phases) and nothing else.
  The first step of every run (warm-up: lazy initialisation, allocator growth) is left out; the
  figure is the median over all remaining steps of all runs. Start-up, model load, trainer
  construction and the final save are outside every interval. A median over many steps shrugs off
  the bursts of a shared machine.
- ``whole_run``: the child times its whole run in-process, from before the trainer is built (rlvr:
  ``load_config`` + ``train``; TRL: model load + ``GRPOTrainer(...)`` + ``.train()``) to its return,
  and ``s/step = (t(k2) - t(k1)) / (k2 - k1)``: loading, construction, the first step and the final
  save cancel. Median over repeats of the per-repeat difference (``best``: from each length's fastest
  run). It checks that no per-step work hides outside the stamped intervals, but one burst of load
  in one of two processes moves it, so it needs a quiet machine or many repeats.

``cpu_s_per_step``: the same intervals in CPU seconds of the child (user + system, all threads); on a
shared machine it moves less than wall time (spinning threads still count), and each raw run carries
the load average at its end.

With real EOS (``tiny``, ``smollm2``) the two frameworks sample different completions and may do
different amounts of work: each side's mean completion length is printed (``completion_tokens``).

**rlvr's phases** (``rlvr_phases_s``): the medians of ``timing/<phase>`` (docs/metrics.md) over the
``k2`` run's steps after the first, median again over repeats. ``other`` = s/step minus their sum (the
untimed parts of the loop: packing, the scheduler, the loop itself).

**Update phase's matmul-bound fraction**: (FLOPs a per-completion forward and backward must do) /
``timing/update`` / (FLOP/s of a 2048x2048 matmul measured here in the same dtype and thread count;
the larger of a measurement before and one after the runs). Counted: 2 x 3 (forward + backward =
3 forwards) x [matmul parameters of the decoder layers x (prompt + completion tokens of every
completion: the prompt counted once per completion, as G separate forwards do it) + LM-head parameters
x completion tokens]. Not counted: the embedding lookup, attention's score and value products, norms,
the optimizer. A path that computes a group's prompt once can therefore exceed what the hardware does
per counted FLOP; the fraction says how fast the update does the work of a plain one.

**bf16 column.** rlvr with bfloat16 compute against TRL with ``bf16=True`` (fp32 weights loaded,
transformers' autocast through accelerate), same shapes; plus rlvr-bf16 against TRL-fp32. rlvr's side
takes its overrides from ``RLVR_BF16_OVERRIDES`` (or ``--rlvr-bf16``): ``train.mixed_precision=bf16``,
float32 master weights and AdamW state with the policy's forward and backward under bf16 autocast, TRL's
own meaning of ``bf16=True`` (rlvr's CPU rollout then runs its C kernel on bfloat16 copies of the weights
where the CPU has AVX512-BF16); the JSON and the table carry the
overrides used, so a figure says what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()

# The rlvr side of the bf16 column: bf16 compute over float32 master weights, TRL's bf16=True (--rlvr-bf16
# replaces it, e.g. "model.dtype=bfloat16" for bf16 weights).
RLVR_BF16_OVERRIDES = ("train.mixed_precision=bf16",)


@dataclass(frozen=True)
class Workload:
    """One side-by-side shape. Counts are TRL's units: completions per micro-batch, micro-batches per step."""

    name: str
    prompts_per_step: int
    num_generations: int
    micro_batch: int  # per_device_train_batch_size (completions)
    grad_accum: int
    max_completion_length: int
    temperature: float
    learning_rate: float
    lr_scheduler_type: str
    exact_length: bool  # EOS disabled: every completion is max_completion_length tokens
    steps: tuple[int, int]  # default (k1, k2)
    description: str

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations


WORKLOADS = {
    "tiny": Workload("tiny", 32, 8, 256, 1, 8, 1.0, 3e-4, "linear", False, (3, 23),
                     "shipped tiny-arith on 2-digit addition, 256 completions, <= 8 tokens (the default job)"),
    "27m": Workload("27m", 4, 8, 16, 2, 64, 1.0, 1e-5, "linear", True, (2, 6),
                    "random 27M Llama, 64-token prompts, 32 completions, exactly 64 tokens"),
    "smollm2": Workload("smollm2", 2, 8, 8, 2, 128, 0.7, 2e-5, "constant", False, (1, 3),
                        "SmolLM2-135M-Instruct, chat prompts of 70-95 tokens, G 8, <= 128 tokens"),
}

# The 27M Llama: 8 x (4 x 512^2 + 3 x 512 x 1536) = 27.3M matmul parameters in its layers.
LLAMA_27M = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=8, max_position_embeddings=256)
PROMPT_TOKENS_27M = 64


def id_reward(prompts, completions, completion_ids=None, **_):
    """A reward with spread for a random model: it depends only on the completion's token ids."""
    return [float(sum(ids) % 7) / 7.0 for ids in completion_ids]


def scaled(w: Workload, prompts_per_step: int | None) -> Workload:
    """The workload with another number of prompts per step (micro-batches keep their size)."""
    if not prompts_per_step or prompts_per_step == w.prompts_per_step:
        return w
    n = prompts_per_step * w.num_generations
    mb = min(w.micro_batch, n)
    if n % mb:
        raise SystemExit(f"{prompts_per_step} prompts x G {w.num_generations} is not a multiple of micro-batch {mb}")
    d = asdict(w)
    d.update(prompts_per_step=prompts_per_step, micro_batch=mb, grad_accum=n // mb, steps=tuple(w.steps))
    return Workload(**d)


# ------------------------------------------------------------------------------------ workload files


def build_workload(w: Workload, folder: Path) -> dict:
    """Write (once) the model folder and prompts.jsonl; return {model_path, reward, source}."""
    folder.mkdir(parents=True, exist_ok=True)
    prompts = folder / "prompts.jsonl"
    if w.name == "tiny":
        from rlvr.models import tiny_model_path
        from rlvr.tasks import get_task

        model_path, reward, source = str(tiny_model_path()), "arithmetic", "shipped rlvr/models/tiny-arith"
        if not prompts.exists():
            rows = itertools.islice(get_task("arithmetic").train_rows(seed=0), 4000)
            _write_jsonl(prompts, ({"prompt": r["prompt"], "answer": r["answer"]} for r in rows))
    elif w.name == "27m":
        model_path, reward, source = str(folder / "model"), f"{HERE}:id_reward", "random LlamaConfig, 27M"
        if not (folder / "model" / "config.json").exists():
            _save_random_llama(folder / "model")
        if not prompts.exists():
            from rlvr.models.toy import CHARS

            rng = random.Random(0)
            _write_jsonl(prompts, ({"prompt": "".join(rng.choice(CHARS) for _ in range(PROMPT_TOKENS_27M))}
                                   for _ in range(400)))
    elif w.name == "smollm2":
        from rlvr.models.gguf import known_model_dir

        try:
            model_path = str(known_model_dir("smollm2"))
        except FileNotFoundError as e:
            raise SystemExit(f"workload smollm2: {e}") from None
        reward, source = "math", "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)"
        if not prompts.exists():
            _write_jsonl(prompts, _word_problems(400))
    else:
        raise SystemExit(f"unknown workload {w.name!r}; choose from {', '.join(WORKLOADS)}")
    return {"model_path": model_path, "reward": reward, "source": source, "prompts": str(prompts)}


def _write_jsonl(path: Path, rows) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tmp.rename(path)


def _save_random_llama(path: Path) -> None:
    """Character tokenizer + a random float32 Llama whose vocabulary stops one id short of the tokenizer's:
    the tokenizer's EOS (``<never>``, the last id) is a token the model cannot emit."""
    import torch

    from rlvr.models.toy import char_tokenizer, save_toy, toy_model

    tok = char_tokenizer()
    tok.add_special_tokens({"eos_token": "<never>"})
    never = tok.convert_tokens_to_ids("<never>")
    assert never == len(tok) - 1
    torch.manual_seed(0)
    model = toy_model("llama", never, seed=0, pad_token_id=0, eos_token_id=never, bos_token_id=None,
                      tie_word_embeddings=False, **LLAMA_27M)
    # transformers warns that this EOS lies outside the vocabulary: that is the point.
    model.generation_config.eos_token_id = never
    model.generation_config.pad_token_id = 0
    save_toy(path, model, tok)


def _word_problems(n: int):
    """Chat prompts of 70-95 tokens (SmolLM2's template, default system message included) with gold answers."""
    rng = random.Random(0)
    names = ["Maria", "Tom", "Aisha", "Kenji", "Lucia", "Omar", "Priya", "Jonas"]
    items = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps"]
    for _ in range(n):
        who, friend = rng.sample(names, 2)
        item = rng.choice(items)
        a, b, c, d = rng.randint(5, 40), rng.randint(2, 6), rng.randint(3, 12), rng.randint(1, 5)
        q = (f"{who} has {a} {item}. On Monday {who} buys {b} bags with {c} {item} in each bag. "
             f"On Tuesday {who} gives {d} {item} to {friend}, who keeps them in a box. "
             f"How many {item} does {who} have now? Explain your reasoning in a few short steps, "
             "then put the final answer in \\boxed{}.")
        yield {"prompt": [{"role": "user", "content": q}], "answer": str(a + b * c - d)}


# ------------------------------------------------------------------------------------ the two configs


def shared_settings(w: Workload, steps: int) -> dict:
    """Every setting both frameworks get, in TRL's names (rlvr reads the same names, same meaning)."""
    return {
        "num_generations": w.num_generations,
        "per_device_train_batch_size": w.micro_batch,
        "gradient_accumulation_steps": w.grad_accum,
        "max_completion_length": w.max_completion_length,
        "temperature": w.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "learning_rate": w.learning_rate,
        "lr_scheduler_type": w.lr_scheduler_type,
        "max_grad_norm": 1.0,
        "loss_type": "dapo",
        "beta": 0.0,
        "epsilon": 0.2,
        "scale_rewards": "group",
        "num_iterations": 1,
        "max_steps": steps,
        "seed": 42,
    }


def rlvr_overrides(w: Workload, files: dict, steps: int, threads: int, out: Path, extra=()) -> list[str]:
    shared = [f"{k}={json.dumps(v)}" for k, v in shared_settings(w, steps).items()]
    return shared + [
        f"model.path={files['model_path']}",
        f"data.path={files['prompts']}",
        "data.eval_fraction=0",  # train on every row, as TRL does
        "data.eval_size=0",
        f"rewards=[{{name: '{files['reward']}'}}]",
        "rollout.backend=native",
        f"train.num_threads={threads}",
        # The memory check stays on, as a user runs it: with it skipped, train.release_freed_memory=auto returns
        # freed blocks to the system (nothing says memory is ample), and re-faulting those pages every micro-batch
        # cost the 27m update 1.6x its time.
        f"log.output_dir={out}",
        "log.logging_steps=1",  # timing/* per step
        f"log.save_steps={10**6}",  # one save, at the end (in both k1 and k2 runs: cancels)
        "log.eval_before_after=false",
        "log.report_to=[]",
        "log.progress=false",
        "log.samples_per_class=0",
        *extra,
    ]


def trl_args(w: Workload, steps: int, out: str, bf16: bool) -> dict:
    """GRPOConfig fields: the shared settings plus TRL's own switches (CPU, no vLLM, quiet, nothing saved)."""
    return {
        **shared_settings(w, steps),
        "output_dir": out,
        "use_cpu": True,
        "use_vllm": False,
        "bf16": bf16,
        "logging_steps": steps,  # one log line, at the end: the run's mean completion length
        "report_to": "none",
        "disable_tqdm": True,
        "save_strategy": "no",
        "log_completions": False,
        "dataloader_num_workers": 0,
    }


# ------------------------------------------------------------------------------------ children


def run_child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    w = Workload(**{**spec["workload"], "steps": tuple(spec["workload"]["steps"])})
    files = spec["files"]
    out = Path(tempfile.mkdtemp(prefix=f"vs-trl-{spec['framework']}-"))
    try:
        if spec["framework"] == "rlvr":
            return _rlvr_child(w, files, spec, out)
        return _trl_child(w, files, spec, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _stamp() -> tuple[float, float]:
    """(wall, CPU seconds of this process: user + system, all threads)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), ru.ru_utime + ru.ru_stime


def _rlvr_child(w: Workload, files: dict, spec: dict, out: Path) -> dict:
    import rlvr.train
    from rlvr.config import load_config

    # A step ends when its log phase returns (the loop's last phase): stamp it there. Instrumentation only:
    # the loop calls the module's `log`, which this wraps.
    ends: list[tuple[float, float]] = []
    plain_log = rlvr.train.log

    def stamped_log(*a, **kw):
        plain_log(*a, **kw)
        ends.append(_stamp())

    rlvr.train.log = stamped_log
    t0 = _stamp()
    cfg = load_config(None, rlvr_overrides(w, files, spec["steps"], spec["threads"], out / "run", spec["extra"]))
    rlvr.train.train(cfg)
    t1 = _stamp()
    lines = [json.loads(ln) for ln in (out / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    steps = [m for m in lines if "timing/update" in m]
    keys = ("num_tokens", "completions/mean_length")
    return {"train_s": t1[0] - t0[0], "cpu_s": t1[1] - t0[1], "step_ends": ends,
            "steps": [{k: v for k, v in m.items() if k.startswith("timing/") or k in keys} for m in steps]}


def _trl_child(w: Workload, files: dict, spec: dict, out: Path) -> dict:
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.config import load_config
    from rlvr.rewards.scoring import load_reward_functions, reward_specs

    # The very reward objects rlvr builds for this run.
    cfg = load_config(None, rlvr_overrides(w, files, spec["steps"], spec["threads"], out / "unused"))
    reward_funcs = [rf.fn for rf in load_reward_functions(reward_specs(cfg))]
    ds = load_dataset("json", data_files=files["prompts"], split="train")
    kept: list[dict] = []
    ends: list[tuple[float, float]] = []

    class Keep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # after the optimizer step
            ends.append(_stamp())

        def on_log(self, args, state, control, logs=None, **kwargs):
            kept.append(dict(logs or {}))

    t0 = _stamp()
    model = AutoModelForCausalLM.from_pretrained(files["model_path"], dtype="float32")
    tok = AutoTokenizer.from_pretrained(files["model_path"])
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=GRPOConfig(**trl_args(
        w, spec["steps"], str(out), spec["bf16"])), train_dataset=ds, processing_class=tok, callbacks=[Keep()])
    trainer.train()
    t1 = _stamp()
    lengths = [m["completions/mean_length"] for m in kept if "completions/mean_length" in m]
    return {"train_s": t1[0] - t0[0], "cpu_s": t1[1] - t0[1], "step_ends": ends,
            "completions/mean_length": lengths[-1] if lengths else None}


def spawn(spec: dict, timeout: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "MKL_NUM_THREADS": str(spec["threads"]),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    spec = {**spec, "result": str(result)}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(HERE), "--child", json.dumps(spec)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{spec['label']} ({spec['steps']} steps): not done within --timeout {timeout:g} s") from None
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{spec['label']} ({spec['steps']} steps) failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(result.read_text())
    result.unlink()
    res["process_s"], res["load_average"] = wall, [round(x, 2) for x in os.getloadavg()]
    return res


# ------------------------------------------------------------------------------------ measuring


def matmul_flops(dtype_name: str, threads: int) -> float:
    import torch

    sys.path.insert(0, str(HERE.parent))
    from rollout import matmul_flops as measure

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return measure(getattr(torch, dtype_name), "cpu")
    finally:
        torch.set_num_threads(before)


def model_shape(files: dict, w: Workload) -> dict:
    """Matmul parameters (decoder-layer linears; LM head) and the mean prompt length in tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.tasks.prompts import encode_prompts

    model = AutoModelForCausalLM.from_pretrained(files["model_path"], dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(files["model_path"])
    head = model.get_output_embeddings().weight.numel()
    layers = sum(m.weight.numel() for m in model.modules()
                 if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings())
    rows = [json.loads(ln) for ln in Path(files["prompts"]).read_text().splitlines()[:200]]
    ids = encode_prompts(tok, [r["prompt"] for r in rows])
    return {"params": sum(p.numel() for p in model.parameters()), "layer_matmul_params": layers,
            "lm_head_params": head, "prompt_tokens_mean": statistics.mean(len(i) for i in ids),
            "prompt_tokens_range": [min(len(i) for i in ids), max(len(i) for i in ids)]}


def update_flops(shape: dict, completions: int, completion_tokens: float) -> float:
    """Forward + backward (3 forwards) of every completion with its own copy of the prompt."""
    tokens = completions * shape["prompt_tokens_mean"] + completion_tokens
    return 6 * (shape["layer_matmul_params"] * tokens + shape["lm_head_params"] * completion_tokens)


def bench_workload(w: Workload, args) -> dict:
    files = build_workload(w, Path(args.workdir) / w.name)
    shape = model_shape(files, w)
    k1, k2 = args.steps or w.steps
    configs = [("trl", "fp32"), ("rlvr", "fp32")]
    if not args.no_bf16:
        configs += [("trl", "bf16"), ("rlvr", "bf16")]
    runs: dict[tuple, list] = {c: [] for c in configs}
    for rep in range(args.repeats):
        for c in (configs if rep % 2 == 0 else configs[::-1]):
            pair = {}
            for k in (k1, k2) if k1 else (k2,):
                fw, dt = c
                spec = {"framework": fw, "bf16": dt == "bf16", "threads": args.threads, "steps": k,
                        "workload": asdict(w), "files": files, "label": f"{w.name} {fw}-{dt}",
                        "extra": list(args.rlvr_bf16.split()) if (fw, dt) == ("rlvr", "bf16") else []}
                pair[k] = spawn(spec, args.timeout)
                print(f"  {w.name} {fw}-{dt} repeat {rep + 1}: {k} steps in {pair[k]['train_s']:.2f} s "
                      f"(process {pair[k]['process_s']:.1f} s)", file=sys.stderr, flush=True)
            runs[c].append(pair)

    def intervals(c, i: int) -> list[float]:
        """Step-to-step intervals (wall i=0, CPU i=1) after each run's first step, pooled over its runs."""
        out = []
        for p in runs[c]:
            for k in p:
                ends = p[k]["step_ends"]
                out += [ends[j][i] - ends[j - 1][i] for j in range(1, len(ends))]
        return out

    def whole_run(c) -> dict:
        if not k1:
            return {}
        diffs = [(p[k2]["train_s"] - p[k1]["train_s"]) / (k2 - k1) for p in runs[c]]
        best = (min(p[k2]["train_s"] for p in runs[c]) - min(p[k1]["train_s"] for p in runs[c])) / (k2 - k1)
        return {"s_per_step": statistics.median(diffs), "all": diffs, "best": best}

    result = {
        "workload": w.name,
        "description": w.description,
        "source": files["source"],
        "shape": {**asdict(w), "completions_per_step": w.completions_per_step, **shape},
        "steps": [k1, k2],
        "repeats": args.repeats,
    }
    for dt in ("fp32", "bf16"):
        if ("rlvr", dt) not in runs:
            continue
        trl, rlvr = intervals(("trl", dt), 0), intervals(("rlvr", dt), 0)
        phases = _phases([p[k2] for p in runs[("rlvr", dt)]])
        col = {
            "trl_s_per_step": statistics.median(trl),
            "rlvr_s_per_step": statistics.median(rlvr),
            "trl_over_rlvr": statistics.median(trl) / statistics.median(rlvr),
            "whole_run": {fw: whole_run((fw, dt)) for fw in ("trl", "rlvr")},
            "cpu_s_per_step": {fw: statistics.median(intervals((fw, dt), 1)) for fw in ("trl", "rlvr")},
            "step_intervals_s": {"trl": trl, "rlvr": rlvr},
            "rlvr_phases_s": phases,
            "completion_tokens_mean": {
                "rlvr": statistics.mean(s["completions/mean_length"] for p in runs[("rlvr", dt)]
                                        for s in p[k2]["steps"]),
                "trl": statistics.mean(p[k2]["completions/mean_length"] for p in runs[("trl", dt)]),
            },
            "raw": {fw: [{k: {x: p[k][x] for x in ("train_s", "cpu_s", "process_s", "load_average")}
                          for k in p} for p in runs[(fw, dt)]] for fw in ("trl", "rlvr")},
        }
        wr = col["whole_run"]
        if k1:
            wr["trl_over_rlvr"] = wr["trl"]["s_per_step"] / wr["rlvr"]["s_per_step"]
        phases["other"] = col["rlvr_s_per_step"] - sum(v for k, v in phases.items() if k != "shadow")
        measured = [st for p in runs[("rlvr", dt)] for st in (p[k2]["steps"][1:] or p[k2]["steps"])]
        col["update_flops_per_step"] = update_flops(shape, w.completions_per_step,
                                                    statistics.median(st["num_tokens"] for st in measured))
        if dt == "bf16":
            col["trl_variant"] = "bf16=True (fp32 weights, autocast)"
            col["rlvr_overrides"] = args.rlvr_bf16
            if "fp32" in result:
                col["trl_fp32_over_rlvr_bf16"] = result["fp32"]["trl_s_per_step"] / col["rlvr_s_per_step"]
        result[dt] = col
    return result


def _phases(runs: list[dict]) -> dict[str, float]:
    """Median over repeats of each run's median timing/<phase> over its steps after the first."""
    per_run = []
    for r in runs:
        steps = r["steps"][1:] or r["steps"]
        keys = {k for s in steps for k in s if k.startswith("timing/")}
        per_run.append({k.removeprefix("timing/"): statistics.median(s.get(k, 0.0) for s in steps) for k in keys})
    keys = sorted({k for p in per_run for k in p})
    return {k: statistics.median(p.get(k, 0.0) for p in per_run) for k in keys}


def table(results: list[dict]) -> str:
    rows = ["| workload | column | TRL s/step | rlvr s/step | TRL / rlvr | whole runs: TRL / rlvr | rlvr phases (s) "
            "| update matmul-bound |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['workload']} | failed: {r['error'].splitlines()[0]} | | | | | | |")
        for dt in ("fp32", "bf16"):
            c = r.get(dt)
            if not c:
                continue
            ph = ", ".join(f"{k} {v:.3f}" for k, v in c["rlvr_phases_s"].items() if abs(v) >= 0.0005)
            frac = c["update_matmul_bound_fraction"]
            whole = f"{c['whole_run']['trl_over_rlvr']:.2f}x" if "trl_over_rlvr" in c["whole_run"] else "-"
            label = dt if dt == "fp32" else f"bf16 (rlvr: {c['rlvr_overrides']})"
            rows.append(f"| {r['workload']} | {label} | {c['trl_s_per_step']:.3f} | {c['rlvr_s_per_step']:.3f} | "
                        f"{c['trl_over_rlvr']:.2f}x | {whole} | {ph} | "
                        f"{'-' if frac is None else f'{frac:.2f}'} |")
            if dt == "bf16" and "trl_fp32_over_rlvr_bf16" in c:
                rows.append(f"| {r['workload']} | TRL fp32 / rlvr bf16 | {r['fp32']['trl_s_per_step']:.3f} | "
                            f"{c['rlvr_s_per_step']:.3f} | {c['trl_fp32_over_rlvr_bf16']:.2f}x | | | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="tiny,27m", help=f"comma-separated: {', '.join(WORKLOADS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", default=None,
                    help="K1,K2: optimizer steps of the two runs per repeat (default: per workload); "
                    "a single K: one run of K steps per repeat, no whole-run estimate")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 column")
    ap.add_argument("--rlvr-bf16", default=" ".join(RLVR_BF16_OVERRIDES),
                    help="rlvr overrides of the bf16 column (space-separated key=value)")
    ap.add_argument("--smollm2-prompts", type=int, default=None, help="prompts per step of smollm2 (x G 8)")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "rlvr-vs-trl"),
                    help="where workload folders are written (kept for reuse)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per child process")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        Path(spec["result"]).write_text(json.dumps(run_child(spec)))
        return
    sys.path.insert(0, str(ROOT))
    if args.steps:
        ks = [int(x) for x in args.steps.split(",")]
        k1, k2 = ks if len(ks) == 2 else (0, ks[0])
        if len(ks) > 2 or not 0 <= k1 < k2 or k2 < 2:
            raise SystemExit(f"--steps takes K1,K2 with 1 <= K1 < K2, or one K >= 2 (got {args.steps})")
        args.steps = (k1, k2)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    load_before = os.getloadavg()
    dtypes = ["float32"] + ([] if args.no_bf16 else ["bfloat16"])
    flops = {d: matmul_flops(d, args.threads) for d in dtypes}
    results = []
    for n in names:
        w = scaled(WORKLOADS[n], args.smollm2_prompts) if n == "smollm2" else WORKLOADS[n]
        try:
            results.append(bench_workload(w, args))
        except SystemExit as e:  # one failed workload must not lose the others
            results.append({"workload": n, "error": str(e)[-3000:]})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)  # each workload as soon as it is measured
    flops_after = {d: matmul_flops(d, args.threads) for d in dtypes}
    for d in dtypes:
        flops[d] = max(flops[d], flops_after[d])  # the machine's bound: noise only slows a measurement
    for r in results:  # the fractions against the final bound
        for dt, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
            c = r.get(dt)
            if c:
                upd = c["rlvr_phases_s"].get("update")
                c["update_matmul_bound_fraction"] = c["update_flops_per_step"] / upd / flops[dtype] if upd else None
    out = {
        "threads": args.threads,
        "machine": {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "matmul_flops_per_s": flops,
        "rlvr_bf16_overrides": args.rlvr_bf16,
        "results": results,
    }
    print(json.dumps(out, indent=2))
    print(table(results), file=sys.stderr)


if __name__ == "__main__":
    main()
