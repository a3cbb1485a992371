"""Prompt rendering and tokenization (rlvr.tasks.prompts) and the engines' left padding."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from rlvr.models import tiny_model_path
from rlvr.rollout.common import left_pad
from rlvr.tasks.prompts import encode_prompts, render_prompt


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def test_a_batch_of_mixed_prompts_tokenizes_as_one_prompt_at_a_time(tok):
    """Plain prompts get the tokenizer's special tokens, rendered chats only their template's; one call per kind
    must give every prompt its own ids, in the order given."""
    chat = [{"role": "user", "content": "12+30="}]
    prompts = ["7+8=", chat, "40+2=", [{"role": "user", "content": "1+1="}], "99+1="]
    one_by_one = [tok(render_prompt(tok, p), add_special_tokens=isinstance(p, str))["input_ids"] for p in prompts]
    assert encode_prompts(tok, prompts) == one_by_one
    assert one_by_one[0] != tok(render_prompt(tok, "7+8="), add_special_tokens=False)["input_ids"]  # kinds differ
    assert encode_prompts(tok, prompts, max_prompt_length=3) == [ids[-3:] for ids in one_by_one]
    assert encode_prompts(tok, []) == []


def test_left_pad_puts_every_prompt_against_the_right_edge():
    ids_BP, mask_BP = left_pad([[5, 6, 7], [8], [9, 10]], 0, "cpu")
    assert torch.equal(ids_BP, torch.tensor([[5, 6, 7], [0, 0, 8], [0, 9, 10]]))
    assert torch.equal(mask_BP, torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]]))
    assert ids_BP.dtype == mask_BP.dtype == torch.long
