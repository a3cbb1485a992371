"""rlvr.memory: per-phase peaks, the plan's parameter arithmetic, the refusal and `rlvr plan`."""

from __future__ import annotations

import dataclasses
import mmap
import os
import platform
import subprocess
import sys

import pytest
import torch

from rlvr import memory
from rlvr.config import load_config
from rlvr.memory import GIB, ModelShape, PhaseMeter, estimate


def _qwen3_config(tied=True):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=500,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=tied,
    )


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_equals_the_built_model(tied):
    from transformers import Qwen3ForCausalLM

    c = _qwen3_config(tied)
    model = Qwen3ForCausalLM(c)
    assert ModelShape.from_hf_config(c).num_params == sum(p.numel() for p in model.parameters())


def test_lora_parameter_count_equals_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3ForCausalLM

    c = _qwen3_config()
    for targets in ("all-linear", ["q_proj", "down_proj"]):
        model = get_peft_model(Qwen3ForCausalLM(c), LoraConfig(r=8, target_modules=targets))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert ModelShape.from_hf_config(c).lora_params(8, targets) == trainable


def test_phase_meter_sees_an_allocation_inside_its_phase_only():
    meter = PhaseMeter(torch.device("cpu"))
    with meter("small"):
        pass
    with meter("big"):
        # 0.28 GiB of fresh pages, touched: an anonymous mapping, so no allocator can serve it from memory
        # it already holds (in a long test session malloc may reuse freed, still-resident heap).
        buf = mmap.mmap(-1, 300_000_000)
        for i in range(0, len(buf), mmap.PAGESIZE):
            buf[i] = 1
        buf.close()
    out = meter.pop()
    assert out["memory/peak_big"] - out["memory/peak_small"] > 0.25
    assert out["memory/peak"] == out["memory/peak_big"] and "timing/big" in out
    assert meter.pop() == {}


def test_the_terms_follow_the_config():
    shape = ModelShape.from_hf_config(_qwen3_config())
    base = load_config(None, ["model.dtype=bfloat16", "train.per_device_train_batch_size=16"])
    p0 = estimate(base, shape)
    ref = estimate(
        load_config(None, ["model.dtype=bfloat16", "train.per_device_train_batch_size=16", "algo.beta=0.04"]), shape
    )
    assert ref.resident["reference model"] == shape.num_params * 2 and "reference model" not in p0.resident
    ckpt = estimate(
        load_config(
            None, ["model.dtype=bfloat16", "train.per_device_train_batch_size=16", "model.gradient_checkpointing=true"]
        ),
        shape,
    )
    assert ckpt.phases["update"]["activations"] < p0.phases["update"]["activations"]
    lora = estimate(
        load_config(
            None,
            [
                "model.dtype=bfloat16",
                "train.per_device_train_batch_size=16",
                "model.lora.enabled=true",
                "algo.beta=0.04",
            ],
        ),
        shape,
    )
    assert "reference model" not in lora.resident  # the LoRA reference is the base model, adapter off
    assert lora.resident["optimizer state (AdamW m, v)"] == 2 * 4 * shape.lora_params(16, "all-linear")


def test_eager_attention_keeps_its_probabilities_in_the_plan():
    """Eager attention (chosen on a CPU under bf16 autocast or for a model under hidden 512, or asked for) keeps
    N x heads x S x S attention probabilities per layer for backward (float32 + a bf16 copy under bf16), one
    layer's with checkpointing; SDPA none."""
    small = ModelShape.from_hf_config(_qwen3_config())  # hidden 64
    wide = dataclasses.replace(small, hidden=1024)
    sets = ["train.per_device_train_batch_size=8", "rollout.max_prompt_length=60", "rollout.max_completion_length=40"]
    term, S = "attention probabilities (eager)", 100
    per_layer = 8 * small.heads * S * S
    bf16 = estimate(load_config(None, [*sets, "train.mixed_precision=bf16"]), wide)
    assert bf16.phases["update"][term] == wide.layers * per_layer * 6
    ckpt = estimate(load_config(None, [*sets, "train.mixed_precision=bf16", "model.gradient_checkpointing=true"]), wide)
    assert ckpt.phases["update"][term] == per_layer * 6
    asked = estimate(load_config(None, [*sets, "model.attn_implementation=eager"]), wide)
    assert asked.phases["update"][term] == wide.layers * per_layer * 4  # float32 only
    assert estimate(load_config(None, sets), small).phases["update"][term] == small.layers * per_layer * 4
    for cfg, shape, device in (
        (load_config(None, sets), wide, "cpu"),
        (load_config(None, sets), small, "cuda"),
        (load_config(None, [*sets, "train.mixed_precision=bf16"]), wide, "cuda"),
        (load_config(None, [*sets, "train.mixed_precision=bf16", "model.attn_implementation=sdpa"]), small, "cpu"),
    ):
        assert term not in estimate(cfg, shape, device).phases["update"]


def test_bf16_mixed_precision_plans_the_kernels_bf16_weight_copies():
    """Sampling a bf16 mixed-precision run on CPU, the C kernel holds bf16 copies of every projection and the head
    (where that is more than the PyTorch decoder's fused float32 copies, as for this shape's large vocabulary)."""
    shape = dataclasses.replace(ModelShape.from_hf_config(_qwen3_config()), vocab=50_000)
    plain = estimate(load_config(None, ["train.per_device_train_batch_size=8"]), shape).phases["rollout"]
    bf16 = estimate(load_config(None, ["train.per_device_train_batch_size=8", "train.mixed_precision=bf16"]),
                    shape).phases["rollout"]
    H, Q, K, I = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    per_layer = H * Q + 2 * H * K + Q * H + 3 * H * I  # q, k, v, o, gate, up, down
    assert bf16["bf16 weight copies (C kernel)"] == (shape.layers * per_layer + shape.vocab * H) * 2
    assert "fused q|k|v, gate|up copies" not in bf16 and "fused q|k|v, gate|up copies" in plain


def test_train_refuses_with_the_plan_and_a_knob_that_fits(monkeypatch):
    cfg = load_config(None, ["model.dtype=bfloat16", "train.per_device_train_batch_size=256"])
    plan = estimate(cfg, memory.model_shape("tiny"))
    free = plan.peak - 1
    monkeypatch.setattr(memory, "device_free_memory", lambda kind: (free, "available host memory"))
    with pytest.raises(MemoryError) as e:
        memory.check_fits(cfg, torch.device("cpu"))
    msg = str(e.value)
    assert "estimated peak" in msg and "knobs that would make it fit" in msg and "memory_check=warn" in msg
    last_knob = [ln for ln in msg.splitlines() if "estimated peak" in ln and "GiB" in ln][-1]
    assert float(last_knob.rsplit("estimated peak", 1)[1].split()[0]) * GIB <= free
    memory.check_fits(
        load_config(None, ["train.memory_check=warn", "train.per_device_train_batch_size=256"]), torch.device("cpu")
    )  # warns, does not raise


def test_plan_command_prints_the_table(tmp_path):
    from typer.testing import CliRunner

    from rlvr.cli import app

    _qwen3_config().save_pretrained(tmp_path)
    res = CliRunner().invoke(app, ["plan", f"model.path={tmp_path}", "--memory-gib", "64"])
    assert res.exit_code == 0, res.output
    assert "peak of update" in res.output and "fits" in res.output
    res = CliRunner().invoke(app, ["plan", f"model.path={tmp_path}", "--memory-gib", "0.001"])
    assert res.exit_code == 1 and "DOES NOT FIT" in res.output


def test_eight_bit_adam_is_opt_in_and_planned_at_a_quarter():
    from rlvr.builders import build_optimizer

    shape = ModelShape.from_hf_config(_qwen3_config())
    base = load_config(None, ["model.dtype=bfloat16"])
    low = load_config(None, ["model.dtype=bfloat16", "train.optim=adamw_torch_8bit"])
    assert base.train.optim == "adamw_torch_fused"
    bf16_state = estimate(base, shape).resident["optimizer state (AdamW m, v)"]
    q_state = estimate(low, shape).resident["optimizer state (8-bit AdamW m, v)"]
    assert bf16_state == 4 * shape.num_params and q_state == int(2 * shape.num_params * (1 + 4 / 256))
    pytest.importorskip("torchao")
    opt = build_optimizer(low, torch.nn.Linear(64, 64))
    assert type(opt).__name__ == "AdamW8bit" and opt.defaults["lr"] == low.train.learning_rate


def test_offloads_move_the_moments_and_the_reference_out_of_the_resident_set():
    shape = ModelShape.from_hf_config(_qwen3_config())
    args = ["model.dtype=bfloat16", "train.per_device_train_batch_size=16", "algo.beta=0.04"]
    base = estimate(load_config(None, args), shape)
    off = estimate(load_config(None, [*args, "train.optim_offload=true", "train.ref_offload=true"]), shape)
    n = shape.num_params  # smaller than one chunk: the staging holds the whole of it
    assert "optimizer state (AdamW m, v)" not in off.resident and off.resident["AdamW staging (optim_offload)"] == 4 * n
    assert "reference model" not in off.resident and off.phases["logprobs"]["reference (ref_offload)"] == 2 * n
    assert off.phase_peak("update") == base.phase_peak("update") - 2 * n  # bf16 moments (4n) less the staging (2n)
    assert off.phase_peak("logprobs") == base.phase_peak("logprobs") - 4 * n + 4 * n  # moments out, staging in
    assert any("optim_offload: AdamW's moments" in note for note in off.notes)
    with_lora = estimate(load_config(None, [*args, "model.lora.enabled=true", "train.ref_offload=true"]), shape)
    assert "reference (ref_offload)" not in with_lora.phases["logprobs"]  # no separate reference to park


def test_full_fine_tuning_of_a_1_7b_model_is_offered_the_offloads_before_lora():
    from transformers import Qwen3Config

    shape = ModelShape.from_hf_config(
        Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                    num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
    )
    cfg = load_config(None, ["model.dtype=bfloat16", "algo.beta=0.04", "model.gradient_checkpointing=true",
                             "train.per_device_train_batch_size=8", "train.gradient_accumulation_steps=4",
                             "rollout.max_completion_length=256", "rollout.max_prompt_length=128"])
    lines = memory.knobs_to_fit(cfg, shape, "cpu", free=int(9.5 * GIB))
    order = [ln.split("=")[0] for ln in lines]
    assert order.index("train.optim_offload") < order.index("train.ref_offload")  # the same result, in this order
    assert not any(k in order for k in ("model.lora.enabled", "train.optim"))  # it fits before any change of result
    assert float(lines[-1].rsplit("estimated peak", 1)[1].split()[0]) <= 9.5


def test_knobs_are_concrete_settings_in_order():
    shape = ModelShape.from_hf_config(_qwen3_config())
    cfg = load_config(
        None,
        [
            "model.dtype=float32",
            "algo.beta=0.04",
            "train.per_device_train_batch_size=256",
            "rollout.max_completion_length=512",
        ],
    )
    lines = memory.knobs_to_fit(cfg, shape, "cpu", free=1)  # nothing fits in one byte: every knob is listed
    assert lines[0].startswith("model.gradient_checkpointing=true")
    # A model under hidden 512 runs eager attention on CPU, whose kept probabilities SDPA does not keep.
    assert lines[1].startswith("model.attn_implementation=sdpa")
    assert lines[2].startswith("train.per_device_train_batch_size=")
    assert any(ln.startswith("model.dtype=bfloat16") for ln in lines)
    assert lines[-1].startswith("still over")
    peaks = [float(ln.rsplit("estimated peak", 1)[1].split()[0]) for ln in lines[:-1]]
    assert peaks == sorted(peaks, reverse=True)


def test_rlvr_train_refuses_before_loading_the_model(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import rlvr.train
    from rlvr.cli import app

    monkeypatch.setattr(memory, "device_free_memory", lambda kind: (1, "available host memory"))
    loaded = []
    monkeypatch.setattr(rlvr.train, "load_model", lambda *a, **k: loaded.append(1))
    res = CliRunner().invoke(app, ["train", f"log.output_dir={tmp_path}", "log.progress=false"])
    assert res.exit_code == 1 and "DOES NOT FIT" in res.output and "knobs that would make it fit" in res.output
    assert not loaded


# A child that frees 64 MiB of 1 MiB tensors (one tensor kept after them, so the heap's top cannot be
# trimmed) after a freed 16 MiB block has raised glibc's dynamic threshold, and prints the MiB still resident.
_RETAINED = """
import sys, torch
from rlvr import memory
if sys.argv[1] == "release":
    assert memory.release_freed_memory()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = torch.ones(4 * 1024 * 1024); del big
before = rss()
blocks = [torch.ones(256 * 1024) for _ in range(64)]
keep = torch.ones(256 * 1024)
del blocks
print((rss() - before) / 2**20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's mallopt")
def test_release_freed_memory_returns_freed_blocks_to_the_system():
    def retained_mib(mode):
        out = subprocess.run(
            [sys.executable, "-c", _RETAINED, mode],
            capture_output=True,
            text=True,
            check=True,
            env={k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"},
        )
        return float(out.stdout.split()[-1])

    # glibc's default keeps the freed 64 MiB resident; the policy leaves only the kept 1 MiB tensor.
    assert retained_mib("default") > 48
    assert retained_mib("release") < 8


def test_release_freed_memory_leaves_the_users_setting(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert memory.release_freed_memory() is False


def test_plan_says_when_the_retained_heap_is_not_in_it():
    shape = ModelShape.from_hf_config(_qwen3_config())
    kept = estimate(load_config(None, ["train.release_freed_memory=false"]), shape, "cpu")
    released = estimate(load_config(None, ["train.release_freed_memory=true"]), shape, "cpu")
    assert any("release_freed_memory=false" in n for n in kept.notes)
    assert not any("release_freed_memory" in n for n in released.notes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the policy is for CPU runs; this run would pick CUDA")
@pytest.mark.parametrize(
    "setting,fit,applied",
    [
        ("true", (1, 100), True),
        ("false", (90, 100), False),
        ("auto", (90, 100), True),  # memory binds: the estimate is over half the free memory
        ("auto", (10, 100), False),  # plenty of room: no page-fault cost
        ("auto", None, True),  # memory_check=skip: nothing known, be safe
    ],
)
def test_a_cpu_run_sets_the_allocator_policy_before_loading_the_model(monkeypatch, tmp_path, setting, fit, applied):
    import rlvr.train

    calls = []

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(memory, "release_freed_memory", lambda: calls.append("policy"))
    monkeypatch.setattr(memory, "check_fits", lambda *a, **k: fit)
    monkeypatch.setattr(rlvr.train, "load_tokenizer", stop)  # the next step of setup: nothing is loaded
    cfg = load_config(None, [f"log.output_dir={tmp_path}", f"train.release_freed_memory={setting}"])
    with pytest.raises(Stop):
        rlvr.train.setup(cfg)
    assert calls == (["policy"] if applied else [])


def test_training_state_counts_parameters_gradients_and_optimizer_state_by_hand():
    """Bytes by hand: a float32 Linear(4, 3) that trains and a frozen bfloat16 Linear(3, 2), tied nowhere; AdamW
    after one step keeps exp_avg and exp_avg_sq like each trainable parameter, plus a 0-d float32 step count."""
    from rlvr.memory import GIB, training_state

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16).requires_grad_(False))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=False)
    out = model[1](model[0](torch.ones(2, 4)).to(torch.bfloat16)).float().sum()
    out.backward()
    opt.step()
    got = {k: v * GIB for k, v in training_state(model, opt).items()}
    assert got["memory/state_params"] == (12 + 3) * 4 + (6 + 2) * 2
    assert got["memory/state_grads"] == (12 + 3) * 4
    assert got["memory/state_optimizer"] == 2 * (12 + 3) * 4 + 2 * 4
    assert got["memory/state_in_files"] == 0
    tied = torch.nn.Linear(3, 3, bias=False)
    twice = torch.nn.ModuleList([tied, tied])  # the same weight reached twice is held once
    assert training_state(twice, torch.optim.AdamW(twice.parameters()))["memory/state_params"] * GIB == 9 * 4


def test_training_state_moves_what_the_offloads_keep_in_files(tmp_path):
    from rlvr.memory import GIB, training_state
    from rlvr.offload import DiskAdamW

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16).requires_grad_(False))
    trainable = [p for p in model.parameters() if p.requires_grad]
    for grads_path, held, filed in ((None, (12 + 3) * 4, 2 * (12 + 3) * 4), (tmp_path / "g", 0, 3 * (12 + 3) * 4)):
        opt = DiskAdamW(trainable, tmp_path / "m", grads_path=grads_path)
        model[1](model[0](torch.ones(2, 4)).to(torch.bfloat16)).float().sum().backward()
        opt.step()
        got = {k: v * GIB for k, v in training_state(model, opt).items()}
        assert got["memory/state_grads"] == held and got["memory/state_in_files"] == filed
        assert got["memory/state_optimizer"] == 2 * 4  # the step counters only
        opt.zero_grad()
        opt.close()
