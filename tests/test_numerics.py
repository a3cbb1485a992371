"""The derived float32 bound (tests/numerics.py) passes a float32 re-evaluation and fails a real defect."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_logits_match_hf, last_logits


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
    )
    return LlamaForCausalLM(cfg).float().eval()


def test_bound_accepts_the_same_function_in_another_summation_order():
    model = _model()
    rows = [[3, 5, 7, 9], [4, 4, 8]]
    # The same logits computed through a padded batch: another float32 evaluation order.
    with torch.no_grad():
        ids = torch.tensor([[0, 3, 5, 7, 9], [0, 0, 4, 4, 8]])
        mask = (torch.arange(5) >= torch.tensor([[1], [2]])).long()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        batched = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    assert_logits_match_hf(batched, model, rows)


@pytest.mark.parametrize("defect", [1e-4, 1e-3])
def test_bound_rejects_a_small_real_defect(defect):
    model = _model()
    rows = [[3, 5, 7, 9], [4, 4, 8]]
    shifted = last_logits(model, rows, torch.float32).clone()
    shifted[0, 7] += defect  # one logit off: what a wrong bias or mask would do, far smaller
    with pytest.raises(AssertionError, match="float32 error"):
        assert_logits_match_hf(shifted, model, rows)
