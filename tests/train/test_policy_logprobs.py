"""The chunked log-prob head inside a real model's forward: equal to the plain full-logits path in value and in
the gradient of every trainable parameter (tied embeddings, untied heads, LoRA, gradient checkpointing)."""

from __future__ import annotations

import functools
import inspect
import re

import pytest
import torch

from rlvr import core, policy_logprobs
from rlvr.policy_logprobs import PLAIN_HEAD_MODEL_TYPES, completion_logprobs, plain_linear_head

V = 61


def _llama(tied=True):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(cfg).double()


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg).double()


def _batch(N=4, P=5, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (N, P + T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return ids, mask, pos, ids[:, P:]


@pytest.fixture
def small_chunks(monkeypatch):
    """Three tokens per chunk, so the integration crosses chunk boundaries as a real vocabulary would."""
    chunked = functools.partial(core.head_logprobs, chunk_elements=3 * V)
    monkeypatch.setattr(policy_logprobs.core, "head_logprobs", chunked)


def _grads(model, chunked, temperature=0.8):
    model.zero_grad(set_to_none=True)
    ids, mask, pos, comp = _batch()
    logp, ent = completion_logprobs(model, ids, mask, pos, comp, temperature, with_entropy=True, chunked=chunked)
    w = torch.linspace(-1, 1, logp.numel(), dtype=torch.float64).view_as(logp)
    (logp * w).sum().backward()
    return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(model):
    assert plain_linear_head(model) is not None
    logp_a, ent_a, g_a = _grads(model, chunked=True)
    logp_b, ent_b, g_b = _grads(model, chunked=False)
    assert torch.allclose(logp_a, logp_b, rtol=0, atol=1e-12)
    assert torch.allclose(ent_a, ent_b, rtol=0, atol=1e-12)
    assert g_a.keys() == g_b.keys() and g_a
    for name in g_a:
        assert torch.allclose(g_a[name], g_b[name], rtol=0, atol=1e-11), name


@pytest.mark.parametrize("build", [functools.partial(_llama, tied=True), functools.partial(_llama, tied=False), _qwen3])
def test_full_fine_tuning_matches_the_plain_path(build, small_chunks):
    model = build()
    _assert_same(model)
    # The head really trains (tied: through the embedding too) and the model's head is itself again.
    assert model.get_output_embeddings().weight.grad is not None
    assert "forward" not in vars(model.get_output_embeddings())


def test_gradient_checkpointing_matches_the_plain_path(small_chunks):
    model = _llama()
    model.gradient_checkpointing_enable()
    model.train()
    _assert_same(model)


def test_lora_adapters_match_and_the_frozen_head_gets_no_gradient(small_chunks):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for n, p in model.named_parameters():  # random B so the adapters change the output
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    _assert_same(model)
    _, _, grads = _grads(model, chunked=True)
    assert grads and all("lora_" in n for n in grads)
    with model.disable_adapter():  # the LoRA reference: the base model
        ids, mask, pos, comp = _batch()
        with torch.no_grad():
            a, _ = completion_logprobs(model, ids, mask, pos, comp, 1.0)
            b, _ = completion_logprobs(model, ids, mask, pos, comp, 1.0, chunked=False)
    assert torch.allclose(a, b, rtol=0, atol=1e-12)
    with torch.no_grad():
        adapted, _ = completion_logprobs(model, ids, mask, pos, comp, 1.0)
    assert (adapted - a).abs().max() > 1e-6


def test_lora_with_gradient_checkpointing_trains_the_adapters(small_chunks):
    """Checkpointing enabled before the adapter is added (as load_model does): the adapters still get the
    gradient of the un-checkpointed model (a reentrant checkpoint whose inputs need no grad would give none)."""
    from peft import LoraConfig, get_peft_model

    def build(ckpt):
        base = _llama()
        if ckpt:
            base.gradient_checkpointing_enable()
            base.config.use_cache = False
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
        for n, p in model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(len(n)))
        return model.train()

    _, _, with_ckpt = _grads(build(True), chunked=True)
    _, _, without = _grads(build(False), chunked=True)
    assert with_ckpt.keys() == without.keys() and any("lora_A" in n for n in with_ckpt)
    for name in without:
        assert without[name].abs().max() > 0
        assert torch.allclose(with_ckpt[name], without[name], rtol=0, atol=1e-11), name


def test_adapted_head_and_post_processed_logits_take_the_plain_path():
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma2Config, Gemma2ForCausalLM

    model = get_peft_model(_llama(tied=False), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert plain_linear_head(model) is None
    gemma = Gemma2ForCausalLM(
        Gemma2Config(
            vocab_size=V,
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        )
    )
    assert plain_linear_head(gemma) is None  # final_logit_softcapping changes the logits after the head


def test_head_is_restored_when_the_forward_fails():
    model = _llama()
    ids, mask, pos, comp = _batch()
    with pytest.raises(Exception):
        completion_logprobs(model, ids[:, :3], mask, pos, comp, 1.0)  # ids and mask disagree
    assert "forward" not in vars(model.get_output_embeddings())


@pytest.mark.parametrize("model_type", sorted(PLAIN_HEAD_MODEL_TYPES))
def test_listed_architectures_return_the_head_output_untouched(model_type):
    """The chunked head is exact only if the model's forward does nothing to the logits after the head:
    read the installed transformers' forward and check that `logits` is never reassigned after it."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    src = inspect.getsource(cls.forward)
    assert "self.lm_head(" in src
    after = src.split("self.lm_head(", 1)[1]
    # An assignment statement to `logits` (not the `logits=logits,` keyword of the returned output).
    reassigned = re.search(r"^\s*logits\s*[-+*/]?=(?!=).*[^,\s]\s*$", after, flags=re.M)
    assert reassigned is None, f"{cls.__name__} post-processes logits: {reassigned.group(0).strip()}"
