"""Memory: peak per phase during a run (``memory/peak_<phase>``), and a plan before it (``rlvr plan``).

Measured peaks: on CUDA ``torch.cuda.max_memory_allocated`` (reset at each phase start); on Linux CPU the
process's peak resident set (``VmHWM``), reset at each phase start through ``/proc/self/clear_refs``;
elsewhere the lifetime peak RSS from ``getrusage`` (then the per-phase figures never go down).

The plan is arithmetic on the config and the model's ``config.json`` (no weights are loaded). Every term
is named in the table it prints. Activation bytes per token and layer are coefficients measured with
saved-tensor hooks on transformers' Llama/Qwen3 layers (bfloat16, SDPA attention), scaled with the dtype:
without checkpointing 16 H + 8 I + 15 Q bytes (full fine-tuning) or 29 H + 10 I + 16 Q (LoRA, whose
adapters save their inputs), H hidden, I MLP width, Q = heads x head_dim; with checkpointing 2 H (the
layer input) plus one layer recomputed in backward.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

from rlvr.diagnostics.sinks import PhaseTimer
from rlvr.config import Config, attention_implementation
from rlvr.core.lm_head import HEAD_CHUNK_ELEMENTS, HEAD_KEEP_ELEMENTS
from rlvr.errors import UserError
from rlvr.offload import CHUNK_ELEMENTS, DiskAdamW

GIB = 1024**3
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Interpreter, torch, transformers, peft, tokenizer and the run's Python objects: the RSS of `rlvr train`
# on CPU less its tensors (0.5 GiB measured by benchmarks/memory.py); not counted on CUDA, where only
# tensors are.
CPU_RUNTIME_BYTES = int(0.5 * GIB)
# The chunked head's forward holds about 4.5 float32 [chunk, V] buffers at its peak (the scaled logits,
# logsumexp's temporaries, the entropy's probabilities), measured through VmHWM; backward about 2.5.
HEAD_WORK_BUFFERS = 4.5
LORA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---------------------------------------------------------------------------------- measured peaks


def _read_hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
        return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux >= 4.0: reset the peak RSS to the current RSS
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak bytes since the last ``reset()``: allocated tensors on CUDA, resident set on CPU."""

    def __init__(self, device: torch.device | None = None):
        self.cuda = (device.type == "cuda") if device is not None else torch.cuda.is_available()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            _reset_hwm()

    def peak(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated()
        hwm = _read_hwm()
        if hwm is not None:
            return hwm
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


class PhaseMeter(PhaseTimer):
    """``timing/<phase>`` (seconds) and ``memory/peak_<phase>`` (GiB) per named phase; ``memory/peak`` is the
    largest of them. A drop-in for PhaseTimer."""

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__()
        self.memory = PeakMemory(device)
        self.peaks: dict[str, int] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self.memory.reset()
        try:
            with super().__call__(phase):
                yield
        finally:
            self.peaks[phase] = max(self.peaks.get(phase, 0), self.memory.peak())

    def pop(self) -> dict[str, float]:
        out = super().pop()
        out.update({f"memory/peak_{k}": v / GIB for k, v in self.peaks.items()})
        if self.peaks:
            out["memory/peak"] = max(self.peaks.values()) / GIB
        self.peaks = {}
        return out


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes this process holds for ``t``: a DTensor's local shard; a tensor subclass (torchao's 8-bit optimizer
    state) by the plain tensors it is made of."""
    if hasattr(t, "to_local"):
        t = t.to_local()
    if hasattr(t, "__tensor_flatten__"):  # only subclasses define it: plain tensors and parameters do not
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """GiB this process holds for training, by kind (its shards under FSDP, a full copy under DDP): parameters,
    their gradients (as backward allocates them: one per trainable parameter, in its dtype and sharding; freed
    between steps) and the optimizer's state. What sharding divides; activations, the rollout and the runtime
    are in ``memory/peak_*``."""
    params = list(model.parameters())  # tied weights once
    state = [v for per_param in optimizer.state.values() for v in per_param.values() if isinstance(v, torch.Tensor)]
    grads = sum(_tensor_bytes(p) for p in params if p.requires_grad)
    files = 0  # train.optim_offload / grad_offload: moments and gradients kept in files, not held
    if isinstance(optimizer, DiskAdamW):
        files = optimizer.nbytes + (grads if optimizer.grads_path is not None else 0)
        grads = 0 if optimizer.grads_path is not None else grads
    return {
        "memory/state_params": sum(_tensor_bytes(p) for p in params) / GIB,
        "memory/state_grads": grads / GIB,
        "memory/state_optimizer": sum(_tensor_bytes(v) for v in state) / GIB,
        "memory/state_in_files": files / GIB,
    }


# Allocations over this size are mapped from the system and unmapped when freed (glibc's initial default,
# which it otherwise raises to the largest block freed so far, up to 32 MiB, and then keeps such blocks).
MMAP_THRESHOLD_BYTES = 128 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def release_freed_memory() -> bool:
    """Make glibc return freed blocks over 128 KiB to the system instead of keeping them in its heap.

    A training step frees and allocates many activation-sized blocks (MiB to tens of MiB); with glibc's
    dynamic threshold those are served from the heap, and freed ones stay resident, so the process's peak
    is the heap's high-water mark rather than the tensors alive (measured 1.53 vs 0.92 GiB on the small
    benchmark step). Fixing the threshold costs a page fault per fresh page of each large allocation. Not
    applied when the user set MALLOC_MMAP_THRESHOLD_ (glibc reads it at start-up), nor off glibc.
    Returns whether the policy was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries: no mallopt
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


# ---------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def from_hf_config(cls, c) -> "ModelShape":
        c = getattr(c, "text_config", None) or c
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(
            c.vocab_size,
            c.hidden_size,
            c.num_hidden_layers,
            c.intermediate_size,
            c.num_attention_heads,
            getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim,
            bool(getattr(c, "tie_word_embeddings", False)),
        )

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear of one decoder layer."""
        H, Q, K, I = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {
            "q_proj": (H, Q),
            "k_proj": (H, K),
            "v_proj": (H, K),
            "o_proj": (Q, H),
            "gate_proj": (H, I),
            "up_proj": (H, I),
            "down_proj": (I, H),
        }

    @property
    def num_params(self) -> int:
        per_layer = sum(i * o for i, o in self.linears().values()) + 2 * self.hidden + 2 * self.head_dim
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + head + self.layers * per_layer + self.hidden

    def lora_params(self, r: int, targets: list[str] | str) -> int:
        names = LORA_LINEARS if targets == "all-linear" else [t for t in targets if t in LORA_LINEARS]
        return self.layers * sum(r * (i + o) for n, (i, o) in self.linears().items() if n in names)


def model_shape(path: str, trust_remote_code: bool = False) -> ModelShape:
    """The model's shape from its config.json alone (no weights read)."""
    from transformers import AutoConfig

    from rlvr.builders import cannot_load, resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(path), trust_remote_code=trust_remote_code)
    except OSError as e:  # the same message the model loader would give, before any weights are read
        raise cannot_load("the config of", path, e) from None
    return ModelShape.from_hf_config(config)


@dataclass
class Plan:
    device: str
    resident: dict[str, int]  # alive in every phase (after the first optimizer step)
    phases: dict[str, dict[str, int]]  # extra bytes alive at each phase's peak
    notes: list[str] = field(default_factory=list)

    def phase_peak(self, phase: str) -> int:
        return sum(self.resident.values()) + sum(self.phases[phase].values())

    @property
    def peak(self) -> int:
        return max(self.phase_peak(p) for p in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_peak)


def estimate(cfg: Config, shape: ModelShape, device: str = "cpu", prompt_tokens: int | None = None) -> Plan:
    """Bytes per phase for one generation batch of ``cfg`` on ``shape`` (see the module docstring)."""
    b = _BYTES[cfg.model.dtype]
    lora, t, r = cfg.model.lora, cfg.train, cfg.rollout
    P = prompt_tokens or r.max_prompt_length or 256
    S = P + r.max_completion_length  # scored sequence length
    N, mb = cfg.generation_batch_size, min(t.per_device_train_batch_size, cfg.generation_batch_size)
    H, I, Q, L, V = shape.hidden, shape.intermediate, shape.heads * shape.head_dim, shape.layers, shape.vocab
    params = shape.num_params
    adapter = shape.lora_params(lora.r, lora.target_modules) if lora.enabled else 0
    trainable, tb = (adapter, 4) if lora.enabled else (params, b)  # peft keeps adapters in float32
    resident = {"runtime": CPU_RUNTIME_BYTES if device == "cpu" else 0, "weights": params * b}
    if lora.enabled:
        resident["adapter"] = adapter * 4
    parked_ref = cfg.algo.beta > 0 and not lora.enabled and t.ref_offload  # in memory for its own pass only
    if cfg.algo.beta > 0 and not lora.enabled and not parked_ref:
        resident["reference model"] = params * b
    if t.optim == "adamw_torch_8bit":  # torchao: 1 byte per moment plus one float32 scale per 256-block
        resident["optimizer state (8-bit AdamW m, v)"] = int(2 * trainable * (1 + 4 / 256))
    elif t.optim_offload:  # rlvr.offload: the moments are in a file, two chunks of them staged
        resident["AdamW staging (optim_offload)"] = 2 * min(trainable, CHUNK_ELEMENTS) * tb
    else:
        resident["optimizer state (AdamW m, v)"] = 2 * trainable * tb

    chunk_rows = max(1, HEAD_CHUNK_ELEMENTS // V)
    head_buffers = int(HEAD_WORK_BUFFERS * min(chunk_rows, mb * (r.max_completion_length + 1)) * V * 4)

    kv = N * S * L * 2 * shape.kv_heads * shape.head_dim * b
    rollout = {"KV cache": kv, "sampling buffers": 3 * N * V * 4}
    if device == "cpu" and not lora.enabled and r.backend == "native":
        # The PyTorch decoder concatenates q|k|v and gate|up weights once per generate call on CPU.
        rollout["fused q|k|v, gate|up copies"] = L * H * (Q + 2 * shape.kv_heads * shape.head_dim + 2 * I) * b
        if t.mixed_precision == "bf16":
            # Where the CPU has AVX512-BF16 the C kernel samples from bf16 copies of every projection and the head
            # (rlvr.rollout.cpu_kernel.pack_bf16); the plan does not probe the CPU, so it counts the larger copy.
            bf16_copies = (L * sum(i * o for i, o in shape.linears().values()) + V * H) * 2
            if bf16_copies > rollout["fused q|k|v, gate|up copies"]:
                del rollout["fused q|k|v, gate|up copies"]
                rollout["bf16 weight copies (C kernel)"] = bf16_copies

    per_layer = (29 * H + 10 * I + 16 * Q) if lora.enabled else (16 * H + 8 * I + 15 * Q)
    per_layer = per_layer * b // 2
    tokens = mb * S
    if cfg.model.gradient_checkpointing:
        acts = tokens * (L * 2 * H * b // 2 + per_layer + 8 * H)
    else:
        acts = tokens * (L * per_layer + 8 * H)
    update = {"activations": acts, "log-prob head": head_buffers, "gradients": trainable * tb}
    if attention_implementation(cfg, device, H) == "eager":  # probabilities kept for backward: float32 (+ 16-bit)
        prob_bytes = 6 if (b == 2 or t.mixed_precision == "bf16") else 4
        kept_layers = 1 if cfg.model.gradient_checkpointing else L
        update["attention probabilities (eager)"] = kept_layers * mb * shape.heads * S * S * prob_bytes
    if t.grad_offload:  # rlvr.offload: gradients go to a file as autograd makes them, one parameter at a time
        del update["gradients"]
        update["largest gradient (grad_offload)"] = min(trainable, max(V, I) * H) * tb
    kept = mb * r.max_completion_length * V  # small enough: the head keeps its probabilities for backward
    if kept <= HEAD_KEEP_ELEMENTS:
        update["log-prob head: kept probabilities"] = kept * 4
    if not lora.enabled:
        if b == 2 and H > chunk_rows:  # rlvr.core.lm_head: by vocabulary block, no float32 [V, H] buffer
            update["head weight gradient (16-bit)"] = V * H * b
        else:
            update["head weight gradient (float32)"] = V * H * 4

    phases = {"rollout": rollout, "update": update}
    from rlvr.rollout import engine_class

    live = engine_class(r.backend, r.engine_options).samples_live_policy
    needs_old = (
        cfg.algo.num_iterations > 1 or t.micro_batches_per_generation > t.gradient_accumulation_steps or not live
    )  # as train.logprobs decides
    if needs_old or cfg.algo.beta > 0:
        phases["logprobs"] = {"one layer's activations": tokens * (4 * H + 3 * I) * b, "log-prob head": head_buffers}
        if parked_ref:
            phases["logprobs"]["reference (ref_offload)"] = params * b
    notes = [
        f"assumes prompts of {P} tokens (rollout.max_prompt_length or the plan's --prompt-tokens), "
        f"completions of {r.max_completion_length}, {N} completions per generation batch, micro-batches of {mb}"
    ]
    if t.optim_offload:
        where = t.optim_offload_dir or cfg.log.output_dir
        files = f"AdamW's moments, {2 * trainable * tb / GIB:.2f} GiB" + (
            f", and the gradients, {trainable * tb / GIB:.2f} GiB," if t.grad_offload else ""
        )
        notes.append(f"train.optim_offload: {files} are files in {where}")
    if device == "cpu" and t.release_freed_memory is not True:
        notes.append(
            f"train.release_freed_memory={str(t.release_freed_memory).lower()}: unless it is applied (auto: when "
            "this peak is over half the free memory), the C heap's retained freed blocks are not in this "
            "estimate and the measured peak can be up to ~0.6 GiB above it"
        )
    return Plan(device, resident, phases, notes)


def device_free_memory(device: str) -> tuple[int, str]:
    """(free bytes, what was measured) on the device the run would use."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return free, "CUDA free memory"
    try:
        import psutil

        return psutil.virtual_memory().available, "available host memory"
    except ImportError:
        with open("/proc/meminfo") as f:
            m = re.search(r"MemAvailable:\s+(\d+) kB", f.read())
        return int(m.group(1)) * 1024, "available host memory"


def format_plan(plan: Plan, free: int | None = None, free_what: str = "") -> str:
    gib = lambda n: f"{n / GIB:8.2f}"  # noqa: E731
    lines = [f"memory plan ({plan.device}), GiB", "  resident in every phase:"]
    lines += [f"    {k:<34}{gib(v)}" for k, v in plan.resident.items()]
    lines.append(f"    {'total resident':<34}{gib(sum(plan.resident.values()))}")
    for phase, parts in plan.phases.items():
        lines.append(f"  {phase}:")
        lines += [f"    + {k:<32}{gib(v)}" for k, v in parts.items()]
        lines.append(f"    = {'peak of ' + phase:<32}{gib(plan.phase_peak(phase))}")
    lines.append(f"  estimated peak ({plan.peak_phase}):{'':<13}{gib(plan.peak)}")
    if free is not None:
        verdict = "fits" if plan.peak <= free else "DOES NOT FIT"
        lines.append(f"  {free_what}:{'':<{max(1, 34 - len(free_what))}}{gib(free)}   -> {verdict}")
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _with(cfg: Config, changes: dict[str, object]) -> Config | None:
    """cfg with dotted keys changed, or None when that config is not valid."""
    d = cfg.model_dump()
    for key, value in changes.items():
        node = d
        *head, last = key.split(".")
        for part in head:
            node = node[part]
        node[last] = value
    try:
        return Config.model_validate(d)
    except ValueError:
        return None


def _half_micro_batch(cfg: Config) -> dict[str, object] | None:
    t = cfg.train
    if t.per_device_train_batch_size < 2 or t.per_device_train_batch_size % 2:
        return None
    return {
        "train.per_device_train_batch_size": t.per_device_train_batch_size // 2,
        "train.gradient_accumulation_steps": t.gradient_accumulation_steps * 2,
        "train.steps_per_generation": t.micro_batches_per_generation * 2,
    }


# Knobs tried in this order (cheapest in effect on the result first): name, cost, the change or None.
_KNOBS = [
    (
        "gradient checkpointing",
        "~30% more update compute, same result",
        lambda c: None if c.model.gradient_checkpointing else {"model.gradient_checkpointing": True},
    ),
    (
        "SDPA attention",
        "no attention probabilities kept for backward; same result, slower attention for small models on CPU",
        lambda c: None if c.model.attn_implementation == "sdpa" else {"model.attn_implementation": "sdpa"},
    ),
    ("smaller micro-batches", "more, smaller passes; same gradient per optimizer step", _half_micro_batch),
    (
        "AdamW moments in a file",
        "the same update; each optimizer step reads and writes 4x the trainable weights' bytes (rlvr.offload)",
        lambda c: None if c.model.lora.enabled or c.train.optim_offload else {"train.optim_offload": True},
    ),
    (
        "gradients in a file",
        "the same update; every micro-batch reads and writes the gradients once (rlvr.offload; one process)",
        lambda c: (
            None if c.model.lora.enabled or c.train.grad_offload or int(os.environ.get("WORLD_SIZE", "1")) > 1
            else {"train.grad_offload": True, "train.optim_offload": True}
        ),
    ),
    (
        "reference weights in a file",
        "the same log-probs; the reference is read back once per generation batch (rlvr.offload)",
        lambda c: (
            None if c.algo.beta == 0 or c.model.lora.enabled or c.train.ref_offload else {"train.ref_offload": True}
        ),
    ),
    (
        "bfloat16 weights",
        "bf16 weights, gradients and Adam state",
        lambda c: {"model.dtype": "bfloat16"} if c.model.dtype == "float32" else None,
    ),
    (
        "8-bit Adam state (torchao)",
        "half the state of bf16 AdamW, a quarter of fp32; compiled per parameter shape",
        lambda c: (
            None if c.model.lora.enabled or c.train.optim == "adamw_torch_8bit" else {"train.optim": "adamw_torch_8bit"}
        ),
    ),
    (
        "LoRA",
        "trains an adapter, not the weights: a different (smaller) update",
        lambda c: None if c.model.lora.enabled else {"model.lora.enabled": True},
    ),
]


def knobs_to_fit(cfg: Config, shape: ModelShape, device: str, free: int, prompt_tokens: int | None = None) -> list[str]:
    """Knobs applied cumulatively in the order above, as long as each lowers the estimate, until it fits:
    one line per knob with its settings, its cost and the estimated peak once it (and those before) are set."""
    out, cur = [], cfg
    peak = estimate(cur, shape, device, prompt_tokens).peak
    for name, cost, change_of in _KNOBS:
        changes: dict[str, object] = {}
        while peak > free and (change := change_of(cur)) is not None:
            nxt = _with(cur, change)
            nxt_peak = estimate(nxt, shape, device, prompt_tokens).peak if nxt is not None else peak
            if nxt_peak > 0.98 * peak:  # a step that saves under 2% is not worth its cost
                break
            cur, peak = nxt, nxt_peak
            changes.update(change)
        if changes:
            settings = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items())
            out.append(f"{settings}  ({name}: {cost}) -> estimated peak {peak / GIB:.2f} GiB")
        if peak <= free:
            return out
    out.append("still over: a smaller model, shorter completions or fewer completions per generation batch")
    return out


class MemoryPlanError(UserError, MemoryError):
    """The plan says the run will not fit: an expected failure (one ``error:`` message, the plan table in
    it), and a MemoryError for code that catches those."""


def heap_release_wanted(setting: bool | str, estimate: tuple[int, int] | None) -> bool:
    """``train.release_freed_memory`` resolved. auto: when memory binds (the estimated peak over half the free
    memory), where the heap's retained blocks could decide between fitting and not; elsewhere the page
    faults of unmapped blocks would only cost time. ``estimate``: (peak, free) bytes, None when unchecked."""
    if setting != "auto":
        return bool(setting)
    return estimate is None or estimate[0] > estimate[1] // 2


def check_fits(cfg: Config, device: torch.device, prompt_tokens: int | None = None) -> tuple[int, int] | None:
    """Raise MemoryError with the plan and the knobs that would fit when the estimate exceeds free memory;
    else return (estimated peak, free) in bytes (None with ``train.memory_check=skip``)."""
    if cfg.train.memory_check == "skip":
        return None
    shape = model_shape(cfg.model.path, cfg.model.trust_remote_code)
    kind = "cuda" if device.type == "cuda" else "cpu"
    plan = estimate(cfg, shape, kind, prompt_tokens)
    free, what = device_free_memory(kind)
    if kind == "cpu":  # processes of one torchrun host share its memory: each gets its share
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        free, what = free // local, (what if local == 1 else f"{what} / {local} local processes")
    if plan.peak <= free:
        return plan.peak, free
    msg = (
        f"the memory plan estimates a peak of {plan.peak / GIB:.2f} GiB, over the {free / GIB:.2f} GiB of "
        f"{what}.\n{format_plan(plan, free, what)}\nknobs that would make it fit:\n  "
        + "\n  ".join(knobs_to_fit(cfg, shape, kind, free, prompt_tokens))
        + "\nSet train.memory_check=warn to run anyway (or skip to not check)."
    )
    if cfg.train.memory_check == "warn":
        warnings.warn(msg, stacklevel=2)  # the run's console shows rlvr's warnings
        return plan.peak, free
    raise MemoryPlanError(msg)


__all__ = [
    "MemoryPlanError",
    "PeakMemory",
    "PhaseMeter",
    "ModelShape",
    "Plan",
    "estimate",
    "format_plan",
    "knobs_to_fit",
    "check_fits",
    "model_shape",
    "device_free_memory",
    "release_freed_memory",
    "heap_release_wanted",
    "training_state",
]
