"""Float32 tolerances derived from the computation, not picked by hand.

A fast decoder and the Hugging Face forward are two float32 evaluations of the same function that
sum in different orders (fused projections, blocked GEMMs, another attention reduction, MKL or the C
kernel's own loops). Neither is "the" answer: both carry float32 rounding whose size depends on the
model's depth, widths and weights, and on which SIMD path the CPU takes. A fixed ``atol=1e-5`` is
therefore a guess that holds on one machine and fails on another.

So compare both against the same function in float64 (rounding ~1e-16, i.e. exact here) and require
the candidate's error to be within a small factor of the reference implementation's own float32
error on the same inputs:

    max |candidate - f64|  <=  FACTOR * max(max |hf_f32 - f64|,  eps32 * max |f64|)

The reference error is measured, so the bound scales with whatever the computation really costs on
the machine that runs the test; the floor (one float32 ulp of the largest value) keeps the bound
meaningful when the reference happens to be almost exact. FACTOR allows a different but equally
valid summation order: the error of a sum of K terms is bounded by ~K·eps in any order, and the
observed ratio between the two implementations' errors stayed within 0.1x–3.6x over the
architectures in these tests, with PyTorch's AVX-512, AVX2 and scalar kernels
(``ATEN_CPU_CAPABILITY``) and MKL's conditional-numerical-reproducibility paths (``MKL_CBWR``). A real
bug (a wrong position, a missing bias, a mask off by one) moves logits by 1e-2 or more, ~1000x above
the bound, so the test keeps its teeth.
"""

from __future__ import annotations

import copy

import torch

EPS32 = torch.finfo(torch.float32).eps
FACTOR = 16.0

_f64_models: dict[int, torch.nn.Module] = {}


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 twin of ``model`` (cached per model object: tests build their model once)."""
    key = id(model)
    if key not in _f64_models:
        _f64_models.clear()  # one model at a time: tests do not interleave models
        _f64_models[key] = copy.deepcopy(model).to(torch.float64).eval()
    return _f64_models[key]


@torch.no_grad()
def sequence_logits(model: torch.nn.Module, seq: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Logits at every position of one unpadded sequence, from ``model`` in ``dtype``."""
    m = model if dtype == torch.float32 else float64_copy(model)
    return m(torch.tensor([seq])).logits[0].to(dtype)


def last_logits(model: torch.nn.Module, rows: list[list[int]], dtype: torch.dtype) -> torch.Tensor:
    """The last position's logits of each row, each row run on its own (what the trainer sees)."""
    return torch.stack([sequence_logits(model, r, dtype)[-1] for r in rows])


def bound(ref32: torch.Tensor, ref64: torch.Tensor) -> float:
    """The error a float32 evaluation of this computation is allowed: see the module docstring."""
    ref_err = (ref32.double() - ref64).abs().max().item()
    floor = EPS32 * ref64.abs().max().item()
    return FACTOR * max(ref_err, floor)


def assert_fp32_close(actual: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor, what: str = "") -> None:
    """``actual`` (float32) is as close to the float64 truth as the float32 reference is, up to FACTOR."""
    assert actual.shape == ref64.shape, (actual.shape, ref64.shape)
    err = (actual.double() - ref64).abs().max().item()
    allowed = bound(ref32, ref64)
    ref_err = (ref32.double() - ref64).abs().max().item()
    assert err <= allowed, (
        f"{what} float32 error {err:.3g} vs float64 exceeds {allowed:.3g} "
        f"({FACTOR:g} x the reference float32 error {ref_err:.3g}, floor eps32*max|x|)"
    )


def assert_logits_match_hf(actual: torch.Tensor, model: torch.nn.Module, rows: list[list[int]], what: str = "") -> None:
    """The last-position logits of each row equal the Hugging Face forward's, within the derived bound."""
    assert_fp32_close(actual, last_logits(model, rows, torch.float32), last_logits(model, rows, torch.float64), what)
