"""Many processes: ``torchrun --nproc_per_node=2 -m rlvr.cli train`` on CPU with gloo (and, marked
gpu, with nccl where there are 2 GPUs).

Each run launches torchrun as a subprocess (OMP_NUM_THREADS=1, CUDA hidden, bounded timeout) on the
tiny random Llama of conftest.py; the equivalence test runs both layouts through this file's
``__main__`` (the CLI with per-prompt seeded sampling).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_smoke import read_jsonl, smoke_overrides

from rlvr.config import load_config
from rlvr.tasks.stream import PromptStream
from rlvr.distributed import weights_digest

HERE = Path(__file__).parent
REWARD = ["rewards=[{name: 'smoke_rewards:length_bonus'}]"]


def digit_reward(prompts, completions, completion_ids=None, **_):
    """Digits in the completion, times (1 + a) / 10 for prompt 'a+b=': spread within groups of random
    text, and a batch std that depends on every rank's prompts."""
    return [sum(ch.isdigit() for ch in c) * (1 + int(p[0])) / 10 for p, c in zip(prompts, completions)]


def seed_per_prompt() -> None:
    """Make the hf engine's sampling a function of the prompt alone: each prompt's G completions are
    drawn in their own generate call, seeded by the prompt's token ids. The trainer seeds a call by
    generation count and rank, so without this two layouts sample the same prompt differently."""
    from rlvr.rollout.hf import HFEngine

    generate = HFEngine.generate

    def per_prompt(self, prompt_ids, n, sampling):
        return [
            c for p in prompt_ids for c in generate(self, [p], n, replace(sampling, seed=zlib.crc32(str(p).encode())))
        ]

    HFEngine.generate = per_prompt


def torchrun(args: list[str], nproc: int = 2, seeded_per_prompt: bool = False, cuda: bool = False) -> subprocess.Popen:
    # One intra-op thread per rank (2 ranks on 2 cores); tests/train on the path for the reward modules;
    # CUDA hidden unless asked for, so these are gloo tests on any machine.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.getcwd()]),
    }
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    entry = [__file__] if seeded_per_prompt else ["-m", "rlvr.cli"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *entry,
        "train",
        *args,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{out[-4000:]}"
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below pid (Linux /proc): torchrun starts its ranks in their own sessions,
    so killing its process group would leave them running."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "model.safetensors"))


def ddp_args(model_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return smoke_overrides(
        model_dir,
        data,
        out,
        "train.per_device_train_batch_size=8",
        "log.save_steps=1",
        "log.save_total_limit=3",
        *extra,
    )


@pytest.fixture(scope="module")
def two_rank_run(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """4 optimizer steps on 2 ranks, a checkpoint after each: the reference for the resume test too."""
    tmp = tmp_path_factory.mktemp("ddp")
    data = tmp / "sums.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": "sums"}) + "\n"
            for a in range(10)
            for b in range(3)
        )
    )
    finish(torchrun(ddp_args(tiny_model_dir, data, tmp / "run", "train.max_steps=4")))
    return data, tmp / "run"


def test_two_ranks_train_log_once_and_end_with_identical_weights(tiny_model_dir, two_rank_run):
    _, out = two_rank_run
    # Rank 0 alone logs: one metrics line per step, describing the whole generation batch of both
    # ranks: 2 ranks x 8 completions = 16 = 4 groups of 4.
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert all(m["groups/count"] == 4 for m in lines)
    assert json.loads((out / "header.json").read_text())["num_processes"] == 2
    # Each checkpoint holds both ranks' data positions and RNG states; each rank took 2 prompts per step.
    ckpt = out / "checkpoints" / "step-000004"
    for r in (0, 1):
        assert (ckpt / f"rng-rank{r}.pt").exists()
        assert json.loads((ckpt / f"rank-state{r}.json").read_text())["stream"] == {"position": 8, "offset": 0}
    assert not (ckpt / "rank-state2.json").exists()
    # Both ranks ended on the saved weights: their digests (written by each rank) equal the final model's.
    from transformers import AutoModelForCausalLM

    digests = json.loads((out / "final" / "rank-digests.json").read_text())
    final = weights_digest(AutoModelForCausalLM.from_pretrained(out / "final"))
    assert digests == [final, final]
    assert final != weights_digest(AutoModelForCausalLM.from_pretrained(tiny_model_dir))  # it trained


@pytest.mark.parametrize("packing", ["false", "true"], ids=["prefix-passes", "packed"])
def test_one_step_of_two_ranks_equals_one_process_with_both_batches(tiny_model_dir, sum_dataset, tmp_path, packing):
    """ONE optimizer step of 2 ranks x 4 prompts = 1 process with the same 8 prompts, to ~1e-6; with the completions
    in several prefix passes per micro-batch, and with each group packed in one pass (through DDP either way).

    What it checks is the aggregation across ranks: the dapo normaliser (active tokens summed over
    ranks by all_reduce, divided by num_processes), DDP's gradient average with no_sync over a GA
    window of 2 micro-batches, and scale_rewards="batch" (std over the gathered batch). Forgetting
    any of these changes the gradient (by 2x, or by a different std) and so grad_norm and weights.

    Sampling is made layout-independent by `seed_per_prompt` (greedy sampling would not do: G equal
    completions with group-centred advantages give exactly zero gradient). The 2 ranks see rows
    0,2,4,6 and 1,3,5,7 of the stream, the single process rows 0..7: the same prompts, hence the
    same completions, rewards and advantages, which the test checks before comparing weights.

    AdamW's first step is sign(g) for small eps, blind to the gradient's scale; adam_epsilon=1 makes
    the update -lr * g / (|g| + 1), i.e. nearly proportional to g, so a scale error shows up.
    """
    common = [
        "train.max_steps=1",
        "algo.loss_type=dapo",
        "algo.scale_rewards=batch",
        "algo.mask_truncated_completions=false",
        "rewards=[{name: 'test_distributed:digit_reward'}]",
        "train.gradient_accumulation_steps=2",
        "train.adam_epsilon=1.0",
        "train.learning_rate=1.0",
        "train.weight_decay=0.0",
        "train.max_grad_norm=1e9",
        "data.shuffle=false",
        "log.save_steps=100",
        "train.length_bucket_pass_cost=0",  # several completion passes per micro-batch, one of them through DDP
        f"train.group_packing={packing}",
    ]
    two, one = tmp_path / "two", tmp_path / "one"
    # Per rank: 2 micro-batches of 8 = 16 completions = 4 prompts; one process: 2 of 16 = 8 prompts.
    # Both at once, each through torchrun (1 process = WORLD_SIZE 1: the plain one-process loop).
    procs = [
        torchrun(
            smoke_overrides(tiny_model_dir, sum_dataset, two, *common, "train.per_device_train_batch_size=8"),
            seeded_per_prompt=True,
        ),
        torchrun(
            smoke_overrides(tiny_model_dir, sum_dataset, one, *common, "train.per_device_train_batch_size=16"),
            nproc=1,
            seeded_per_prompt=True,
        ),
    ]
    for proc in procs:
        finish(proc)

    def rollouts(out: Path) -> Counter:
        with gzip.open(out / "rollouts.jsonl.gz", "rt") as f:
            recs = [json.loads(line) for line in f][1:]  # the first line is the record's header
        return Counter((r["prompt"], r["completion"], r["reward"], round(r["advantage"], 5)) for r in recs)

    assert rollouts(two) == rollouts(one)  # same prompts, completions, rewards and advantages
    assert len({a for _, _, _, a in rollouts(one)}) > 1  # advantages are not all zero
    m2, m1 = read_jsonl(two / "metrics.jsonl")[0], read_jsonl(one / "metrics.jsonl")[0]
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    assert m2["num_tokens"] == m1["num_tokens"]
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    w2, w1 = weights(two), weights(one)
    delta = max((w1[k] - init[k]).abs().max().item() for k in init)
    diff = max((w2[k] - w1[k]).abs().max().item() for k in init)
    assert delta > 1e-3, "the step moved the weights too little for the comparison to mean anything"
    assert diff < 1e-6, f"2 ranks and 1 process disagree by {diff:.2e} (the update itself is {delta:.2e})"


def test_killed_two_rank_run_resumes_to_the_same_weights(tiny_model_dir, two_rank_run, tmp_path):
    data, ref_out = two_rank_run
    out = tmp_path / "killed"
    args = ddp_args(tiny_model_dir, data, out, "train.max_steps=4")
    proc = torchrun(args)
    ckpts, deadline = out / "checkpoints", time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (ckpts / "step-000002").exists():
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    for pid in [proc.pid, *descendants(proc.pid)]:  # the launcher and both ranks, at once, mid-run
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate()
    assert not (out / "final").exists()
    finish(torchrun(args + ["resume=true"]))
    ref, got = weights(ref_out), weights(out)
    diff = {k: (ref[k] - got[k]).abs().max().item() for k in ref if not torch.equal(ref[k], got[k])}
    assert not diff, f"resumed weights differ from the uninterrupted 2-rank run: {diff}"
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (nccl, one rank per GPU)")
def test_two_ranks_on_two_gpus_with_nccl(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "nccl"
    finish(torchrun(ddp_args(tiny_model_dir, sum_dataset, out, "train.max_steps=2"), cuda=True))
    header = json.loads((out / "header.json").read_text())
    assert header["num_processes"] == 2 and header["device"].startswith("cuda")
    digests = json.loads((out / "final" / "rank-digests.json").read_text())
    assert len(digests) == 2 and digests[0] == digests[1]


def test_ranks_draw_disjoint_shards_of_the_same_stream(sum_dataset, tmp_path):
    cfg = load_config(None, [f"data.path={sum_dataset}", f"log.output_dir={tmp_path}", *REWARD])
    whole = [r["prompt_id"] for r in PromptStream(cfg).take(15)]
    shards = [PromptStream(cfg, rank=r, world=3) for r in range(3)]
    assert [[row["prompt_id"] for row in s.take(4)] for s in shards] == [whole[0:12:3], whole[1:12:3], whole[2:12:3]]
    # A rank that draws more (a DAPO refill) moves only its own position: rank 1's 5th row is still row 13.
    shards[0].take(5)
    assert shards[1].take(1)[0]["prompt_id"] == whole[13]
    assert [s.position for s in shards] == [9, 5, 4]


def test_more_ranks_than_prompts_fails_with_a_clear_message(tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    cfg = load_config(None, [f"data.path={data}", f"log.output_dir={tmp_path}", *REWARD])
    with pytest.raises(ValueError, match="has 1 rows but the run has 2 processes"):
        PromptStream(cfg, rank=1, world=2)


if __name__ == "__main__":  # a rank of the equivalence test: the CLI with per-prompt seeded sampling
    seed_per_prompt()
    from rlvr.cli import main

    main()
