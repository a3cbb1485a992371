"""The native engine's fused CPU decode loop (``kernels/decode_cpu.c``), built on first use.

Why C: a decode step of a small model on a CPU is a few hundred PyTorch ops of a few microseconds
each, and for the shipped tiny model dispatch costs more than the arithmetic; a decode step that
spans several cores pays OpenMP's fork/join per op as well. The kernel runs prefill and whole decode
loops for a slice of rows in one call, one slice per core on the C side's own thread team (the
calling thread runs the first; ctypes releases the GIL), each with one BLAS thread, so the cores
never wait for each other inside a step; with few rows the cores instead decode all rows together,
each computing its share of every product (``generate``, ``COOP_ROWS_PER_CORE``).

Building: the source ships with the package and is compiled by the system C compiler (``$CC``, else
``cc`` / ``gcc``) into ``$RLVR_CACHE_DIR`` (default ``~/.cache/rlvr/kernels``) the first time it
is needed, about a second; the file name carries a hash of the source, the flags, the compiler and
the CPU, so an edited source or another machine sharing the home directory gets its own build.
``-march=native`` is why the CPU is in the hash. Without a compiler, or if the build fails, the
engine says why (``NativeEngine.describe``, which the trainer prints once and records in header.json)
and uses its PyTorch decoder: nothing else changes.

Matmuls use BLAS ``sgemm_`` taken from the already loaded libtorch (PyTorch's x86 wheels link MKL
and export it), checked on a small product before first use; without it a portable loop is used.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import itertools
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch


SOURCE = Path(__file__).with_name("kernels") / "decode_cpu.c"
ABI = 7  # RLVR_DECODE_ABI in the C source; bump both when Ctx changes
MAX_SLICES = 64  # MAX_SLICES in the C source: slices (threads) per job
CFLAGS = [
    "-pthread",
    "-O3",
    "-march=native",
    "-fopenmp-simd",
    "-fno-math-errno",
    "-std=c11",
    "-fPIC",
    "-shared",
]


class Ctx(ctypes.Structure):
    """Mirror of the C ``Ctx`` (same field order; natural alignment on both sides)."""

    _fields_ = (
        [
            (name, ctypes.c_int32)
            for name in (
                *("L", "E", "H", "Hkv", "D", "I", "V", "B", "n", "P", "C"),
                *("greedy", "n_eos", "abi", "wbf16"),
            )
        ]
        + [(name, ctypes.c_float) for name in ("eps", "scale", "inv_temp")]
        + [
            (name, ctypes.c_void_p)
            for name in (
                *("embed", "final_norm", "lm_head", "rope", "lw", "pad", "prompt_ids"),
                *("first_logits", "uniforms", "eos", "tokens", "logps", "alive"),
                *("sgemm", "set_threads_local", "all_logits"),
            )
        ]
    )


def _cache_dir() -> Path:
    root = os.environ.get("RLVR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlvr"
    )
    return Path(root) / "kernels"


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc.split()[0]):
            return cc
    return None


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def build(cc: str, cache_dir: Path) -> tuple[Path | None, str]:
    """Compile the kernel with ``cc`` into ``cache_dir`` unless an identical build is there."""
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run(
            cc.split() + ["--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} --version failed: {e}"
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                " ".join(CFLAGS).encode(),
                version.encode(),
                _cpu_signature().encode(),
            ]
        )
    ).hexdigest()[:16]
    out = cache_dir / f"decode_cpu-{key}.so"
    if out.exists():
        return out, ""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            built = Path(tmp) / out.name
            proc = subprocess.run(
                cc.split() + CFLAGS + ["-o", str(built), str(SOURCE), "-lm"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if proc.returncode != 0:
                return (
                    None,
                    f"{cc} failed to build {SOURCE.name}: {proc.stderr.strip()[-2000:]}",
                )
            os.replace(built, out)  # atomic: a concurrent loader sees all or nothing
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"could not build {SOURCE.name} into {out.parent}: {e}"
    return out, ""


@functools.cache
def load() -> tuple[ctypes.CDLL | None, str]:
    """The compiled kernel library (built once, cached per process), or ``(None, why not)``."""
    if os.environ.get("RLVR_NO_CPU_KERNEL"):
        return None, "disabled by RLVR_NO_CPU_KERNEL"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set $CC or install gcc/clang)"
    path, why = build(cc, _cache_dir())
    if path is None:
        return None, why
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"could not load {path}: {e}"
    if lib.rlvr_decode_abi() != ABI:
        return None, f"{path} has ABI {lib.rlvr_decode_abi()}, expected {ABI}"
    lib.rlvr_decode.argtypes = [ctypes.POINTER(Ctx)] + [ctypes.c_int] * 4
    lib.rlvr_decode.restype = ctypes.c_int
    lib.rlvr_prefill.argtypes = [ctypes.POINTER(Ctx)] + [ctypes.c_int] * 2
    lib.rlvr_prefill.restype = ctypes.c_int
    lib.rlvr_check_sgemm.argtypes = [ctypes.c_void_p]
    # rlvr_skinny_linear(m, n_out, k, x, w, y, ldy, beta): the tests' handle on the skinny path
    lib.rlvr_skinny_linear.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3
    lib.rlvr_skinny_linear.argtypes += [ctypes.c_int, ctypes.c_float]
    lib.rlvr_skinny_linear.restype = ctypes.c_int
    # rlvr_run(ctx, kind, n_slices, bounds, t0, t1)
    lib.rlvr_run.argtypes = [ctypes.POINTER(Ctx)] + [ctypes.c_int] * 2
    lib.rlvr_run.argtypes += [ctypes.c_void_p] + [ctypes.c_int] * 2
    lib.rlvr_run.restype = ctypes.c_int
    lib.rlvr_wake.argtypes = [ctypes.c_int]
    # rlvr_bf16_linear(m, n_out, k, x, x16, w16, y, ldy, beta): the tests' handle on the bfloat16 product
    lib.rlvr_bf16_linear.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 4
    lib.rlvr_bf16_linear.argtypes += [ctypes.c_int, ctypes.c_float]
    lib.rlvr_bf16_linear.restype = None
    return lib, ""


def bf16_fast() -> bool:
    """Whether this build multiplies bfloat16 weights with AVX512-BF16's ``vdpbf16ps``: then sampling
    from bfloat16 copies of the weights reads half the bytes and does twice the products per instruction
    of float32. Without it the kernel's bfloat16 path is a portable loop (right, slow), and the engine
    keeps the float32 weights."""
    lib, _ = load()
    return lib is not None and bool(lib.rlvr_bf16_dot())


@functools.cache
def blas() -> tuple[int | None, int | None]:
    """Addresses of ``sgemm_`` and ``MKL_Set_Num_Threads_Local`` (MKL's C name) in the loaded libtorch, or None."""
    lib_dir = Path(torch.__file__).parent / "lib"
    for path in sorted(glob.glob(str(lib_dir / "libtorch_cpu.*"))):
        try:
            torch_cpu = ctypes.CDLL(path)
        except OSError:
            continue
        sgemm = getattr(torch_cpu, "sgemm_", None)
        threads = getattr(torch_cpu, "MKL_Set_Num_Threads_Local", None)
        address = lambda f: None if f is None else ctypes.cast(f, ctypes.c_void_p).value
        return address(sgemm), address(threads)
    return None, None


@functools.cache
def sgemm_pointers() -> tuple[int | None, int | None, str]:
    """BLAS pointers that passed the kernel's small-product check (or Nones), and a note."""
    lib, why = load()
    if lib is None:
        return None, None, why
    sgemm, threads = blas()
    if sgemm is None:
        return None, None, "no sgemm_ exported by libtorch_cpu: portable matmul loop"
    if lib.rlvr_check_sgemm(sgemm) != 0:
        return (
            None,
            None,
            "libtorch's sgemm_ failed the kernel's check: portable matmul loop",
        )
    return sgemm, threads, ""


PLAIN_RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


def _f32(*tensors) -> bool:
    return all(t is None or t.dtype == torch.float32 for t in tensors)


def _plain_linear(m, bias_ok: bool) -> bool:
    return type(m) is torch.nn.Linear and (bias_ok or m.bias is None) and _f32(m.weight, m.bias)


def _plain_norm(m) -> bool:
    return type(m).__name__ in PLAIN_RMS_NORMS and hasattr(m, "variance_epsilon") and _f32(m.weight)


def unsupported(lm) -> str | None:
    """Why the kernel cannot decode this (unwrapped, fast-path) Llama/Qwen model, or None. It runs
    exactly the plain modules (biases included): wrapped (LoRA, quantised) projections, other
    activations or norms, and anything but float32 go to the PyTorch decoder."""
    base = lm.model
    # Every tensor the kernel reads is checked below (module by module, not parameters(): that
    # walk cost more than the tiny model's prefill).
    if not _f32(base.embed_tokens.weight, lm.lm_head.weight):
        return "the model is not float32"
    if type(base.embed_tokens) is not torch.nn.Embedding or not _plain_linear(lm.lm_head, False):
        return "the embedding or LM head is wrapped or biased"
    norms = [base.norm]
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not all(_plain_linear(getattr(attn, n), True) for n in ("q_proj", "k_proj", "v_proj")):
            return "a q/k/v projection is wrapped (LoRA or quantised) or not float32"
        if not _plain_linear(attn.o_proj, True) or not all(
            _plain_linear(getattr(mlp, n, None), True) for n in ("gate_proj", "up_proj", "down_proj")
        ):
            return "an output or MLP projection is wrapped (LoRA or quantised) or not float32"
        if type(getattr(mlp, "act_fn", None)).__name__ not in (
            "SiLUActivation",
            "SiLU",
        ):
            return "the MLP activation is not SiLU"
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []
    if not all(_plain_norm(m) for m in norms):
        return "a norm is not a plain float32 Llama/Qwen RMSNorm"
    if len({float(m.variance_epsilon) for m in norms}) != 1:
        return "its norms use different epsilons"
    return None


def rope_table(lm, positions: int) -> torch.Tensor:
    """``[positions, 2D]``: cos | sin with the first half of sin negated, from the model's own rotary
    module (scaled and NTK variants honoured), so that ``x·cos + roll(x, D/2)·sin`` is
    transformers' ``x·cos + rotate_half(x)·sin``."""
    base = lm.model
    probe = base.embed_tokens.weight[:1, None]  # the module reads only dtype and device
    cos, sin = base.rotary_emb(probe, torch.arange(positions)[None])
    half = cos.shape[-1] // 2
    return torch.cat((cos[0], -sin[0, :, :half], sin[0, :, half:]), dim=-1).float().contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def pack_bf16(w: torch.Tensor) -> torch.Tensor:
    """``w [n_out, k]`` as the kernel's bfloat16 product reads it: rounded to bfloat16 (nearest even) and
    packed in blocks of 16 outputs, each ``[ceil(k / 2), 16, 2]`` (an input pair of 16 outputs per 64 bytes,
    one ``vdpbf16ps`` operand), zeros padding a partial block and an odd k. One cast and one copy."""
    n_out, k = w.shape
    blocks, k2 = -(-n_out // 16), -(-k // 2)
    w = w.detach()
    if (blocks * 16, k2 * 2) != (n_out, k):
        w = torch.nn.functional.pad(w, (0, k2 * 2 - k, 0, blocks * 16 - n_out))
    # Cast, then move each input pair as one 32-bit word: a transpose of words, several times faster than
    # reordering 16-bit values (80 -> ~25 ms for SmolLM2's LM head).
    pairs = w.to(torch.bfloat16).view(torch.int32).view(blocks, 16, k2)
    return pairs.transpose(1, 2).contiguous().view(torch.bfloat16).view(blocks, k2, 16, 2)


class KernelDecode:
    """One request through the C kernel: prefill then decode, on the model's live parameters.
    Holds every tensor the C side points at for as long as it runs.

    ``pad_B``: left pads of each prompt in ``ids_BP``; rows ``b·n … b·n+n-1`` sample prompt b.
    The draws are ``uniforms[t, r]`` from ``generator``: one per row and step, so a seed gives the
    same completions whatever the number of slices.

    ``weight_dtype=torch.bfloat16``: the projections and the LM head are read from request-long bfloat16
    copies (each product rounds its input rows to bfloat16 and accumulates in float32; norms, attention,
    the residual stream and the sampler stay float32): the sampler of bf16 mixed precision. The copies
    cost one cast and reorder of those weights per request (~0.1 s for SmolLM2-135M, 3% of its rollout)."""

    def __init__(
        self,
        lm,
        ids_BP,
        pad_B,
        n: int,
        sampling,
        eos_ids,
        generator,
        keep_logits: bool = False,
        weight_dtype: torch.dtype = torch.float32,
    ):
        if weight_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"the C decode kernel reads float32 or bfloat16 weights, not {weight_dtype}")
        lib, _ = load()
        assert lib is not None, "KernelDecode needs load() to have succeeded"
        self.lib = lib
        base, cfg = lm.model, lm.config
        attn0 = base.layers[0].self_attn
        B, P = ids_BP.shape
        C = sampling.max_tokens
        H = cfg.num_attention_heads
        Hkv = getattr(cfg, "num_key_value_heads", None) or H
        D = attn0.head_dim
        N = B * n
        self.N, self.B, self.n, self.C = N, B, n, C
        # Every tensor whose address the C side holds, kept alive for the request.
        self.keep: list[torch.Tensor] = []

        def hold(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
            t = t.detach().contiguous()
            self.keep.append(t)
            return t.data_ptr()

        def hold_matrix(t: torch.Tensor) -> int | None:  # a projection or the LM head
            return hold(t if weight_dtype == torch.float32 else pack_bf16(t))

        lw: list[int | None] = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            k_pre, v_pre = torch.empty(B, Hkv, P, D), torch.empty(B, Hkv, P, D)
            k_suf, v_suf = torch.empty(N, Hkv, C, D), torch.empty(N, Hkv, C, D)
            q_norm, k_norm = (
                getattr(attn, "q_norm", None),
                getattr(attn, "k_norm", None),
            )
            lw += [
                hold(layer.input_layernorm.weight),
                hold_matrix(attn.q_proj.weight), hold_matrix(attn.k_proj.weight), hold_matrix(attn.v_proj.weight),
                hold(attn.q_proj.bias), hold(attn.k_proj.bias), hold(attn.v_proj.bias),
                hold(None if q_norm is None else q_norm.weight),
                hold(None if k_norm is None else k_norm.weight),
                hold_matrix(attn.o_proj.weight), hold(attn.o_proj.bias),
                hold(layer.post_attention_layernorm.weight),
                hold_matrix(mlp.gate_proj.weight), hold_matrix(mlp.up_proj.weight), hold_matrix(mlp.down_proj.weight),
                hold(mlp.gate_proj.bias), hold(mlp.up_proj.bias), hold(mlp.down_proj.bias),
                hold(k_pre), hold(v_pre), hold(k_suf), hold(v_suf),
            ]  # fmt: skip
        self.lw = (ctypes.c_void_p * len(lw))(*lw)
        greedy = sampling.temperature == 0.0
        self.tokens_NC = torch.full((N, C), -1, dtype=torch.long)
        self.logp_NC = torch.zeros((N, C), dtype=torch.float32)
        self.alive_N = torch.ones(N, dtype=torch.int32)
        self.first_logits_BV = torch.empty(B, cfg.vocab_size)
        uniforms = torch.zeros(C, N) if greedy else torch.rand(C, N, generator=generator)
        # Every step's logits, only for the tests that hold them against the Hugging Face forward.
        self.logits_NCV = torch.zeros(N, C, cfg.vocab_size) if keep_logits else None
        sgemm, threads, _ = sgemm_pointers()
        self.ctx = Ctx(
            L=len(base.layers), E=cfg.hidden_size, H=H, Hkv=Hkv, D=D,
            I=base.layers[0].mlp.gate_proj.out_features, V=cfg.vocab_size,
            B=B, n=n, P=P, C=C, greedy=int(greedy), n_eos=len(eos_ids), abi=ABI,
            wbf16=int(weight_dtype == torch.bfloat16),
            eps=float(base.norm.variance_epsilon), scale=float(attn0.scaling),
            inv_temp=1.0 if greedy else 1.0 / sampling.temperature,
            embed=hold(base.embed_tokens.weight), final_norm=hold(base.norm.weight),
            lm_head=hold_matrix(lm.lm_head.weight), rope=hold(rope_table(lm, P + C)),
            lw=ctypes.cast(self.lw, ctypes.c_void_p), pad=hold(pad_B.to(torch.int32)),
            prompt_ids=hold(ids_BP.to(torch.long)), first_logits=_ptr(self.first_logits_BV),
            uniforms=hold(uniforms), eos=hold(torch.tensor(list(eos_ids), dtype=torch.long)),
            tokens=_ptr(self.tokens_NC), logps=_ptr(self.logp_NC), alive=_ptr(self.alive_N),
            sgemm=sgemm, set_threads_local=threads, all_logits=_ptr(self.logits_NCV),
        )  # fmt: skip

    def slices(self, workers: int) -> tuple[bool, list[tuple[int, int, int, int]]]:
        """``(own_prompts, [(row_lo, row_hi, prompt_lo, prompt_hi), ...])``, one per worker. With at
        least as many prompts as workers, each slice takes whole groups and prefills exactly its
        own prompts (no wait between prefill and decode, and a group's prompt keys stay in that
        core's cache); otherwise prompts and rows are split separately."""
        workers = max(1, min(workers, self.N, MAX_SLICES))

        def split(units: int) -> list[tuple[int, int]]:
            parts = min(workers, units)
            bounds = [round(i * units / parts) for i in range(parts + 1)]
            return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]

        if self.B >= workers:
            groups = split(self.B)
            return True, [(a * self.n, b * self.n, a, b) for a, b in groups]
        prompts, rows = split(self.B), split(self.N)
        prompts += [(self.B, self.B)] * (len(rows) - len(prompts))
        return False, [(r[0], r[1], p[0], p[1]) for r, p in zip(rows, prompts)]

    def run(self, kind: int, slices, t0: int = 0, t1: int = 0) -> None:
        """One job on the kernel's thread team (the calling thread runs slice 0; ctypes releases
        the GIL for the call). ``kind``: PREFILL, DECODE or BOTH (prefill, then steps [t0, t1))."""
        flat = [v for s in slices for v in s]
        bounds = (ctypes.c_int32 * len(flat))(*flat)
        rc = self.lib.rlvr_run(ctypes.byref(self.ctx), kind, len(slices), bounds, t0, t1)
        if rc:
            raise MemoryError("the native CPU decode kernel could not allocate its scratch memory")


PREFILL, DECODE, BOTH, COOP = 0, 1, 2, 3

# Rows per core up to which the cores decode together (JOB_COOP in the C source: every core runs
# all rows and computes its share of each product's outputs) rather than one slice of rows each.
# With few rows a step is bound by reading the weights, and slices make every core read all of
# them; cooperating, each reads its share, at the price of five barriers per layer.
COOP_ROWS_PER_CORE = 8


def coop_suits(run: KernelDecode, workers: int) -> bool:
    """Whether ``run`` has few enough rows per core for a cooperative decode to pay (on a quiet machine)."""
    slices = len(run.slices(workers)[1])
    return slices > 1 and run.N <= COOP_ROWS_PER_CORE * slices


def generate(run: KernelDecode, workers: int, stop_check=None, coop: bool | None = None) -> None:
    """Prefill and decode every row of ``run``: one job when there are no stop strings; otherwise
    one step per job, with ``stop_check(t)`` (which may clear rows of ``run.alive_N``) between.
    ``coop``: decode cooperatively (None: when ``coop_suits``); the completions are the same either
    way. The engine chooses by measurement (``NativeEngine.kernel_coop``)."""
    own, slices = run.slices(workers)
    if coop is None:
        coop = coop_suits(run, workers)
    coop = coop and len(slices) > 1
    members = [(0, run.N, 0, 0)] * len(slices) if coop else None
    steps = run.C if stop_check is None else 1
    if coop:  # prefill in slices, then every core on every row
        run.run(PREFILL, slices)
        run.run(COOP, members, 0, steps)
    elif own:  # each slice prefills its own prompts, then decodes: one job
        run.run(BOTH, slices, 0, steps)
    else:  # rows read prompts prefilled by other slices: prefill must finish first
        run.run(PREFILL, slices)
        run.run(DECODE, slices, 0, steps)
    if stop_check is None:
        return
    for t in range(run.C):
        if t > 0:
            run.run(COOP, members, t, t + 1) if coop else run.run(DECODE, slices, t, t + 1)
        if not stop_check(t):
            break
