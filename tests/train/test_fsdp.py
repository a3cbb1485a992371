"""FSDP2 (train.parallelism=fsdp) on 2 gloo ranks: same numbers as 1 process and as DDP, reshardable
checkpoints (kill -9, then resume at 2 ranks, at 1, under DDP), and two "nodes" over loopback.

Every run is torchrun over this directory's test_distributed.py entry point (the CLI with per-prompt
seeded sampling), so a prompt's completions are the same whatever the layout: the 2-rank and 1-process
runs then train on the same data, and their weights can be compared.

Tolerance for layouts that differ (2 ranks vs 1 process, FSDP vs DDP): the same float32 arithmetic summed
in another order (per-rank partial sums, all-reduce / reduce-scatter vs one backward over all rows).
The worst-case error of a float32 sum of n terms is (n - 1)·2^-24 of the sum of the terms' magnitudes.
The largest reductions here (a gradient element over the 64 completions x 7 positions of a step, times
the hidden size 32 of the matmul inside) have n < 2^15, so a reordering moves a gradient element by at
most 2^-9 of that magnitude; with AdamW's update ~ lr·g (adam_epsilon=1) and the update as the scale,
the end weights may differ by 2^-9 ≈ 2e-3 of how far they moved. A real mistake (a gradient not
averaged, a rank's rows counted twice, the reference model or LoRA mixed up) is an error of the order
of the update itself, 500x above that bound. Measured: 1e-7 to 4e-7 of it, and exactly 0 between FSDP
and DDP (gloo adds the two ranks' partial sums in the same order in reduce-scatter and all-reduce).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import descendants, finish
from test_smoke import read_jsonl, smoke_overrides

HERE = Path(__file__).parent
REORDER_BOUND = 2.0**-9  # see the module docstring


def launch(args: list[str], nproc: int = 2, rdzv: list[str] | None = None) -> subprocess.Popen:
    # One thread per rank, CUDA hidden (gloo on any machine), gloo's sockets on loopback only.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.getcwd()]),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *(rdzv or ["--standalone"]),
        f"--nproc_per_node={nproc}",
        str(HERE / "test_distributed.py"),
        "train",
        *args,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(args: list[str], nproc: int = 2) -> None:
    finish(launch(args, nproc), timeout=300)


def common(model_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    # adam_epsilon=1 makes AdamW's update ~ -lr * g (not sign(g)), so a gradient off by a factor shows;
    # a constant schedule so a run resumed with another max_steps has the same learning rates.
    return smoke_overrides(
        model_dir,
        data,
        out,
        "rewards=[{name: 'test_distributed:digit_reward'}]",
        "algo.loss_type=dapo",
        "algo.scale_rewards=batch",
        "algo.mask_truncated_completions=false",
        "data.shuffle=false",
        "train.lr_scheduler_type=constant",
        "train.adam_epsilon=1.0",
        "train.learning_rate=0.1",
        "train.weight_decay=0.0",
        "train.max_grad_norm=1e9",
        *extra,
    )


def final(out: Path) -> dict[str, torch.Tensor]:
    adapter = out / "final" / "adapter_model.safetensors"
    return load_file(str(adapter if adapter.exists() else out / "final" / "model.safetensors"))


def rollouts(out: Path) -> Counter:
    with gzip.open(out / "rollouts.jsonl.gz", "rt") as f:
        recs = [json.loads(line) for line in f][1:]  # the first line is the record's header
    return Counter((r["step"], r["prompt"], r["completion"], r["reward"]) for r in recs)


def assert_close(got: dict, ref: dict, init: dict, what: str) -> None:
    assert got.keys() == ref.keys()
    moved = max((ref[k] - init[k]).abs().max().item() for k in ref if k in init)
    diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
    assert moved > 1e-4, f"{what}: the weights moved too little ({moved:.1e}) for the comparison to mean anything"
    print(f"{what}: weights differ by {diff:.2e} = {diff / moved:.1e} of the update ({moved:.2e})")
    assert diff <= REORDER_BOUND * moved, f"{what}: weights differ by {diff:.2e}, the update was {moved:.2e}"


# ------------------------------------------------------------------ equal to one process and to DDP

# 4 optimizer steps from one generation batch: GA 2 micro-batches per step, 4 per generation batch,
# each reused twice (num_iterations=2: an old-logprob pass and ratios != 1). Per rank 4 x 8 completions
# = 8 prompts; the single process takes the same 16 prompts as 4 x 16 completions, and each of its
# optimizer steps sees exactly the prompts the two ranks' step sees (rank r holds rows r, r+2, ...).
EQUIV = [
    # A completion pass per distinct length in the one-process and DDP runs (several passes per micro-batch);
    # FSDP's ranks make one (each pass is a collective there), so this also compares the two groupings.
    "train.length_bucket_pass_cost=0",
    "train.max_steps=4",
    "train.gradient_accumulation_steps=2",
    "train.steps_per_generation=4",
    "algo.num_iterations=2",
    "log.save_steps=100",
]


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(["algo.beta=0.1"], id="full-beta"),  # the reference model sharded too
        pytest.param(
            ["model.lora.enabled=true", "model.lora.r=4", "algo.beta=0.1", "train.learning_rate=0.5"], id="lora-beta"
        ),  # reference = the adapter switched off, under FSDP
        # Every run's groups packed in one pass (the others: FSDP packs where the bound allows, fewer collectives;
        # one process and DDP take a prefix pass per completion length).
        pytest.param(["algo.beta=0.1", "train.group_packing=true"], id="full-beta-packed"),
    ],
)
@pytest.mark.slow
def test_fsdp_on_two_ranks_equals_one_process_and_ddp(tiny_model_dir, sum_dataset, tmp_path, variant):
    outs = {k: tmp_path / k for k in ("fsdp", "ddp", "one")}
    run(
        common(
            tiny_model_dir,
            sum_dataset,
            outs["fsdp"],
            *EQUIV,
            *variant,
            "train.parallelism=fsdp",
            "train.per_device_train_batch_size=8",
        )
    )
    run(
        common(tiny_model_dir, sum_dataset, outs["one"], *EQUIV, *variant, "train.per_device_train_batch_size=16"),
        nproc=1,
    )
    assert rollouts(outs["fsdp"]) == rollouts(outs["one"])  # the same prompts, completions and rewards
    lora = "model.lora.enabled=true" in variant
    init = {} if lora else load_file(str(tiny_model_dir / "model.safetensors"))
    if lora:  # LoRA B starts at 0: compare against zeros, i.e. how far the adapter moved
        init = {k: torch.zeros_like(v) for k, v in final(outs["one"]).items()}
    assert_close(final(outs["fsdp"]), final(outs["one"]), init, "FSDP x2 vs 1 process")
    m_f, m_1 = read_jsonl(outs["fsdp"] / "metrics.jsonl"), read_jsonl(outs["one"] / "metrics.jsonl")
    assert [m["step"] for m in m_f] == [4] == [m["step"] for m in m_1]  # one line per generation batch
    assert m_f[-1]["grad_norm"] == pytest.approx(m_1[-1]["grad_norm"], rel=REORDER_BOUND)
    assert m_f[-1]["kl"] > 0  # the KL term is live: the policy moved away from its reference
    # The shard: each rank holds half of the parameters, gradients and optimizer state that one process holds
    # (FSDP2 cuts dim 0 into equal chunks, padding the last; the tiny model's dims are even, so exactly half).
    for key in ("memory/state_params", "memory/state_grads", "memory/state_optimizer"):
        assert m_f[-1][key] == pytest.approx(m_1[-1][key] / 2, rel=0.02), key
    if not lora:  # and DDP, the same layout with replicated weights
        run(common(tiny_model_dir, sum_dataset, outs["ddp"], *EQUIV, *variant, "train.per_device_train_batch_size=8"))
        assert_close(final(outs["fsdp"]), final(outs["ddp"]), init, "FSDP x2 vs DDP x2")
        # The FSDP checkpoint folder holds each rank's shard files, not a replicated copy.
        assert not (outs["fsdp"] / "final" / "rank-digests.json").exists()


@pytest.mark.slow
def test_fsdp_bf16_offload_checkpointing_native(tiny_model_dir, sum_dataset, tmp_path):
    """The options together, on the default engine: bf16 compute over float32 master weights, shards
    offloaded to CPU memory, activation checkpointing per layer, the native engine sampling the
    gathered bf16 copy. Checks the dtypes where they must be and that the copy is the live policy."""
    from torch.distributed.checkpoint import FileSystemReader

    out = tmp_path / "bf16"
    run(
        common(
            tiny_model_dir,
            sum_dataset,
            out,
            "train.max_steps=2",
            "train.parallelism=fsdp",
            "train.fsdp_cpu_offload=true",
            "model.dtype=bfloat16",
            "model.gradient_checkpointing=true",
            "rollout.backend=native",
            "train.per_device_train_batch_size=8",
            "log.save_steps=1",
        )
    )
    weights = final(out)
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}  # final/ in the configured dtype
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(out / "final")  # a plain transformers folder
    assert loaded.config.architectures == ["LlamaForCausalLM"] and loaded.dtype == torch.bfloat16
    meta = FileSystemReader(str(out / "checkpoints" / "step-000002" / "dcp")).read_metadata().state_dict_metadata
    master = {k: m.properties.dtype for k, m in meta.items() if k.startswith("model.")}
    assert master and set(master.values()) == {torch.float32}  # the shards are float32 master weights
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(weights[k], init[k].to(torch.bfloat16)) for k in init)
    # Step 2 sampled from the copy gathered after step 1: the sampler's log-probs are the trainer's up
    # to bf16 rounding (2^-8 relative, on logits of order 1 here; measured ~4e-4). That the copy holds
    # exactly the gathered weights is the unit test below.
    m = read_jsonl(out / "metrics.jsonl")[-1]
    assert m["step"] == 2 and m["mismatch/abs_logp_diff_mean"] < 2.0**-8


# ------------------------------------------------------------------ reshardable checkpoints

STEPS = ["train.max_steps=4", "log.save_steps=1", "log.save_total_limit=4"]


def per_rank(world: int) -> str:
    return f"train.per_device_train_batch_size={16 // world}"  # the same 4 prompts per step at any world size


@pytest.fixture(scope="module")
def fsdp_reference(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("fsdp")
    data = tmp / "sums.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10) for b in range(3))
    )
    run(common(tiny_model_dir, data, tmp / "ref", *STEPS, per_rank(2), "train.parallelism=fsdp"))
    return data, tmp / "ref"


def kill_after(proc: subprocess.Popen, ckpt: Path) -> None:
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not ckpt.exists():
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    for pid in [proc.pid, *descendants(proc.pid)]:  # the launcher and both ranks, at once, mid-run
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate()


@pytest.mark.slow
def test_killed_fsdp_run_resumes_bitwise_and_reshards(tiny_model_dir, fsdp_reference, tmp_path):
    data, ref_out = fsdp_reference
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    ref = final(ref_out)
    killed = tmp_path / "killed"
    args = common(tiny_model_dir, data, killed, *STEPS, per_rank(2), "train.parallelism=fsdp")
    kill_after(launch(args), killed / "checkpoints" / "step-000002")
    assert not (killed / "final").exists()
    step2 = tmp_path / "step-000002"  # the resumes below must not see the checkpoints that come after it
    shutil.copytree(killed / "checkpoints" / "step-000002", step2)

    # Same world size: bitwise the uninterrupted run.
    run(args + ["resume=true"])
    got = final(killed)
    assert not [k for k in ref if not torch.equal(ref[k], got[k])], "FSDP resume is not bitwise"
    assert [m["step"] for m in read_jsonl(killed / "metrics.jsonl")] == [1, 2, 3, 4]

    # 2 -> 1 process: weights and AdamW state regathered; the same prompts at steps 3 and 4.
    one = tmp_path / "one"
    run(common(tiny_model_dir, data, one, *STEPS, per_rank(1), f"resume={step2}"), nproc=1)
    assert_close(final(one), ref, init, "2 FSDP ranks -> 1 process")
    later = Counter({k: v for k, v in rollouts(ref_out).items() if k[0] > 2})
    assert rollouts(one) == later, "the resumed process did not continue the data stream where the ranks left it"

    # FSDP -> DDP, and the DDP checkpoint this writes at step 3 -> FSDP again.
    ddp = tmp_path / "ddp"
    run(common(tiny_model_dir, data, ddp, *STEPS, per_rank(2), f"resume={step2}"))
    assert_close(final(ddp), ref, init, "FSDP -> DDP")
    back = tmp_path / "back"
    run(
        common(
            tiny_model_dir,
            data,
            back,
            *STEPS,
            per_rank(2),
            "train.parallelism=fsdp",
            f"resume={ddp / 'checkpoints' / 'step-000003'}",
        )
    )
    assert_close(final(back), ref, init, "DDP -> FSDP")
    assert [m["step"] for m in read_jsonl(back / "metrics.jsonl")] == [4]

    # 1 process -> 2 FSDP ranks, from the single process's step-3 checkpoint.
    up = tmp_path / "up"
    run(
        common(
            tiny_model_dir,
            data,
            up,
            *STEPS,
            per_rank(2),
            "train.parallelism=fsdp",
            f"resume={one / 'checkpoints' / 'step-000003'}",
        )
    )
    assert_close(final(up), ref, init, "1 process -> 2 FSDP ranks")
    assert rollouts(up) == Counter({k: v for k, v in rollouts(ref_out).items() if k[0] > 3})


# ------------------------------------------------------------------ two nodes over loopback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_over_loopback(tiny_model_dir, fsdp_reference, tmp_path):
    """Two torchrun launchers (--nnodes 2, one process each) meeting at a c10d rendezvous on 127.0.0.1:
    the multi-node command, on one machine. It trains exactly as the single-launcher 2-rank run."""
    data, ref_out = fsdp_reference
    out = tmp_path / "nodes"
    args = common(tiny_model_dir, data, out, *STEPS, per_rank(2), "train.parallelism=fsdp")
    rdzv = [
        "--nnodes=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-id=rlvr-test",
        "--local-addr=127.0.0.1",
    ]
    nodes = [launch(args, nproc=1, rdzv=rdzv) for _ in range(2)]
    for node in nodes:
        finish(node, timeout=300)
    assert json.loads((out / "header.json").read_text())["num_processes"] == 2
    ref, got = final(ref_out), final(out)
    assert not [k for k in ref if not torch.equal(ref[k], got[k])], "two nodes trained differently from one"


# ------------------------------------------------------------------ pieces, in one process


def test_resplit_continues_the_stream_where_every_rank_left_it(sum_dataset, tmp_path):
    from rlvr.checkpoint import resplit
    from rlvr.config import load_config
    from rlvr.tasks.stream import PromptStream

    cfg = load_config(
        None,
        [
            f"data.path={sum_dataset}",
            f"log.output_dir={tmp_path}",
            "data.shuffle=false",
            "rewards=[{name: 'smoke_rewards:length_bonus'}]",
        ],
    )
    whole = [r["prompt_id"] for r in PromptStream(cfg).take(20)]

    def state(stream: PromptStream, generation: int, history: dict, errors: dict) -> dict:
        return {
            "generation": generation,
            "stream": stream.state_dict(),
            "reward_errors": errors,
            "group_filter": {"history": history, "draws": generation, "warned_short": False},
        }

    old = [PromptStream(cfg, rank=r, world=2) for r in range(2)]
    for s in old:
        s.take(3)  # rows 0..5 handed out
    saved = [state(old[0], 4, {"p0": ["all_pass"]}, {"f": 1}), state(old[1], 6, {"p1": ["all_fail"]}, {"f": 2})]
    new = []
    for r in range(3):  # 2 -> 3 processes: rows 6, 7, 8 next, one to each, nothing repeated or skipped
        mine = resplit(saved, r, 3)
        stream = PromptStream(cfg, rank=r, world=3)
        stream.load_state_dict(mine["stream"])
        new.append([row["prompt_id"] for row in stream.take(2)])
        assert mine["generation"] == 6  # past every seed either rank used
        assert mine["group_filter"]["history"] == {"p0": ["all_pass"], "p1": ["all_fail"]}
        assert mine["reward_errors"] == ({"f": 3} if r == 0 else {})  # totals, counted once
    assert new == [[whole[6], whole[9]], [whole[7], whole[10]], [whole[8], whole[11]]]
    # Uneven positions (a DAPO refill on rank 1: rows 1, 3, 5, 7): resume after row 7; row 6, which
    # rank 0 had not reached, is skipped rather than row 7 repeated.
    old[1].take(1)
    saved[1] = state(old[1], 6, {}, {})
    one = PromptStream(cfg)
    one.load_state_dict(resplit(saved, 0, 1)["stream"])
    assert [row["prompt_id"] for row in one.take(2)] == whole[8:10]


def test_gathered_engine_samples_the_sharded_weights_and_frees_them(tiny_model_dir):
    """The rollout copy of a sharded policy: the gathered weights, exactly; freed when the trainer
    forwards; refused until gathered again. One process with a 1-rank gloo group (DTensors need one)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr import fsdp
    from rlvr.rollout import SamplingParams, make_engine

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok("1+2=")["input_ids"], tok("3+4=")["input_ids"]]
    sampling = SamplingParams(temperature=1.0, max_tokens=5, seed=3)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        engine = fsdp.GatheredEngine(policy, lambda m: make_engine("native", m, tok))
        pushed = fsdp.GatheredEngine(policy, PushedTo)  # an engine with its own weights (vLLM's kind)
        loaded = {name: p.data_ptr() for name, p in policy.named_parameters()}
        # No second copy of the weights while starting: the copy's parameters are the loaded tensors.
        assert {name: p.data_ptr() for name, p in engine._copy.named_parameters()} == loaded
        fsdp.shard(policy, torch.device("cpu"))
        assert all(p.data_ptr() != loaded[name] for name, p in policy.named_parameters())  # shards: new storage
        before = engine.generate(prompts, 4, sampling)  # the loaded weights, before any update
        policy(input_ids=torch.tensor([prompts[0]]))  # the trainer's forward frees the copy
        assert all(p.numel() == 0 for p in engine._copy.parameters())
        with pytest.raises(RuntimeError, match="released"):
            engine.generate(prompts, 4, sampling)
        with torch.no_grad():
            for p in policy.parameters():  # an "update" of the shards
                p.mul_(1.5)
        engine.load_weights(policy.named_parameters())
        got = engine.generate(prompts, 4, sampling)
        engine.close()  # the run's end: the copy is freed before the final save gathers the weights
        assert all(p.numel() == 0 for p in engine._copy.parameters())
        pushed.load_weights(policy.named_parameters())
    finally:
        dist.destroy_process_group()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    as_loaded = make_engine("native", plain, tok).generate(prompts, 4, sampling)
    assert [(c.token_ids, c.logprobs) for c in before] == [(c.token_ids, c.logprobs) for c in as_loaded]
    with torch.no_grad():
        for p in plain.parameters():
            p.mul_(1.5)
    expected = make_engine("native", plain, tok).generate(prompts, 4, sampling)
    assert [(c.token_ids, c.logprobs) for c in got] == [(c.token_ids, c.logprobs) for c in expected]
    assert [c.logprobs for c in got] != [c.logprobs for c in before]  # it did change: the copy is not stale
    # The pushing engine got every whole tensor, could read whole weights from its model while pushing
    # (vLLM server mode and adapter saves do), and the copy was freed right after.
    whole = dict(plain.named_parameters())
    assert pushed.inner.got.keys() == whole.keys()
    assert all(torch.equal(pushed.inner.got[k], whole[k]) for k in whole)
    assert pushed.inner.model_was_whole
    assert all(p.numel() == 0 for p in pushed.inner.model.parameters())


class PushedTo:
    """A stand-in for vLLM: keeps its own weights, records what it was handed."""

    samples_live_policy = False

    def __init__(self, model):
        self.model, self.got, self.model_was_whole = model, None, False

    def load_weights(self, named_tensors):
        self.got = {n: t.clone() for n, t in named_tensors}
        self.model_was_whole = all(p.numel() > 0 for p in self.model.parameters())

    def generate(self, prompt_ids, n, sampling):
        return []

    def close(self):
        pass


def test_cpu_offload_without_fsdp_is_refused(tmp_path):
    from rlvr.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="set train.parallelism=fsdp too"):
        load_config(None, [f"log.output_dir={tmp_path}", "train.fsdp_cpu_offload=true"])
    assert load_config(
        None, [f"log.output_dir={tmp_path}", "train.fsdp_cpu_offload=true", "train.parallelism=fsdp"]
    ).train.fsdp_cpu_offload


def test_lora_under_fsdp_keeps_the_frozen_base_in_its_dtype(tiny_model_dir):
    """bf16 LoRA sharded: only the adapter gets float32 master weights; the frozen base stays bf16 (a float32
    copy would double its shards, for weights nothing updates), and forward/backward still train the adapter.
    One process with a 1-rank gloo group (DTensors need one)."""
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlvr import fsdp

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
        model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
        fsdp.shard(model, torch.device("cpu"))
        frozen = {p.to_local().dtype for p in model.parameters() if not p.requires_grad}
        trained = {p.to_local().dtype for p in model.parameters() if p.requires_grad}
        assert frozen == {torch.bfloat16} and trained == {torch.float32}
        assert fsdp.compute_dtype(model) == torch.bfloat16
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        out = model(input_ids=ids)
        assert out.logits.dtype == torch.bfloat16  # computed in the load dtype
        out.logits.float().logsumexp(-1).sum().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g.to_local()).all() for g in grads)
        assert any(g.to_local().abs().sum() > 0 for g in grads)
        assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    finally:
        dist.destroy_process_group()
