"""``hf``: rollouts through ``transformers.generate`` — the reference every other backend is tested against.

It is what TRL's default path does (each prompt repeated G times via ``num_return_sequences``, so the
prompt is recomputed G times); it is correct for any causal LM and slow. Use ``native`` to train.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.common import (
    batch_decode,
    left_pad,
    make_completion,
    policy_eval,
    resolve_eos_ids,
    resolve_pad_id,
    stop_prefix_length,
    validate_request,
)


class _StopStrings(StoppingCriteria):
    """Per-row stop-string check; decodes each row's completion every step (the reference path, so
    clarity over speed). Rows that already stopped are frozen by generate with pad tokens."""

    def __init__(self, tokenizer, stops: Sequence[str], prompt_len: int):
        self.tokenizer, self.stops, self.prompt_len = (
            tokenizer,
            tuple(stops),
            prompt_len,
        )

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.BoolTensor:
        done = [
            stop_prefix_length(row[self.prompt_len :].tolist(), self.tokenizer, self.stops) is not None
            for row in input_ids
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class HFEngine:
    """Samples from the live policy with ``model.generate``. ``samples_live_policy = True``."""

    samples_live_policy = True
    receives_weights = True  # trivially: it *is* the policy
    reports_logprobs = True
    policy_lag = 0

    def describe(self, sampling: SamplingParams) -> str:
        return "hf engine: transformers generate on the live policy"

    def __init__(self, model, tokenizer, eos_token_ids: int | Sequence[int] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = resolve_eos_ids(model, tokenizer, eos_token_ids)
        self.pad_id = resolve_pad_id(tokenizer, self.eos_ids)

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        validate_request(prompt_ids, n, sampling)
        device = next(self.model.parameters()).device
        ids_BP, mask_BP = left_pad(prompt_ids, self.pad_id, device)
        P = ids_BP.shape[1]
        greedy = sampling.temperature == 0.0
        # Every knob passed explicitly: a model's generation_config may carry its own defaults
        # (top_k=50 in transformers, Qwen's top_p=0.8 / repetition_penalty=1.05) that would silently
        # change what "temperature=1, no filters" means.
        kwargs = {
            "do_sample": not greedy,
            "temperature": None if greedy else sampling.temperature,
            "top_k": 0 if greedy else sampling.top_k,
            "top_p": None if greedy else sampling.top_p,
            "min_p": None if greedy or sampling.min_p == 0.0 else sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "max_new_tokens": sampling.max_tokens,
            "min_new_tokens": 0,
            # Greedy rows of one prompt are identical (and generate refuses n > 1 without sampling):
            # decode once per prompt and repeat the result below.
            "num_return_sequences": 1 if greedy else n,
            "num_beams": 1,
            "eos_token_id": list(self.eos_ids),
            "pad_token_id": self.pad_id,
            # Sampling reports the distribution drawn from: generate's processed scores (penalty,
            # temperature, filters applied; removed tokens -inf). Greedy reports raw logits at T = 1.
            "output_scores": not greedy,
            "output_logits": greedy,
            "return_dict_in_generate": True,
            "use_cache": True,
        }
        if sampling.stop:
            kwargs["stopping_criteria"] = StoppingCriteriaList([_StopStrings(self.tokenizer, sampling.stop, P)])
        devices = [device] if device.type == "cuda" else []
        with (
            policy_eval(self.model),
            torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None),
        ):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(input_ids=ids_BP, attention_mask=mask_BP, **kwargs)
        tokens_NC = out.sequences[:, P:]
        # The sampling distribution's log-prob of the sampled token; greedy: T = 1 (rlvr.rollout.common).
        logits_NCV = torch.stack(out.logits if greedy else out.scores, dim=1).float()
        logp_NC = torch.log_softmax(logits_NCV, dim=-1).gather(2, tokens_NC[:, :, None]).squeeze(2)
        is_eos_NC = torch.isin(tokens_NC, torch.tensor(self.eos_ids, device=tokens_NC.device))
        tokens, logps, eos_hits = (
            tokens_NC.tolist(),
            logp_NC.tolist(),
            is_eos_NC.tolist(),
        )

        rows = [i for i in range(len(prompt_ids)) for _ in range(n)] if greedy else range(len(prompt_ids) * n)
        lengths = [eos_hits[row].index(True) + 1 if True in eos_hits[row] else len(eos_hits[row]) for row in rows]
        ids = [tokens[row][:length] for row, length in zip(rows, lengths)]
        texts = batch_decode(self.tokenizer, ids)
        return [
            make_completion(
                prompt_index=i // n,
                token_ids=row_ids,
                logprobs=logps[row][: len(row_ids)],
                hit_eos=eos_hits[row][len(row_ids) - 1],
                tokenizer=self.tokenizer,
                stops=sampling.stop,
                text=text,
            )
            for i, (row, row_ids, text) in enumerate(zip(rows, ids, texts))
        ]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """No-op: the engine samples from the live policy object, so it is always current."""

    def close(self) -> None:
        pass
