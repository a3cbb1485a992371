"""Training state kept in files instead of memory: AdamW's moments (``train.optim_offload``), the gradients
(``train.grad_offload``) and a frozen reference model's weights between its passes (``train.ref_offload``).

Full fine-tuning holds the weights, their gradients and AdamW's two moments: with bf16 weights that is 2 + 2 + 4
bytes per parameter, and the moments are half of it (6.4 GiB of a 1.7B model's 12.8). They are touched once
per optimizer step, element by element, so they need not stay resident: ZeRO-Infinity (Rajbhandari et al.,
2021) keeps them on NVMe and streams them through the step. ``DiskAdamW`` does that on one machine: the
moments of every parameter sit in one file; a step reads them in chunks of ``CHUNK_ELEMENTS`` into two
staging buffers, applies PyTorch's own AdamW to that slice of the parameter (the fused kernel, or the
per-parameter loop), and writes them back. The update is elementwise, so slicing changes nothing: the weights
are bitwise those of ``torch.optim.AdamW`` with the same settings (tested).

Cost: each step reads and writes the moments once (2 x 2 x 4 bytes per parameter for bf16, twice that
for float32): ~13 GiB of I/O for a 1.7B model, which the page cache absorbs when memory is free and an
NVMe disk serves in seconds when it is not; a 1.7B step on a CPU takes minutes. Memory saved: the moments,
less two chunks of staging (``2 x CHUNK_ELEMENTS`` elements). The file is scratch: created sparse (reads as
zeros, as fresh moments are), removed when the run closes (a run that crashes leaves it; the next run in that
folder truncates it); checkpoints copy it (``save_moments``). Parameters on an accelerator are staged through
host memory, one chunk at a time.

The gradients and the reference weights follow the same pattern (``DiskAdamW``'s ``grads_path``,
``ParkedWeights``); the files go through the kernel's page cache, which is not the process's memory and which
the kernel writes back and reclaims under pressure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch
from torch.optim.adamw import adamw

# 16M elements: 32 MiB (bf16) or 64 MiB (float32) of staging per moment, large enough that a read is one
# sequential transfer, small next to any model worth offloading for.
CHUNK_ELEMENTS = 1 << 24


class DiskAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, no amsgrad) with its moments in ``path``; ``state`` holds only ``step``.

    ``grads_path``: the gradients live in a file too (``train.grad_offload``). A hook on every parameter adds
    each gradient autograd accumulates into the file and frees it, so micro-batches accumulate on disk with the
    same bf16/float32 additions ``.grad += g`` would make; ``clip_grad_norm_`` and ``step`` read them back.
    Between micro-batches only the parameter being accumulated has a gradient in memory.
    """

    def __init__(
        self,
        params,
        path: str | os.PathLike,
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool = False,
        chunk_elements: int = CHUNK_ELEMENTS,
        grads_path: str | os.PathLike | None = None,
    ):
        # PyTorch's vectorised kernels finish a tensor's last partial vector with scalar code; slices that start
        # on a multiple of 64 elements put every partial vector where the whole tensor has it (bitwise equal).
        if chunk_elements <= 0 or chunk_elements % 64:
            raise ValueError(f"chunk_elements must be a positive multiple of 64, got {chunk_elements}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused))
        self.path, self.chunk = Path(path), int(chunk_elements)
        # Layout: per parameter, in param_groups order, its first moment then its second, in the parameter's
        # dtype (torch.optim.AdamW's zeros_like(param)); the gradient file holds one gradient per parameter.
        self._offset: dict[torch.Tensor, int] = {}
        self._grad_offset: dict[torch.Tensor, int] = {}
        end = grad_end = 0
        for group in self.param_groups:
            for p in group["params"]:
                self._offset[p], self._grad_offset[p] = end, grad_end
                end += 2 * p.numel() * p.element_size()
                grad_end += p.numel() * p.element_size()
        self.nbytes = end
        self._fd = _scratch(self.path, end)  # sparse: unwritten moments read as zeros
        self.grads_path = Path(grads_path) if grads_path is not None else None
        self._grad_fd = _scratch(self.grads_path, grad_end) if self.grads_path is not None else -1
        self._has_grad: set[torch.Tensor] = set()  # parameters with a gradient in the file this step
        self._grad_scale: torch.Tensor | None = None  # clip_grad_norm_'s factor, applied as step reads them
        if self.grads_path is not None:
            for p in self._offset:
                p.register_post_accumulate_grad_hook(self._stash_grad)
        self._staging: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    # ---------------------------------------------------------------------------------------- gradients

    @torch.no_grad()
    def _stash_grad(self, p: torch.Tensor) -> None:
        """Add ``p.grad`` to ``p``'s gradient in the file (the first one of a step is written as is: what
        ``.grad = g`` would hold), then free it."""
        flat_g, size, base = p.grad.reshape(-1), p.element_size(), self._grad_offset[p]
        for lo in range(0, p.numel(), self.chunk):
            n = min(self.chunk, p.numel() - lo)
            g = flat_g[lo : lo + n]
            if p in self._has_grad:
                acc, _ = self._stage(p.dtype, n)
                _read(self._grad_fd, acc, base + lo * size)
                g = acc.add_(g.to(acc.device))  # .grad += g, in the gradient's dtype
            _write(self._grad_fd, g.cpu() if g.device.type != "cpu" else g.contiguous(), base + lo * size)
        self._has_grad.add(p)
        p.grad = None

    def _file_grad(self, p: torch.Tensor, lo: int = 0, n: int | None = None) -> torch.Tensor:
        """``p``'s filed gradient (flat), or its ``n`` elements from ``lo``, on ``p``'s device."""
        g = torch.empty(p.numel() - lo if n is None else n, dtype=p.dtype)
        _read(self._grad_fd, g, self._grad_offset[p] + lo * p.element_size())
        return g.to(p.device)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the gradients in the file: each parameter's norm computed on
        its whole gradient (read one parameter at a time) as PyTorch computes it, their total by PyTorch's own
        ``get_total_norm``, and the clamped factor max_norm / (total + 1e-6) kept for ``step`` to apply."""
        if self.grads_path is None:
            raise RuntimeError("clip_grad_norm_ on the optimizer is for gradients in a file (grads_path)")
        for p in self._offset:
            if p.grad is not None:
                self._stash_grad(p)
        with_grads = [p for p in self._offset if p in self._has_grad]
        if not with_grads:
            return torch.tensor(0.0)
        norms = [torch._foreach_norm([self._file_grad(p)], 2.0)[0] for p in with_grads]
        total = torch.nn.utils.get_total_norm(norms, 2.0)
        self._grad_scale = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        return total

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self.grads_path is not None:
            self._has_grad.clear()  # the next accumulation writes instead of adding: no need to clear the file
            self._grad_scale = None

    # ---------------------------------------------------------------------------------------- the step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is not None and p.grad.is_sparse:
                    raise RuntimeError("train.optim_offload does not take sparse gradients")
                if self.grads_path is not None and p.grad is not None:  # set outside backward: file it too
                    self._stash_grad(p)
                in_file = self.grads_path is not None and p in self._has_grad
                if p.grad is None and not in_file:
                    continue
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                flat_p, size = _flat(p), p.element_size()
                for lo in range(0, p.numel(), self.chunk):
                    n = min(self.chunk, p.numel() - lo)
                    if not in_file:
                        g = p.grad.reshape(-1)[lo : lo + n]
                    else:
                        g = self._file_grad(p, lo, n)
                        if self._grad_scale is not None:  # clip_grad_norm_'s g.mul_(factor), elementwise
                            g = g.mul_(self._grad_scale.to(g.device))
                    m, v = self._stage(p.dtype, n)
                    base = self._offset[p]
                    _read(self._fd, m, base + lo * size)
                    _read(self._fd, v, base + (p.numel() + lo) * size)
                    m_dev, v_dev = m.to(p.device), v.to(p.device)  # the same tensors on CPU
                    # Each slice counts the step from the same value: AdamW's kernels increment what they get.
                    step_t = state["step"].clone().to(p.device if group["fused"] else "cpu")
                    adamw(
                        [flat_p[lo : lo + n]], [g], [m_dev], [v_dev], [], [step_t],
                        foreach=False, fused=group["fused"], amsgrad=False, beta1=beta1, beta2=beta2,
                        lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                    )  # fmt: skip
                    if m_dev is not m:
                        m.copy_(m_dev)
                        v.copy_(v_dev)
                    _write(self._fd, m, base + lo * size)
                    _write(self._fd, v, base + (p.numel() + lo) * size)
                state["step"] += 1
        return loss

    def _stage(self, dtype: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if dtype not in self._staging:
            pin = torch.cuda.is_available()  # host-to-device copies of the staged chunk run from pinned pages
            self._staging[dtype] = tuple(
                torch.empty(self.chunk, dtype=dtype, pin_memory=pin) for _ in range(2)
            )  # type: ignore[assignment]
        m, v = self._staging[dtype]
        return m[:n], v[:n]

    # ---------------------------------------------------------------------------------------- files

    def moments(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of ``p``'s first and second moments, read from the file (for tests and inspection)."""
        m, v = torch.empty(p.numel(), dtype=p.dtype), torch.empty(p.numel(), dtype=p.dtype)
        _read(self._fd, m, self._offset[p])
        _read(self._fd, v, self._offset[p] + p.numel() * p.element_size())
        return m.view(p.shape), v.view(p.shape)

    def save_moments(self, dest: Path) -> None:
        """Copy the moments file to ``dest`` (a checkpoint; the caller syncs it): streamed, never resident."""
        with open(self.path, "rb") as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 24)

    def load_moments(self, src: Path) -> None:
        """Replace the moments with a file ``save_moments`` wrote for the same parameters."""
        size = src.stat().st_size
        if size != self.nbytes:
            raise ValueError(
                f"{src} holds {size} bytes of AdamW moments; this model's trainable parameters need {self.nbytes}: "
                "it was written for another model, LoRA setting or dtype"
            )
        with open(src, "rb") as fh, open(self.path, "r+b") as out:
            shutil.copyfileobj(fh, out, 1 << 24)

    def close(self) -> None:
        """Delete the scratch files (idempotent)."""
        for attr, path in (("_fd", self.path), ("_grad_fd", self.grads_path)):
            if getattr(self, attr, -1) >= 0:
                os.close(getattr(self, attr))
                setattr(self, attr, -1)
                path.unlink(missing_ok=True)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: os or the path may already be gone
            pass


def _scratch(path: Path, size: int) -> int:
    """A new file of ``size`` bytes, all zero and none of them written yet (sparse); its descriptor."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.ftruncate(fd, size)
    return fd


def _flat(p: torch.Tensor) -> torch.Tensor:
    if not p.is_contiguous():
        raise RuntimeError("train.optim_offload needs contiguous parameters (a view with strides was given)")
    return p.view(-1)


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy())


def _read(fd: int, t: torch.Tensor, offset: int) -> None:
    buf, done = _bytes(t), 0
    while done < len(buf):
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got <= 0:
            raise OSError(f"short read of an offload file at byte {offset + done} (was it truncated or removed?)")
        done += got


def _write(fd: int, t: torch.Tensor, offset: int) -> None:
    buf, done = _bytes(t), 0
    while done < len(buf):
        done += os.pwrite(fd, buf[done:], offset + done)


class ParkedWeights:
    """A frozen module's parameters kept in a file between the passes that need them (``train.ref_offload``).

    The reference model (beta > 0, full fine-tuning) is used once per generation batch, for the reference
    log-probs, and idles through the update, where memory peaks with the gradients: parking it there saves its
    weights' bytes (3.2 GiB of a 1.7B model in bf16) at the cost of reading them back once per generation batch
    (page cache or disk; a host-to-device copy on an accelerator). Creating it writes every parameter to the
    file and gives each an empty storage; ``with`` it, they are read into fresh storage for the block and freed
    after. Tied parameters are one Parameter object, stored once.
    """

    def __init__(self, module: torch.nn.Module, path: str | os.PathLike):
        from torch.distributed.tensor import DTensor

        self.path = Path(path)
        self.params = list(dict.fromkeys(module.parameters()))  # tied weights once
        if any(isinstance(p, DTensor) for p in self.params):
            raise ValueError(
                "train.ref_offload cannot park FSDP-sharded reference weights (several FSDP processes already "
                "shard the reference): drop train.ref_offload"
            )
        if any(p.requires_grad for p in self.params):
            raise ValueError("ParkedWeights parks frozen modules only (a parameter requires grad)")
        self.layout = [(p.shape, p.dtype, p.device) for p in self.params]
        self.offsets, end = [], 0
        for p in self.params:
            self.offsets.append(end)
            end += p.numel() * p.element_size()
        self._fd = _scratch(self.path, end)
        for p, off in zip(self.params, self.offsets):
            _write(self._fd, p.detach().cpu().contiguous().reshape(-1), off)
        self._release()

    def _release(self) -> None:
        for p, (_, dtype, device) in zip(self.params, self.layout):
            p.data = torch.empty(0, dtype=dtype, device=device)

    def __enter__(self) -> None:
        for p, (shape, dtype, device), off in zip(self.params, self.layout, self.offsets):
            host = torch.empty(shape, dtype=dtype)
            _read(self._fd, host.reshape(-1), off)
            p.data = host.to(device)

    def __exit__(self, *exc) -> None:
        self._release()

    def close(self) -> None:
        """Delete the file (idempotent); the parameters stay empty."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self.path.unlink(missing_ok=True)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# ------------------------------------------------------------------------------------ the loop's handles


def scratch_file(folder: str | None, run_dir: Path, name: str, rank: int) -> Path:
    """Where a process keeps an offloaded file: ``folder`` (train.optim_offload_dir) or the run folder."""
    return (Path(folder) if folder else Path(run_dir)) / f"{name}-rank{rank}.bin"


def park(module: torch.nn.Module, path: Path) -> torch.nn.Module:
    """Park ``module``'s weights in ``path`` (see ParkedWeights); ``loaded(module)`` brings them back."""
    module._parked_weights = ParkedWeights(module, path)
    return module


def loaded(module: torch.nn.Module):
    """A ``with`` block in which ``module``'s weights are in memory: a parked module's are read for it."""
    return getattr(module, "_parked_weights", None) or contextlib.nullcontext()


def clip_grad_norm_(optimizer: torch.optim.Optimizer, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over ``model``'s gradients, or the offloaded optimizer's own when the
    gradients are in its file."""
    if isinstance(optimizer, DiskAdamW) and optimizer.grads_path is not None:
        return optimizer.clip_grad_norm_(max_norm)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def close(optimizer: torch.optim.Optimizer, *modules: torch.nn.Module | None) -> None:
    """Delete the scratch files of an offloaded optimizer and of parked modules (others have none)."""
    for owner in (optimizer, *(getattr(m, "_parked_weights", None) for m in modules)):
        if isinstance(owner, (DiskAdamW, ParkedWeights)):
            owner.close()
