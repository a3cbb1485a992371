"""The optimizer the config names: fused AdamW by default (transformers' and TRL's default), the same update as
the per-parameter loop to float32 rounding."""

from __future__ import annotations

import torch

from rlvr.builders import build_optimizer
from rlvr.config import load_config


def _trained(optim: str, steps: int = 5) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Tanh(), torch.nn.Linear(48, 8))
    opt = build_optimizer(load_config(None, [f"train.optim={optim}", "train.weight_decay=0.1"]), model)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return opt, [p.detach().clone() for p in model.parameters()]


def test_default_is_the_fused_kernel_and_loop_is_not():
    fused, _ = _trained("adamw_torch_fused", steps=1)
    loop, _ = _trained("adamw_torch", steps=1)
    assert load_config(None, []).train.optim == "adamw_torch_fused"
    assert fused.defaults["fused"] is True
    assert not loop.defaults.get("fused")


def test_fused_and_loop_give_the_same_weights_to_float32_rounding():
    _, fused_w = _trained("adamw_torch_fused")
    _, loop_w = _trained("adamw_torch")
    _, start = _trained("adamw_torch", steps=0)
    for f, l, s in zip(fused_w, loop_w, start):
        moved = (l - s).abs().max()
        assert moved > 1e-3  # the steps did something
        # Each step moves a weight by ~lr; fused and loop evaluate the same formula in another order.
        assert torch.allclose(f, l, rtol=0, atol=8 * torch.finfo(torch.float32).eps * float(s.abs().max() + moved))


def test_an_optimizer_that_keeps_its_learning_rate_as_a_tensor_logs_a_number(
    tiny_model_dir, sum_dataset, tmp_path, monkeypatch
):
    """torchao's AdamW8bit (train.optim=adamw_torch_8bit) stores lr as a 0-d tensor so that its compiled step does
    not recompile when the schedule moves it; the scheduler then reports a tensor, which the metrics line must
    turn into a number (it once crashed the run's first log after a whole 1.7B step)."""
    from smoke_config import smoke_overrides
    from test_smoke import read_jsonl

    from rlvr import train as train_module

    def tensor_lr(cfg, model, *_placement):
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=torch.tensor(cfg.train.learning_rate), foreach=False)

    monkeypatch.setattr(train_module, "build_optimizer", tensor_lr)
    out = tmp_path / "run"
    train_module.train(load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, out, "train.max_steps=2")))
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    assert all(type(m["learning_rate"]) is float and m["learning_rate"] > 0 for m in lines)
