"""The pieces the loop in train.py is assembled from: model, optimizer, schedule, run folder, logs.

Plain constructors, no registries (DESIGN.md §3): anyone copying the loop can swap one of these.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from rlvr.config import Config, dump_config

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(path: str) -> str:
    if path == "tiny":
        from rlvr.models import tiny_model_path

        return str(tiny_model_path())
    return path


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path(path))
    if tok.pad_token is None:  # many base models ship without one; pad positions are masked anyway
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: Config, device: torch.device, trainable: bool = True) -> torch.nn.Module:
    """A Hugging Face causal LM from a local folder, the shipped tiny model, or the hub."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(cfg.model.path)
    kwargs: dict[str, Any] = {"dtype": _DTYPES[cfg.model.dtype], "trust_remote_code": cfg.model.trust_remote_code}
    if cfg.model.attn_implementation:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as e:
        raise OSError(
            f"cannot load model {cfg.model.path!r}: {e}\nGive a local folder with config.json and weights, "
            "'tiny' for the shipped model, or a hub id on a machine that can reach the hub."
        ) from None
    model.to(device)
    if not trainable:
        model.eval().requires_grad_(False)
        return model
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.model.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lc = cfg.model.lora
        model = get_peft_model(model, LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                                                 target_modules=lc.target_modules, task_type="CAUSAL_LM"))
    model.train()
    return model


def build_optimizer(cfg: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    t = cfg.train
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_epsilon,
                  weight_decay=t.weight_decay)
    if t.optim == "adamw_torch_8bit":  # 8-bit moments: 2 bytes/parameter of Adam state instead of 4 (bf16) or 8
        try:
            from torchao.optim import AdamW8bit
        except ImportError:
            raise ImportError("train.optim=adamw_torch_8bit needs torchao: `pip install torchao`, "
                              "or set train.optim=adamw_torch") from None
        return AdamW8bit(params, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


def build_scheduler(cfg: Config, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """Multiplier on the peak LR per optimizer step; a LambdaLR so its state is a plain step count."""
    total, kind = cfg.train.max_steps, cfg.train.lr_scheduler_type
    warmup = math.ceil(cfg.train.warmup_ratio * total)

    def factor(step: int) -> float:
        if kind != "constant" and step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------------
# Run folder
# ---------------------------------------------------------------------------------------------


def _git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_run_header(run_dir: Path, cfg: Config, extra: dict[str, Any]) -> None:
    import transformers

    import rlvr

    header = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "versions": {"rlvr": rlvr.__version__, "python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "git_revision": _git_revision(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "config": cfg.model_dump(mode="json"),
        **extra,
    }
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    (run_dir / "header.json").write_text(json.dumps(header, indent=2, default=str))


class MetricLogger:
    """metrics.jsonl (always), TensorBoard and W&B (when asked for)."""

    def __init__(self, run_dir: Path, cfg: Config):
        self.path = run_dir / "metrics.jsonl"
        self._tb = self._wandb = None
        if "tensorboard" in cfg.log.report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:
                print("[rlvr] tensorboard is not installed: `pip install tensorboard`, or set log.report_to=[]")
        if "wandb" in cfg.log.report_to:
            import wandb  # an explicit choice: fail loudly if it is missing

            self._wandb = wandb.init(project="rlvr", dir=str(run_dir), config=cfg.model_dump(mode="json"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class PhaseTimer:
    """Wall time per named phase; `timing/<phase>` in the logs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        out, self.seconds = {f"timing/{k}": v for k, v in self.seconds.items()}, {}
        return out
