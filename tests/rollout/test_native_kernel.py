"""The native engine's C decode loop (rlvr/rollout/kernels/decode_cpu.c): every step's logits equal
the Hugging Face forward of the sequence so far, for each architecture the fast path claims; its
output does not depend on how rows are split across cores; it steps aside (or errors when asked
for) where it does not implement the model or the request exactly."""

from __future__ import annotations

import copy
import ctypes
import os
import platform
import subprocess
import sys

import pytest
import torch
from numerics import assert_fp32_close, bound, sequence_logits
from rollout_models import tiny_model

from rlvr.rollout import SamplingParams, cpu_kernel, make_engine
from rlvr.rollout.common import left_pad

# Skipped only where there is no C compiler at all (CI has gcc); with one, a failed build fails
# these tests.
pytestmark = pytest.mark.skipif(cpu_kernel._compiler() is None, reason="no C compiler")


def test_kernel_builds_and_uses_blas():
    lib, why = cpu_kernel.load()
    assert lib is not None, why
    sgemm, _, note = cpu_kernel.sgemm_pointers()
    # PyTorch's x86 wheels link MKL and export its sgemm_: there the kernel must be using it.
    if torch.backends.mkl.is_available():
        assert sgemm is not None, note



@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 32, 33])
@pytest.mark.parametrize(("n_out", "k"), [(37, 96), (64, 23), (1, 7), (19, 150)])
def test_skinny_product_equals_the_float64_product(m, n_out, k):
    """The decode step's few-row product (rows in register blocks, outputs in groups, a masked tail
    of k): every row, every output, beta = 0 and beta = 1 (the residual add), an output stride wider
    than the product leaving the other columns alone."""
    lib, why = cpu_kernel.load()
    assert lib is not None, why
    gen = torch.Generator().manual_seed(m * 1000 + n_out + k)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n_out, k, generator=gen)
    ldy = n_out + 5
    y0 = torch.randn(m, ldy, generator=gen)
    for beta in (0.0, 1.0):
        y = y0.clone()
        args = (m, n_out, k, x.data_ptr(), w.data_ptr(), y.data_ptr(), ldy, beta)
        if lib.rlvr_skinny_linear(*args) != 0:
            pytest.skip("this build has no skinny path (no AVX2 + FMA)")
        base = y0[:, :n_out] * beta
        ref32 = base + x @ w.T
        ref64 = base.double() + x.double() @ w.double().T
        assert_fp32_close(y[:, :n_out], ref32, ref64, f"m={m} n={n_out} k={k} beta={beta}")
        assert torch.equal(y[:, n_out:], y0[:, n_out:]), "wrote outside its columns"

ARCHS = [
    ("llama", {}),  # GQA (4 query heads over 2 KV heads), untied
    (
        "llama",
        {"attention_bias": True, "tie_word_embeddings": True, "num_key_value_heads": 4},
    ),
    ("qwen2", {}),  # q/k/v biases
    ("qwen3", {}),  # per-head q/k RMSNorm, explicit head_dim
]
ARCH_IDS = ["llama-gqa", "llama-bias-tied-mha", "qwen2", "qwen3"]


def run_kernel(model, tok, prompts, n, sampling, workers=1, keep_logits=True, coop=None):
    ids_BP, mask_BP = left_pad(prompts, tok.pad_token_id, "cpu")
    g = torch.Generator().manual_seed(sampling.seed or 0)
    with torch.inference_mode():
        run = cpu_kernel.KernelDecode(
            model,
            ids_BP,
            (1 - mask_BP).sum(-1),
            n,
            sampling,
            [tok.eos_token_id],
            g,
            keep_logits,
        )
        cpu_kernel.generate(run, workers, coop=coop)
    return run


# One slice on one thread; three cores decoding together (every product split by output columns
# into uneven shares, rows dealt out for attention and sampling).
DECODES = {"one-slice": {"workers": 1}, "cooperative": {"workers": 3, "coop": True}}


def _bf16_rounded(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 16, 33])
@pytest.mark.parametrize(("n_out", "k"), [(37, 96), (64, 23), (1, 7), (19, 150), (12, 64)])
def test_bf16_product_equals_the_float64_product_of_the_rounded_operands(m, n_out, k):
    """bfloat16 weights: the product rounds its input rows to bfloat16 (nearest even, as torch does) and
    sums in float32; every shape path (whole tiles, leftover outputs, a masked tail of k, k below one
    vector) against float64 over the same rounded operands, beta = 0 and 1, other columns untouched."""
    lib, why = cpu_kernel.load()
    assert lib is not None, why
    gen = torch.Generator().manual_seed(m * 1000 + n_out + k + 7)
    x = torch.randn(m, k, generator=gen)
    w16 = torch.randn(n_out, k, generator=gen).to(torch.bfloat16)
    x16 = torch.zeros(m, k + 1, dtype=torch.bfloat16)
    ldy = n_out + 3
    y0 = torch.randn(m, ldy, generator=gen)
    for beta in (0.0, 1.0):
        y = y0.clone()
        packed = cpu_kernel.pack_bf16(w16)
        lib.rlvr_bf16_linear(m, n_out, k, x.data_ptr(), x16.data_ptr(), packed.data_ptr(), y.data_ptr(), ldy, beta)
        k_even = k + k % 2  # rows of whole input pairs
        x16_rows = x16.view(-1)[: m * k_even].view(m, k_even)
        assert torch.equal(x16_rows[:, :k], x.to(torch.bfloat16)), "inputs not rounded as torch rounds them"
        base = y0[:, :n_out] * beta
        ref32 = base + _bf16_rounded(x) @ w16.float().T
        ref64 = base.double() + _bf16_rounded(x).double() @ w16.double().T
        assert_fp32_close(y[:, :n_out], ref32, ref64, f"m={m} n={n_out} k={k} beta={beta}")
        assert torch.equal(y[:, n_out:], y0[:, n_out:]), "wrote outside its columns"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="-mno-avx512bf16 is an x86 flag")
def test_bf16_product_without_avx512_bf16_is_the_same_product(tmp_path, monkeypatch):
    """A CPU without AVX512-BF16 gets the portable loop over the same packed weights (the engine then keeps
    float32 weights, but the kernel must still be right if asked): built here with the instructions off."""
    cc = cpu_kernel._compiler()
    monkeypatch.setattr(cpu_kernel, "CFLAGS", [*cpu_kernel.CFLAGS, "-mno-avx512bf16"])
    path, why = cpu_kernel.build(cc, tmp_path)
    assert path is not None, why
    lib = ctypes.CDLL(str(path))
    assert lib.rlvr_bf16_dot() == 0
    lib.rlvr_bf16_linear.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_float]
    gen = torch.Generator().manual_seed(3)
    for m, n_out, k in ((3, 37, 23), (7, 16, 64)):
        x, w16 = torch.randn(m, k, generator=gen), torch.randn(n_out, k, generator=gen).to(torch.bfloat16)
        x16, y = torch.zeros(m, k + 1, dtype=torch.bfloat16), torch.randn(m, n_out, generator=gen)
        y0, packed = y.clone(), cpu_kernel.pack_bf16(w16)
        lib.rlvr_bf16_linear(m, n_out, k, x.data_ptr(), x16.data_ptr(), packed.data_ptr(), y.data_ptr(), n_out, 1.0)
        ref32 = y0 + _bf16_rounded(x) @ w16.float().T
        ref64 = y0.double() + _bf16_rounded(x).double() @ w16.double().T
        assert_fp32_close(y, ref32, ref64, f"portable m={m} n={n_out} k={k}")


def bf16_rounded_twin(model):
    """The function the kernel computes from bfloat16 weights, in float32 modules: every projection and
    the LM head (untied from the embedding, which stays float32) hold bfloat16-rounded weights, and
    their inputs are rounded to bfloat16 on the way in."""
    twin = copy.deepcopy(model)
    projections = [twin.lm_head]
    for layer in twin.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
        projections += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    for lin in projections:
        lin.weight = torch.nn.Parameter(_bf16_rounded(lin.weight.detach()).clone())
        lin.register_forward_pre_hook(lambda _m, args: (_bf16_rounded(args[0]),))
    return twin


@pytest.mark.parametrize("decode", DECODES)
@pytest.mark.parametrize("arch,overrides", [("llama", {"tie_word_embeddings": True}), ("qwen3", {})])
def test_bf16_weights_every_step_logits_equal_the_rounded_forward(arch, overrides, decode):
    """``weight_dtype=torch.bfloat16`` (the sampler of bf16 mixed precision) computes the forward of the
    bf16-rounded twin. Rounding inputs to bfloat16 makes exact agreement chaotic: a float32 summation-order
    difference of 1e-7 flips an input that sits at a bfloat16 rounding boundary, a 2^-9 change that the
    later layers carry on. So: every row's logits are within float32 rounding of the twin's unless such a
    flip happened, at least one row of the request has none (exact agreement is not possible without
    the rounding, or with the wrong weights: those move logits by 40-100% of the bf16 effect), and every
    row stays well inside the distance between the float32 model and the twin (the flips measured at most
    28% of it)."""
    model, tok = tiny_model(arch, seed=5, **overrides)
    model.eval()
    twin = bf16_rounded_twin(model)
    prompts = [tok.encode("37+45="), tok.encode("8*9="), tok.encode("(2+3)*4=")]
    n, C, T = 3, 6, 1.3
    ids_BP, mask_BP = left_pad(prompts, tok.pad_token_id, "cpu")
    sampling = SamplingParams(temperature=T, max_tokens=C, seed=2)
    with torch.inference_mode():
        run = cpu_kernel.KernelDecode(model, ids_BP, (1 - mask_BP).sum(-1), n, sampling, [tok.eos_token_id],
                                      torch.Generator().manual_seed(2), True, weight_dtype=torch.bfloat16)
        cpu_kernel.generate(run, **DECODES[decode])
    assert all(p.dtype == torch.float32 for p in model.parameters()), "the live weights were changed"
    exact_rows, errors, gaps = 0, [], []
    for r, row in enumerate(run.tokens_NC.tolist()):
        prompt = prompts[r // n]
        done = row.index(-1) if -1 in row else C
        assert done >= 2, "the comparison must cover decode steps, not just the prompt's"
        seq = prompt + row[:done]
        steps = slice(len(prompt) - 1, len(seq) - 1)
        got_TV = run.logits_NCV[r, :done]
        want32_TV = sequence_logits(twin, seq, torch.float32)[steps]
        want64_TV = sequence_logits(twin, seq, torch.float64)[steps]
        err = (got_TV.double() - want64_TV).abs().max().item()
        exact_rows += err <= bound(want32_TV, want64_TV)
        errors.append((got_TV - want32_TV).abs().max().item())
        gaps.append((sequence_logits(model, seq, torch.float32)[steps] - want32_TV).abs().max().item())
        # The reported log-prob is log_softmax(logits / T) of the logits the kernel sampled from.
        picked = torch.tensor(row[:done])[:, None]
        torch.testing.assert_close(run.logp_NC[r, :done], torch.log_softmax(got_TV / T, -1).gather(1, picked)[:, 0])
    assert exact_rows >= 1, f"no row within float32 rounding of the bf16-rounded forward: {errors}"
    assert max(errors) <= 0.35 * max(gaps), (errors, gaps)


def test_engine_samples_bf16_compute_on_the_kernel_where_the_cpu_has_avx512_bf16():
    """``compute_dtype="bfloat16"``: the C kernel with bfloat16 weights where the CPU multiplies them fast,
    the bf16 PyTorch decoder elsewhere; ``describe`` says which."""
    model, tok = tiny_model("llama", seed=6)
    engine = make_engine("native", model, tok, compute_dtype="bfloat16")
    sampling = SamplingParams(temperature=1.0, max_tokens=5, seed=1)
    engine.generate([tok.encode("1+2=")], 2, sampling)
    if cpu_kernel.bf16_fast():
        assert engine.last_decoder == "kernel"
        assert "bfloat16 weights" in engine.describe(sampling)
    else:
        assert engine.last_decoder == "torch"
        assert "AVX512-BF16" in engine.describe(sampling)




@pytest.mark.parametrize("decode", DECODES)
@pytest.mark.parametrize("arch,overrides", ARCHS, ids=ARCH_IDS)
def test_every_step_logits_equal_hf_forward(arch, overrides, decode):
    model, tok = tiny_model(arch, seed=1, **overrides)
    model.eval()
    assert cpu_kernel.unsupported(model) is None
    # Different lengths (left padding), several rows per prompt that diverge (T = 1.5 sampling).
    prompts = [tok.encode("37+45="), tok.encode("8*9="), tok.encode("(2+3)*4=")]
    n, C = 3, 7
    run = run_kernel(model, tok, prompts, n, SamplingParams(temperature=1.5, max_tokens=C, seed=3), **DECODES[decode])
    tokens = run.tokens_NC.tolist()
    checked = 0
    for r, row in enumerate(tokens):
        prompt = prompts[r // n]
        done = row.index(-1) if -1 in row else C
        seq = prompt + row[:done]
        steps = slice(len(prompt) - 1, len(seq) - 1)
        want32_TV = sequence_logits(model, seq, torch.float32)[steps]
        want64_TV = sequence_logits(model, seq, torch.float64)[steps]
        assert_fp32_close(run.logits_NCV[r, :done], want32_TV, want64_TV, f"row {r} logits")
        # The reported log-prob is log_softmax(logits / T) at the sampled token.
        picked = torch.tensor(row[:done])[:, None]
        want32_logp = torch.log_softmax(want32_TV / 1.5, -1).gather(1, picked)[:, 0]
        want64_logp = torch.log_softmax(want64_TV / 1.5, -1).gather(1, picked)[:, 0]
        assert_fp32_close(run.logp_NC[r, :done], want32_logp, want64_logp, f"row {r} log-probs")
        checked += done
    assert checked >= len(tokens) * 2  # the comparison covered real decode steps, not just step 0
    assert len({tuple(t) for t in tokens}) > 1  # rows of one group diverged


@pytest.mark.parametrize("arch,overrides", ARCHS, ids=ARCH_IDS)
def test_greedy_tokens_equal_generate(arch, overrides):
    model, tok = tiny_model(arch, seed=2, **overrides)
    prompts = [tok.encode("37+45="), tok.encode("8*9="), tok.encode("(2+3)*4=")]
    sampling = SamplingParams(temperature=0.0, max_tokens=10)
    native = make_engine("native", model, tok)
    got = native.generate(prompts, 2, sampling)
    assert native.last_decoder == "kernel"
    want = make_engine("hf", model, tok).generate(prompts, 2, sampling)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]


def test_output_does_not_depend_on_the_row_split():
    """The draws are per (step, row) and a row's arithmetic does not depend on its neighbours: 1, 2
    and 5 slices (fewer prompts than slices included: prompts and rows then split apart) and 2 or
    3 cores decoding together give identical tokens, and log-probs equal up to BLAS rounding (a
    GEMM over a different number of rows may sum in another order)."""
    model, tok = tiny_model("llama", seed=4)
    prompts = [tok.encode(t) for t in ("1+1=", "22+33=", "9*9=", "100-1=", "7=")]
    sampling = SamplingParams(temperature=1.0, max_tokens=9, seed=11)
    splits = [(1, False), (2, False), (5, False), (2, True), (3, True)]
    runs = [run_kernel(model, tok, prompts, 4, sampling, workers=w, keep_logits=False, coop=c) for w, c in splits]
    # The log-probs may differ by float32 rounding only: bounded by the float32 error of the
    # Hugging Face forward on the same sequences (tests/numerics.py), measured here.
    ref32, ref64 = [], []
    for r, row in enumerate(runs[0].tokens_NC.tolist()):
        prompt = prompts[r // 4]
        done = row.index(-1) if -1 in row else len(row)
        seq, picked = prompt + row[:done], torch.tensor(row[:done])[:, None]
        for dtype, out in ((torch.float32, ref32), (torch.float64, ref64)):
            logits_TV = sequence_logits(model, seq, dtype)[len(prompt) - 1 : len(seq) - 1]
            out.append(torch.log_softmax(logits_TV, -1).gather(1, picked)[:, 0])
    valid_NC = runs[0].tokens_NC != -1
    for other in runs[1:]:
        assert torch.equal(other.tokens_NC, runs[0].tokens_NC)
        diff = (other.logp_NC - runs[0].logp_NC)[valid_NC].abs().max().item()
        assert diff <= bound(torch.cat(ref32), torch.cat(ref64)), diff
    # And the engine's thread pool gives what one slice gives.
    engine = make_engine("native", model, tok, cpu_threads=3)
    got = engine.generate(prompts, 4, sampling)
    assert engine.last_decoder == "kernel"
    want_ids = [[t for t in row if t != -1] for row in runs[0].tokens_NC.tolist()]
    assert [c.token_ids for c in got] == want_ids
    engine.close()


def test_engine_uses_every_torch_thread_by_default(monkeypatch):
    """One slice per thread torch may use (the small-model one-thread rule is for the PyTorch
    decoder's per-op threading, not for the kernel's slices)."""
    model, tok = tiny_model("llama")
    seen = []
    monkeypatch.setattr(cpu_kernel, "generate", lambda run, workers, stop=None, coop=None: seen.append(workers))
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        make_engine("native", model, tok).generate(
            [tok.encode("1+2=")],
            2,
            SamplingParams(temperature=1.0, max_tokens=2, seed=0),
        )
        make_engine("native", model, tok, cpu_threads=2).generate(
            [tok.encode("1+2=")],
            2,
            SamplingParams(temperature=1.0, max_tokens=2, seed=0),
        )
    finally:
        torch.set_num_threads(previous)
    assert seen == [3, 2]


def test_finished_rows_stop_and_keep_their_tokens():
    """A row that samples EOS stops (its later slots stay -1) while the others go on."""
    model, tok = tiny_model("llama", seed=0)
    prompts = [tok.encode("37+45="), tok.encode("8*9=")]
    run = run_kernel(model, tok, prompts, 8, SamplingParams(temperature=3.0, max_tokens=30, seed=1))
    ended = 0
    for row in run.tokens_NC.tolist():
        if tok.eos_token_id in row:
            end = row.index(tok.eos_token_id)
            assert all(t == -1 for t in row[end + 1 :])
            ended += 1
    assert 0 < ended < 16, "the seed should give some rows that stop early and some that do not"


def test_falls_back_where_it_does_not_implement_the_request(caplog):
    model, tok = tiny_model("llama")
    prompts = [tok.encode("1+2=")]
    engine = make_engine("native", model, tok)
    engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=3, top_k=5, seed=0))
    assert engine.last_decoder == "torch"
    engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=3, seed=0))
    assert engine.last_decoder == "kernel"
    with pytest.raises(ValueError, match="top-k / top-p"):
        make_engine("native", model, tok, cpu_kernel=True).generate(
            prompts, 2, SamplingParams(temperature=1.0, max_tokens=3, top_p=0.5)
        )
    off = make_engine("native", model, tok, cpu_kernel=False)
    off.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=3, seed=0))
    assert off.last_decoder == "torch"
    bf16, tok = tiny_model("llama")
    assert "float32" in cpu_kernel.unsupported(bf16.to(torch.bfloat16))


def test_lora_model_is_not_run_by_the_kernel():
    import peft  # a dependency of rlvr (LoRA): never skipped

    model, tok = tiny_model("llama")
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    engine = make_engine("native", lora, tok)
    engine.generate([tok.encode("1+2=")], 2, SamplingParams(temperature=1.0, max_tokens=3, seed=0))
    assert engine.last_decoder == "torch"
    assert "wrapped" in cpu_kernel.unsupported(lora.get_base_model())


def test_build_failure_is_reported_not_raised(tmp_path):
    path, why = cpu_kernel.build("false", tmp_path)
    assert path is None and "false" in why
    path, why = cpu_kernel.build("cc-that-does-not-exist-here", tmp_path)
    assert path is None and "failed" in why


def test_concurrent_callers_and_a_forked_child_get_the_same_completions():
    """The C side's thread team serves one job at a time (callers from two Python threads queue),
    and a forked child (a DataLoader worker, say) starts a team of its own."""
    import threading

    model, tok = tiny_model("llama", seed=5)
    prompts = [tok.encode(t) for t in ("1+1=", "22+33=", "9*9=")]
    sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=2)
    want = [c.token_ids for c in make_engine("native", model, tok).generate(prompts, 4, sampling)]

    got: dict[int, list] = {}

    def call(i: int) -> None:
        engine = make_engine("native", model, tok, cpu_threads=2)
        got[i] = [c.token_ids for c in engine.generate(prompts, 4, sampling)]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == {0: want, 1: want, 2: want}

    # A forked child (os.fork, as a DataLoader worker is made) runs its own request: in a fresh
    # interpreter, because whether a child forked from *this* one can run torch ops at all depends
    # on what earlier tests did (GNU OpenMP cannot always run a parallel region in a child forked
    # after the parent ran one: the PyTorch decoder with cpu_threads=5 alone hangs such a child).
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(__file__),
        # This checkout's rlvr, whichever one the interpreter has installed.
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [
                    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    os.environ.get("PYTHONPATH", ""),
                ]
            ),
        },
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "same", proc.stdout[-2000:]


FORK_SCRIPT = """
import os, sys, threading
from rollout_models import tiny_model
from rlvr.rollout import SamplingParams, make_engine

model, tok = tiny_model("llama", seed=5)
prompts = [tok.encode(t) for t in ("1+1=", "22+33=", "9*9=")]
sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=2)
engine = make_engine("native", model, tok, cpu_threads=2)
want = [c.token_ids for c in engine.generate(prompts, 4, sampling)]
assert engine.last_decoder == "kernel"
threads = [threading.Thread(target=engine.generate, args=(prompts, 4, sampling)) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
read_fd, write_fd = os.pipe()
pid = os.fork()
if pid == 0:
    out = [c.token_ids for c in make_engine("native", model, tok, cpu_threads=2).generate(prompts, 4, sampling)]
    os.write(write_fd, b"same" if out == want else b"different")
    os._exit(0)
os.close(write_fd)
_, status = os.waitpid(pid, 0)
print(os.read(read_fd, 64).decode() or f"child-status-{status}")
"""


def test_auto_mode_runs_the_kernel_only_with_blas_and_says_which_decoder_runs(monkeypatch):
    model, tok = tiny_model("llama")
    prompts, sampling = [tok.encode("1+2=")], SamplingParams(temperature=1.0, max_tokens=3, seed=0)
    engine = make_engine("native", model, tok)
    if cpu_kernel.sgemm_pointers()[0] is not None:
        assert engine.describe(sampling) == "native engine: C decode kernel (BLAS sgemm_)"
    assert "not the C kernel: top-k" in engine.describe(SamplingParams(top_k=5))
    # Without BLAS the kernel's matmuls are a scalar loop: auto mode keeps the PyTorch decoder and says why.
    monkeypatch.setattr(cpu_kernel, "sgemm_pointers", lambda: (None, None, "no sgemm_ exported by libtorch_cpu"))
    assert engine.describe(sampling) == (
        "native engine: PyTorch fast decoder, not the C kernel: no usable BLAS "
        "sgemm_ (no sgemm_ exported by libtorch_cpu)"
    )
    engine.generate(prompts, 2, sampling)
    assert engine.last_decoder == "torch"
    forced = make_engine("native", model, tok, cpu_kernel=True)  # asked for explicitly: it runs, and says it is slow
    assert forced.describe(sampling) == "native engine: C decode kernel (portable matmul loop (slow))"
    # bf16 weights never go through BLAS: without sgemm_ the kernel still runs them where they are fast.
    bf16 = make_engine("native", model, tok, compute_dtype="bfloat16")
    bf16.generate(prompts, 2, sampling)
    assert bf16.last_decoder == ("kernel" if cpu_kernel.bf16_fast() else "torch")


def test_engine_measures_cooperating_against_slices_and_gets_the_same_completions(monkeypatch):
    """With few rows per core the engine probes both decodes (cooperating first, by time per token), then keeps one;
    every request gives the same completions whichever ran."""
    model, tok = tiny_model("llama", seed=4)
    engine = make_engine("native", model, tok, cpu_threads=2)
    seen, real = [], cpu_kernel.generate
    monkeypatch.setattr(
        cpu_kernel,
        "generate",
        lambda run, workers, stop=None, coop=None: seen.append(coop) or real(run, workers, stop, coop),
    )
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=5)
    prompts = [tok.encode("12+3="), tok.encode("4*4=")]
    outs = [[c.token_ids for c in engine.generate(prompts, 3, sampling)] for _ in range(8)]
    probes = 2 * engine.kernel_coop.PROBE
    assert seen[:probes] == [True, False] * engine.kernel_coop.PROBE  # taking turns
    assert len(set(seen[probes:])) == 1 and seen[probes] == engine.kernel_coop.chosen
    assert all(o == outs[0] for o in outs)
    engine.close()
