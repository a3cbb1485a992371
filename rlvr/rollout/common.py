"""Pieces every backend shares: EOS resolution, stop strings, the sampling kernel, seeds.

Log-prob contract (docs/rollout.md): a completion's ``logprobs`` are the log-probs of the sampled tokens
under the distribution they were **actually drawn from**: ``log_softmax`` of the logits after the
repetition penalty, temperature and the top-k / top-p / min-p filters, in the engine's own order
(vLLM's ``processed_logprobs``). The trainer's importance correction divides the live policy's
probability by the behaviour policy's, and the behaviour policy is the filtered one: reporting the
unfiltered ``log_softmax(logits / T)`` instead would hide exactly the off-policy gap the filters
create (the mismatch metrics would read zero while the samples come from a different distribution).
Without filters or penalty (the GRPO default) the two are the same number. ``temperature == 0`` means
greedy decoding, whose sampling distribution is a point mass; its log-probs are reported at T = 1
before any penalty or filter (``log_softmax(logits)``), which is what the trainer recomputes.

Seeds: a request's ``seed`` owns the noise streams ``stream_seed(seed, 0 .. N-1)``, one per
completion, so no two completions of a run share a stream (see ``stream_seed``).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator, Sequence

import torch

from rlvr.rollout.base import Completion, FinishReason, SamplingParams


def validate_request(prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> None:
    """One clear error for a malformed request, before any model work starts."""
    if n < 1:
        raise ValueError(f"n (completions per prompt) must be >= 1, got {n}; set num_generations to 1 or more.")
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError(
            "every prompt must have at least one token; got an empty batch or an empty prompt. "
            "Check that the chat template / tokenizer produced ids for each prompt."
        )
    if sampling.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {sampling.temperature}.")
    if not 0.0 < sampling.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}; use 1.0 to disable it.")
    if sampling.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = disabled), got {sampling.top_k}.")
    if not 0.0 <= sampling.min_p < 1.0:
        raise ValueError(f"min_p must be in [0, 1), got {sampling.min_p}; use 0.0 to disable it.")
    if sampling.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1.0 = off), got {sampling.repetition_penalty}.")
    if sampling.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {sampling.max_tokens}.")
    if isinstance(sampling.stop, str):
        raise TypeError(
            f"sampling.stop must be a tuple of strings, got the string {sampling.stop!r}; write ({sampling.stop!r},)."
        )


def resolve_eos_ids(model, tokenizer, override: int | Sequence[int] | None = None) -> tuple[int, ...]:
    """The token ids that end a completion: an explicit override, else the model's generation config
    (which may list several, e.g. Qwen's <|im_end|> and <|endoftext|>), else the tokenizer's EOS."""
    if override is not None:
        ids = [override] if isinstance(override, int) else list(override)
    else:
        gen_cfg = getattr(model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        if eos is None:
            eos = getattr(tokenizer, "eos_token_id", None)
        ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if not ids:
        raise ValueError(
            "could not find an end-of-sequence token: neither model.generation_config.eos_token_id nor "
            "tokenizer.eos_token_id is set. Set one of them, or pass eos_token_ids=... to make_engine."
        )
    return tuple(int(i) for i in ids)


def resolve_pad_id(tokenizer, eos_ids: tuple[int, ...]) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else eos_ids[0]


def _first_stop_end(text: str, stops: Sequence[str]) -> int | None:
    """Character index just past the earliest-ending stop string in ``text``, or None."""
    ends = [text.find(s) + len(s) for s in stops if s and s in text]
    return min(ends) if ends else None


def stop_prefix_length(token_ids: Sequence[int], tokenizer, stops: Sequence[str]) -> int | None:
    """Length of the shortest prefix of ``token_ids`` whose text contains a stop string, or None.

    Cost: one decode per prefix length tried, binary-searched (once a prefix contains a stop string,
    every longer prefix does too), so O(T log T) characters decoded per completion.
    """
    if not stops:
        return None
    if _first_stop_end(tokenizer.decode(list(token_ids)), stops) is None:
        return None
    lo, hi = (
        1,
        len(token_ids),
    )  # invariant: the prefix of length hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if _first_stop_end(tokenizer.decode(list(token_ids[:mid])), stops) is not None:
            hi = mid
        else:
            lo = mid + 1
    return hi


def cut_at_eos(
    token_ids: list[int], logprobs: list[float] | None, eos_ids: set[int]
) -> tuple[list[int], list[float] | None, bool]:
    """``(ids, logprobs, hit_eos)`` cut right after the first EOS, which stays (the trainer's
    completion mask keeps it): what ``make_completion`` expects from a server's raw output."""
    cut = next((i + 1 for i, t in enumerate(token_ids) if t in eos_ids), None)
    if cut is None:
        return token_ids, logprobs, False
    return token_ids[:cut], None if logprobs is None else logprobs[:cut], True


def make_completion(
    prompt_index: int,
    token_ids: list[int],
    logprobs: list[float] | None,
    hit_eos: bool,
    tokenizer,
    stops: Sequence[str],
    extra: dict | None = None,
    text: str | None = None,
) -> Completion:
    """Build a Completion from raw sampled ids, applying stop strings and decoding the text.

    ``token_ids`` must already be cut after the first EOS (``hit_eos`` says whether one is there);
    the EOS stays in the ids (the trainer's completion mask keeps it) but not in ``text``.
    Stop strings: the ids are cut after the token that completes the stop string (so the policy is
    trained to stop there) and the text right after the stop string, which is kept (so a format
    checker looking for ``</answer>`` still sees it; vLLM's ``include_stop_str_in_output=True``).
    ``text``, when given, is ``token_ids`` already decoded without special tokens (callers batch-decode).
    """
    finish: FinishReason = "stop" if hit_eos else "length"
    n_keep = stop_prefix_length(token_ids, tokenizer, stops) if stops else None
    if n_keep is not None:
        token_ids = token_ids[:n_keep]
        logprobs = None if logprobs is None else logprobs[:n_keep]
        finish = "stop"
    if text is None or n_keep is not None:
        text = tokenizer.decode(list(token_ids), skip_special_tokens=True)
    if n_keep is not None:
        end = _first_stop_end(text, stops)
        text = text if end is None else text[:end]
    return Completion(
        prompt_index=prompt_index,
        token_ids=list(token_ids),
        text=text,
        finish_reason=finish,
        logprobs=logprobs,
        extra=dict(extra or {}),
    )


def batch_decode(tokenizer, ids: list[list[int]]) -> list[str]:
    """``tokenizer.batch_decode(ids, skip_special_tokens=True)``, through the Rust tokenizer directly
    when that gives the same text: transformers' wrapper walks every id through ``to_py_obj`` /
    ``isinstance`` first, which measured ~20% of a short-completion rollout of the tiny model."""
    fast = getattr(tokenizer, "_tokenizer", None)
    if (
        fast is not None
        and hasattr(fast, "decode_batch")
        and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
    ):
        return fast.decode_batch(ids, skip_special_tokens=True)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def left_pad(prompt_ids: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``ids_BP`` and ``mask_BP`` (1 = real token), the layout decoders want: every row's
    next token goes in the same column."""
    P = max(len(p) for p in prompt_ids)
    # Rows built as lists and converted once (a tensor write per row costs more than the whole list).
    ids_BP = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in prompt_ids], dtype=torch.long)
    mask_BP = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompt_ids], dtype=torch.long)
    return ids_BP.to(device), mask_BP.to(device)


@contextlib.contextmanager
def policy_eval(model: torch.nn.Module) -> Iterator[None]:
    """Sample from the live policy: eval mode (no dropout) and no autograd, then restore the previous
    mode so the trainer's next forward is unaffected. Never copies weights."""
    was_training = model.training
    if was_training:  # .eval() walks every submodule: skip it when there is nothing to switch
        model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train(True)


#: Noise streams one request may own: request seed ``s`` owns the seeds ``[s·2^20, (s+1)·2^20)``.
SEED_STRIDE = 1 << 20
_SEED_BLOCKS = 1 << 43  # 2^43 blocks of 2^20 seeds: every stream seed fits in a signed 64-bit int


def stream_seed(seed: int, index: int) -> int:
    """The seed of noise stream ``index`` (completion ``index`` of the request, prompt-major) of a request
    seeded ``seed``: ``(seed mod 2^43) · 2^20 + index``.

    Engines that seed one stream per completion or per prompt (vLLM gives child ``j`` of a prompt the
    seed ``prompt_seed + j``; a server takes one seed per request) use this so that completions never
    share a stream: within a request the indexes differ, and consecutive request seeds (the trainer's
    ``base + generation``) own disjoint blocks. Handing every prompt the request seed instead gives
    child ``j`` of every prompt the same noise, and request ``s + 1`` the streams of request ``s``
    shifted by one: correlated samples. Engines that draw a whole request from one seeded generator
    (``hf``, ``native``) need no spacing. A request may hold up to 2^20 completions; servers that
    keep 32 bits of a seed (llama.cpp) see the streams recur every 4,096 request seeds.
    """
    if not 0 <= index < SEED_STRIDE:
        raise ValueError(
            f"a request holds at most {SEED_STRIDE} completions (one noise stream each), got index {index}; "
            "split the request into smaller batches."
        )
    return (int(seed) % _SEED_BLOCKS) * SEED_STRIDE + index


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


class TokenSampler:
    """The per-step sampling kernel for the native engine, specialised once per request so the
    default GRPO case (T > 0, no filters, no penalty) costs three kernels: log_softmax, multinomial,
    gather. Filters follow transformers' order (repetition penalty, temperature, top-k, top-p,
    min-p) so greedy and filtered decoding reproduce ``generate`` token for token. Reported log-probs
    are those of the distribution sampled from (the module's contract): filtered when filters are on.
    """

    def __init__(
        self,
        sampling: SamplingParams,
        vocab_size: int,
        generator: torch.Generator | None,
    ):
        self.sampling = sampling
        self.greedy = sampling.temperature == 0.0
        self.inv_temperature = 1.0 if self.greedy else 1.0 / sampling.temperature
        self.use_penalty = sampling.repetition_penalty != 1.0
        self.filtered = (not self.greedy) and (
            sampling.top_k > 0 or sampling.top_p < 1.0 or sampling.min_p > 0.0 or self.use_penalty
        )
        self.vocab_size = vocab_size
        self.generator = generator

    def __call__(self, logits_MV: torch.Tensor, seen_MV: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(token_M, logp_M)``: the sampled token and its log-prob under the distribution it was
        drawn from (log_softmax(logits / T), after the penalty and filters when there are any)."""
        logits_MV = logits_MV.float()
        logp_MV = torch.log_softmax(
            logits_MV * self.inv_temperature if self.inv_temperature != 1.0 else logits_MV,
            dim=-1,
        )
        if self.greedy:
            scores_MV = (
                apply_repetition_penalty(logits_MV, seen_MV, self.sampling.repetition_penalty)
                if self.use_penalty
                else logits_MV
            )
            token_M = scores_MV.argmax(dim=-1)
        elif not self.filtered:
            token_M = sample_categorical(logp_MV.exp(), self.generator)
        else:
            scores_MV = logits_MV
            if self.use_penalty:
                scores_MV = apply_repetition_penalty(scores_MV, seen_MV, self.sampling.repetition_penalty)
            scores_MV = filter_logits(scores_MV * self.inv_temperature, self.sampling)
            logp_MV = torch.log_softmax(scores_MV, dim=-1)
            token_M = sample_categorical(logp_MV.exp(), self.generator)
        return token_M, logp_MV.gather(1, token_M[:, None]).squeeze(1)


def sample_categorical(probs_MV: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row by inverting the CDF: M uniforms instead of the M·V exponentials that
    ``torch.multinomial`` draws on CPU (measured here: ~40 µs vs ~300 µs for M=64, V=100, a large
    share of a tiny model's decode step). Same distribution; a different random stream."""
    cdf_MV = probs_MV.cumsum(dim=-1)
    u_M1 = torch.rand(probs_MV.shape[0], 1, device=probs_MV.device, generator=generator) * cdf_MV[:, -1:]
    # right=True: a token of probability 0 (filtered, cdf flat) can never be chosen, even when u
    # lands exactly on a cdf value.
    return torch.searchsorted(cdf_MV, u_M1, right=True).squeeze(1).clamp_(max=probs_MV.shape[1] - 1)


def apply_repetition_penalty(logits_MV: torch.Tensor, seen_MV: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019) as transformers applies it: tokens already in the
    prompt or completion have positive logits divided by ``penalty`` and negative ones multiplied."""
    penalised_MV = torch.where(logits_MV < 0, logits_MV * penalty, logits_MV / penalty)
    return torch.where(seen_MV, penalised_MV, logits_MV)


def filter_logits(scores_MV: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """top-k, then top-p (nucleus, Holtzman et al. 2020), then min-p (Nguyen et al. 2024) on
    temperature-scaled scores; removed tokens get -inf. At least one token always survives."""
    neg_inf = torch.finfo(scores_MV.dtype).min
    if sampling.top_k > 0:
        k = min(sampling.top_k, scores_MV.shape[-1])
        kth_M1 = scores_MV.topk(k, dim=-1).values[:, -1:]
        scores_MV = scores_MV.masked_fill(scores_MV < kth_M1, neg_inf)
    if sampling.top_p < 1.0:
        sorted_MV, order_MV = scores_MV.sort(dim=-1, descending=False)
        cum_MV = sorted_MV.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted_MV = cum_MV <= (1 - sampling.top_p)
        drop_sorted_MV[:, -1] = False  # keep the most likely token
        scores_MV = scores_MV.masked_fill(drop_sorted_MV.scatter(1, order_MV, drop_sorted_MV), neg_inf)
    if sampling.min_p > 0.0:
        probs_MV = scores_MV.softmax(dim=-1)
        threshold_M1 = sampling.min_p * probs_MV.amax(dim=-1, keepdim=True)
        scores_MV = scores_MV.masked_fill(probs_MV < threshold_M1, neg_inf)
    return scores_MV


# Below this hidden size a model's ops take microseconds and OpenMP's fork/join per op costs as much, so the
# native engine's decoder and the trainer's passes run them on one thread (docs/rollout.md, docs/performance.md).
ONE_THREAD_BELOW_HIDDEN = 512


def one_thread_suits(model) -> bool:
    """Whether ``model`` is small enough that its ops run best on one CPU thread (``ONE_THREAD_BELOW_HIDDEN``)."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    return hidden is not None and hidden < ONE_THREAD_BELOW_HIDDEN


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` within the block (no-op for None), restored after."""
    previous = torch.get_num_threads()
    switch = threads is not None and threads != previous
    if switch:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if switch:
            torch.set_num_threads(previous)


class FasterOf:
    """Ways of doing the same work, chosen between by measuring them where they run: every ``WINDOW`` uses start
    with ``PROBE`` uses of each candidate, taken in turn (first, second, ..., first, second, ...; the first is the
    one expected to win), the caller reporting each use's cost (``record``); the rest of the window runs the
    candidate with the lowest median cost. On a shared machine which one wins changes with the load (a way that
    splits work across cores waits for descheduled siblings), so every window measures again. Taking turns gives
    the candidates the same share of a load that comes and goes over seconds, and of a run's drift (an early step
    costs more than a later one), where probing one candidate's uses after the other's measured the machine's
    moment as much as the candidate. With one candidate it is simply that one."""

    PROBE = 3  # uses per candidate per window: a median of 3 ignores one slow first call
    WINDOW = 100

    def __init__(self, candidates: list):
        self.candidates = list(candidates)
        self.chosen = self.candidates[0]
        self._uses, self._costs = 0, {i: [] for i in range(len(self.candidates))}

    def _probing(self) -> int | None:
        """The candidate index this use probes, or None once the window's probes are done."""
        k, n = self._uses % self.WINDOW, len(self.candidates)
        return k % n if n > 1 and k < self.PROBE * n else None

    def current(self):
        i = self._probing()
        return self.chosen if i is None else self.candidates[i]

    def record(self, cost: float) -> None:
        """The cost (seconds, or seconds per unit of work) of the use ``current`` just gave."""
        i, n = self._probing(), len(self.candidates)
        if i is not None:
            k = self._uses % self.WINDOW
            self._costs[i] = ([] if k < n else self._costs[i]) + [cost]  # a window's first probe starts afresh
            if k == self.PROBE * n - 1:
                best = min(range(n), key=lambda j: statistics.median(self._costs[j]))
                self.chosen = self.candidates[best]
        self._uses += 1
