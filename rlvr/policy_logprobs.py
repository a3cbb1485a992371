"""Completion log-probs of a Hugging Face causal LM without full-vocabulary logits.

The model's forward runs as usual (through its DDP and PEFT wrappers, so DDP's gradient hooks and LoRA
adapters act) with its output head made to pass the final hidden states through; those and the head's
weight go to :func:`rlvr.core.head_logprobs`, which computes the log-probs (and entropy) a chunk of tokens
at a time. Architectures whose forward changes the logits after the head (Gemma 2/3 soft-capping,
Granite's and Cohere's logit scaling) or whose head is not a plain ``nn.Linear`` (a LoRA-adapted head)
take the plain path: full logits, then :func:`rlvr.core.token_logprobs`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from rlvr import core

# Model types whose ``ForCausalLM.forward`` returns ``lm_head(hidden_states)`` untouched (checked against the
# installed transformers' source by tests/train/test_policy_logprobs.py).
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "ministral",
        "qwen2",
        "qwen3",
        "qwen2_moe",
        "qwen3_moe",
        "phi",
        "phi3",
        "olmo",
        "olmo2",
        "smollm3",
        "gemma",
        "glm4",
        "deepseek_v3",
    }
)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model


def plain_linear_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output head when the chunked path computes exactly what the model would, else None."""
    inner = _unwrap(model)
    config = getattr(inner, "config", None)
    get_head = getattr(inner, "get_output_embeddings", None)
    if config is None or get_head is None or getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    head = get_head()
    return head if type(head) is torch.nn.Linear else None  # a LoRA-wrapped head is not a plain Linear


@contextmanager
def _head_passes_hidden_states(head: torch.nn.Linear) -> Iterator[None]:
    """Within the block, ``head(x)`` returns ``x``: the model's ``logits`` output are its final hidden states."""
    head.forward = lambda x: x  # an instance attribute shadows the class's forward; deleted on exit
    try:
        yield
    finally:
        del head.forward


def completion_logprobs(
    model: torch.nn.Module,
    input_ids_NL: torch.Tensor,
    attention_mask_NL: torch.Tensor,
    position_ids_NL: torch.Tensor,
    completion_ids_NT: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    chunked: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward over [prompt | completion] -> log-probs (and detached entropy) of the T completion tokens
    under ``softmax(logits / temperature)``. Only the last T+1 positions reach the head."""
    T = completion_ids_NT.shape[1]
    head = plain_linear_head(model) if chunked else None
    kwargs = dict(
        input_ids=input_ids_NL,
        attention_mask=attention_mask_NL,
        position_ids=position_ids_NL,
        use_cache=False,
        logits_to_keep=T + 1,
    )
    if head is not None:
        with _head_passes_hidden_states(head):
            hidden_NTH = model(**kwargs).logits[:, :-1, :]  # position t predicts token t+1
        weight, bias = head.weight, head.bias
        device_type = hidden_NTH.device.type
        if torch.is_autocast_enabled(device_type):
            # Mixed precision: the head's matmuls in the autocast dtype, as the model's own head would run
            # them; one differentiable cast of the weight here rather than one per chunk inside the head.
            low = torch.get_autocast_dtype(device_type)
            weight, bias = weight.to(low), None if bias is None else bias.to(low)
            hidden_NTH = hidden_NTH.to(low)
        return core.head_logprobs(hidden_NTH, weight, completion_ids_NT, temperature, bias, with_entropy=with_entropy)
    logits_NTV = model(**kwargs).logits[:, :-1, :]
    logp_NT = core.token_logprobs(logits_NTV, completion_ids_NT, temperature=temperature)
    ent_NT = core.entropy_from_logits(logits_NTV.detach(), temperature=temperature) if with_entropy else None
    return logp_NT, ent_NT
