"""train.optim_offload (AdamW's moments in a file), train.grad_offload (the gradients too) and train.ref_offload (the
reference weights in a file between reference passes): the same numbers as in memory, bitwise, and the files
cleaned up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from smoke_config import smoke_overrides

from rlvr.config import ConfigError, load_config
from rlvr.offload import DiskAdamW, ParkedWeights, loaded, park
from rlvr.train import train

SETTINGS = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def _net(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)  # sizes 32*48, 48, 48*9, 9: none a multiple of the 64-element chunks below
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Tanh(), torch.nn.Linear(48, 9)).to(dtype)


def _steps(net: torch.nn.Module, opt: torch.optim.Optimizer, dtype: torch.dtype, steps: int = 5) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        net(torch.randn(16, 32, generator=gen).to(dtype)).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused", [True, False])
def test_disk_adamw_is_bitwise_torch_adamw(tmp_path, dtype, fused):
    ref_net, net = _net(dtype), _net(dtype)
    ref_opt = torch.optim.AdamW(ref_net.parameters(), **SETTINGS, fused=fused)
    # 64-element chunks: every parameter is streamed in several slices, the last one partial.
    opt = DiskAdamW(net.parameters(), tmp_path / "m.bin", **SETTINGS, fused=fused, chunk_elements=64)
    _steps(ref_net, ref_opt, dtype)
    _steps(net, opt, dtype)
    start = _net(dtype)
    for p_ref, p, p0 in zip(ref_net.parameters(), net.parameters(), start.parameters()):
        assert not torch.equal(p_ref, p0)  # the steps moved the weights
        assert torch.equal(p_ref, p)
        m, v = opt.moments(p)
        assert torch.equal(m, ref_opt.state[p_ref]["exp_avg"]) and torch.equal(v, ref_opt.state[p_ref]["exp_avg_sq"])
        assert float(opt.state[p]["step"]) == float(ref_opt.state[p_ref]["step"]) == 5
        assert set(opt.state[p]) == {"step"}  # nothing but the step counter stays in memory
    opt.close()
    assert not (tmp_path / "m.bin").exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused", [True, False])
def test_gradients_in_a_file_accumulate_clip_and_step_bitwise_as_in_memory(tmp_path, dtype, fused):
    ref_net, net = _net(dtype), _net(dtype)
    ref_opt = torch.optim.AdamW(ref_net.parameters(), **SETTINGS, fused=fused)
    opt = DiskAdamW(
        net.parameters(), tmp_path / "m.bin", **SETTINGS, fused=fused, chunk_elements=64, grads_path=tmp_path / "g.bin"
    )
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):  # optimizer steps of 3 accumulated micro-batches, clipped (the norms are ~0.08)
        xs = [torch.randn(16, 32, generator=gen).to(dtype) for _ in range(3)]
        for x in xs:
            (ref_net(x).float().pow(2).mean() / 3).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref_net.parameters(), 0.05)
        ref_opt.step()
        ref_opt.zero_grad()
        for x in xs:
            (net(x).float().pow(2).mean() / 3).backward()
            assert all(p.grad is None for p in net.parameters())  # filed as autograd accumulated it
        norm = opt.clip_grad_norm_(0.05)
        opt.step()
        opt.zero_grad()
        assert float(ref_norm) > 0.05 and torch.equal(norm, ref_norm)
    assert all(torch.equal(a, b) for a, b in zip(ref_net.parameters(), net.parameters()))
    opt.close()
    assert list(tmp_path.iterdir()) == []


def test_disk_adamw_differs_when_it_should(tmp_path):
    """The comparison above can fail: another beta2 gives other weights."""
    ref_net, net = _net(torch.float32), _net(torch.float32)
    ref_opt = torch.optim.AdamW(ref_net.parameters(), **SETTINGS)
    opt = DiskAdamW(net.parameters(), tmp_path / "m.bin", **{**SETTINGS, "betas": (0.9, 0.98)}, chunk_elements=64)
    _steps(ref_net, ref_opt, torch.float32)
    _steps(net, opt, torch.float32)
    assert not all(torch.equal(a, b) for a, b in zip(ref_net.parameters(), net.parameters()))


def test_chunks_must_start_on_whole_vectors(tmp_path):
    with pytest.raises(ValueError, match="multiple of 64"):
        DiskAdamW(_net(torch.float32).parameters(), tmp_path / "m.bin", chunk_elements=100)


def test_moments_round_trip_through_a_checkpoint_copy(tmp_path):
    net = _net(torch.float32)
    opt = DiskAdamW(net.parameters(), tmp_path / "a.bin", **SETTINGS, chunk_elements=64)
    _steps(net, opt, torch.float32, steps=2)
    opt.save_moments(tmp_path / "saved.bin")
    fresh = DiskAdamW(net.parameters(), tmp_path / "b.bin", **SETTINGS, chunk_elements=64)
    p = next(net.parameters())
    assert not fresh.moments(p)[0].any()  # a new file reads as zero moments
    fresh.load_moments(tmp_path / "saved.bin")
    assert torch.equal(fresh.moments(p)[0], opt.moments(p)[0]) and opt.moments(p)[0].any()
    other = DiskAdamW(torch.nn.Linear(3, 3).parameters(), tmp_path / "c.bin")
    with pytest.raises(ValueError, match="another model"):
        other.load_moments(tmp_path / "saved.bin")


def test_parked_weights_come_back_bitwise_for_the_block_only(tmp_path):
    net = _net(torch.float32).requires_grad_(False)
    shared = torch.nn.Parameter(torch.randn(9, 48), requires_grad=False)
    net[2].weight = shared
    extra = torch.nn.Linear(48, 9, bias=False).requires_grad_(False)
    extra.weight = shared  # tied: one Parameter in two modules
    holder = torch.nn.ModuleList([net, extra])
    before = {n: p.clone() for n, p in holder.named_parameters(remove_duplicate=False)}
    x = torch.randn(4, 32)
    out = net(x)
    park(holder, tmp_path / "ref.bin")
    assert all(p.numel() == 0 for p in holder.parameters())  # nothing held between passes
    with loaded(holder):
        assert all(torch.equal(p, before[n]) for n, p in holder.named_parameters(remove_duplicate=False))
        assert extra.weight is net[2].weight
        assert torch.equal(net(x), out)
    assert all(p.numel() == 0 for p in holder.parameters())
    with loaded(torch.nn.Linear(2, 2)):  # a module never parked is simply used
        pass


def test_parking_a_trainable_module_is_refused(tmp_path):
    with pytest.raises(ValueError, match="frozen"):
        ParkedWeights(torch.nn.Linear(2, 2), tmp_path / "x.bin")


def test_offload_settings_that_cannot_combine_are_refused():
    with pytest.raises(ConfigError, match="choose one"):
        load_config(None, ["train.optim_offload=true", "train.optim=adamw_torch_8bit"])
    with pytest.raises(ConfigError, match="set train.optim_offload=true too"):
        load_config(None, ["train.grad_offload=true"])
    with pytest.raises(ConfigError, match="shards them"):
        load_config(None, ["train.ref_offload=true", "train.parallelism=fsdp"])


def _run(model_dir: Path, data: Path, out: Path, *extra: str) -> dict[str, torch.Tensor]:
    common = ("algo.beta=0.04", "train.lr_scheduler_type=constant", "train.weight_decay=0.1")
    train(load_config(None, smoke_overrides(model_dir, data, out, *common, *extra)))
    return load_file(str(out / "final" / "model.safetensors"))


def test_a_run_with_every_offload_ends_on_the_same_weights(tiny_model_dir, sum_dataset, tmp_path):
    accumulate = (
        "train.per_device_train_batch_size=8",
        "train.gradient_accumulation_steps=2",
        "train.max_grad_norm=0.05",
    )
    plain = _run(tiny_model_dir, sum_dataset, tmp_path / "plain", *accumulate)
    scratch = tmp_path / "scratch"
    offloaded = _run(
        tiny_model_dir,
        sum_dataset,
        tmp_path / "off",
        *accumulate,
        "train.optim_offload=true",
        "train.grad_offload=true",
        "train.ref_offload=true",
        f"train.optim_offload_dir={scratch}",
    )
    norms = {
        run: [json.loads(ln)["grad_norm"] for ln in (tmp_path / run / "metrics.jsonl").open()]
        for run in ("plain", "off")
    }
    assert norms["off"] == norms["plain"] and min(norms["off"]) > 0.05  # clipping was active, and measured the same
    assert plain.keys() == offloaded.keys()
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(plain[k], start[k]) for k in plain if k in start)  # training moved the weights
    assert all(torch.equal(plain[k], offloaded[k]) for k in plain)
    assert list(scratch.iterdir()) == []  # the moments, gradients and reference files removed at the end
    assert (tmp_path / "off" / "checkpoints" / "step-000003" / "optimizer-moments.bin").exists()


def test_an_offloaded_run_resumes_to_the_same_weights(tiny_model_dir, sum_dataset, tmp_path):
    off = ("train.optim_offload=true", "train.grad_offload=true", "log.save_steps=1")
    straight = _run(tiny_model_dir, sum_dataset, tmp_path / "straight", *off, "train.max_steps=4")
    _run(tiny_model_dir, sum_dataset, tmp_path / "resumed", *off, "train.max_steps=2")
    resumed = _run(tiny_model_dir, sum_dataset, tmp_path / "resumed", *off, "train.max_steps=4", "resume=true")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    with pytest.raises(ValueError, match="train.optim_offload=true"):
        _run(tiny_model_dir, sum_dataset, tmp_path / "resumed", "train.max_steps=5", "resume=true")
