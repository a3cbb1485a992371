"""The shared-prompt forward (each distinct prompt run once, its completions attend to its cached keys and
values) gives the one-forward path's completion log-probs, GRPO loss and parameter gradients: full fine-tuning,
LoRA, a reference model (beta > 0, LoRA's adapter-off reference too), GSPO's sequence-level ratio, micro-batches
that cut a group, ragged prompt and completion lengths. Float64 models, so both paths are exact up to rounding."""

from __future__ import annotations

import functools

import pytest
import torch
from test_policy_logprobs import _qwen3  # the same small float64 Qwen3 the chunked-head tests use

from rlvr import core, policy_logprobs
from rlvr.batch import Rollouts, pack
from rlvr.builders import build_loss_settings
from rlvr.config import load_config
from rlvr.policy_logprobs import completion_logprobs, length_buckets, shared_prompt_unsupported
from rlvr.rollout.base import Completion

V, PAD = 61, 0
PACKING_PAYS = policy_logprobs.packing_pays  # the real one: the autouse fixture below forces a path per test
EPS64 = torch.finfo(torch.float64).eps
# Both paths compute the same sums of the same float64 products in other groupings (another batch shape for
# the matmuls, a prompt key block concatenated instead of computed in place): each result differs by a few
# roundings of each of the O(100) accumulations between input and output, i.e. ~1e2-1e3 eps relative to the
# largest magnitude involved. 4096 eps (9e-13 relative) is that with room; a wrong position, mask or a lost
# gradient path moves values by 1e-3 or more.
REL = 4096 * EPS64


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    scale = max(1.0, expected.abs().max().item())
    err = (actual - expected).abs().max().item()
    assert err <= REL * scale, f"{what}: |diff| {err:.3g} > {REL * scale:.3g}"


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
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(cfg).double()


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(2)
    cfg = Qwen2Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).double()


def _lora(model, seed=3):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    g = torch.Generator().manual_seed(seed)
    for n, p in model.named_parameters():  # random B so the adapters change the output
        if "lora_B" in n:
            with torch.no_grad():
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _packed(G=4, prompt_lens=(5, 2, 7), completion_lens=None, seed=0):
    """Groups of G rows sharing a prompt; ragged prompts (left-padded) and completions (right-padded), one of
    them empty, as the rollout phase hands them to ``pack``."""
    g = torch.Generator().manual_seed(seed)
    B = len(prompt_lens)
    if completion_lens is None:
        completion_lens = torch.randint(1, 9, (B * G,), generator=g).tolist()
        completion_lens[G + 1] = 0  # an empty completion
    prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in prompt_lens]
    comps = [
        Completion(i // G, torch.randint(3, V, (n,), generator=g).tolist(), "", "length")
        for i, n in enumerate(completion_lens)
    ]
    return pack(Rollouts(G, [{"prompt": ""}] * B, prompts, comps), PAD, torch.device("cpu"))


@pytest.fixture(autouse=True)
def float64_norms(monkeypatch):
    """transformers' RMSNorm rounds its input to float32 even in a float64 model. Forward values are still
    identical in both paths (same rows, same ops), but the gradient crossing each norm is rounded to float32:
    once per prompt position on the shared path (the sum of its G completions' gradients), once per copy on the
    plain path, so the two differ by ~eps32 for a reason that is not the feature's. Norms computed in float64
    make both paths float64 throughout, so the tolerance can be float64's."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for cls in (LlamaRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm):
        monkeypatch.setattr(cls, "forward", forward)


@pytest.fixture(
    autouse=True,
    params=[(policy_logprobs.BUCKET_PASS_COST, False), (0, False), (policy_logprobs.BUCKET_PASS_COST, True)],
    ids=["buckets", "pass-per-length", "packed"],
)
def bucket_cost(request, monkeypatch):
    """Every test three times: the prefix path with the default price of a completion pass, and with passes free,
    so that every distinct completion length gets a pass of its own (rows reordered into groups and back); and
    every group packed as one sequence in one pass."""
    cost, packed = request.param
    real = policy_logprobs.length_buckets
    monkeypatch.setattr(policy_logprobs, "length_buckets", lambda need, pass_cost: real(need, cost))
    monkeypatch.setattr(policy_logprobs, "packing_pays", lambda *args: packed)
    return request.param


@pytest.fixture
def small_chunks(monkeypatch):
    """Three tokens per head chunk, so the chunked head crosses chunk boundaries as a real vocabulary would."""
    monkeypatch.setattr(
        policy_logprobs.core, "head_logprobs", functools.partial(core.head_logprobs, chunk_elements=3 * V)
    )


def _logprobs(model, mb, shared, temperature=0.7, with_entropy=True):
    return completion_logprobs(
        model,
        mb.input_ids_NL,
        mb.attention_mask_NL,
        mb.position_ids_NL,
        mb.completion_ids_NT,
        temperature,
        with_entropy=with_entropy,
        shared_prompt=shared,
    )


def _loss_and_grads(model, packed, rows, shared, overrides=(), ref=None):
    """One micro-batch's loss as the update phase computes it; its parameter gradients. ``ref`` is the reference
    model (``"adapter-off"``: the LoRA policy with its adapter disabled), scored through the same path."""
    algo = load_config(None, list(overrides)).algo
    mb = packed.rows(rows)
    mask_NT = mb.mask_NT.double()
    n = mask_NT.shape[0]
    g = torch.Generator().manual_seed(7)
    adv_N = torch.randn(n, generator=g, dtype=torch.float64)
    with torch.no_grad():  # an older policy: the plain log-probs moved a little, so the ratio is not 1
        old_NT = _logprobs(model, mb, False, with_entropy=False)[0] + 0.05 * torch.randn(
            mask_NT.shape, generator=g, dtype=torch.float64
        )
        ref_NT = None
        if ref == "adapter-off":
            with model.disable_adapter():
                ref_NT = _logprobs(model, mb, shared, with_entropy=False)[0]
        elif ref is not None:
            ref_NT = _logprobs(ref, mb, shared, with_entropy=False)[0]
    model.zero_grad(set_to_none=True)
    logp_NT, ent_NT = _logprobs(model, mb, shared)
    geometry = core.BatchGeometry(
        num_items_in_batch=packed.mask_NT.sum(), max_completion_length=8, steps_per_generation=2
    )
    loss, metrics = core.policy_loss_from(
        build_loss_settings(algo), geometry, logp_NT, old_NT, adv_N, mask_NT, ref_logp_NT=ref_NT, entropy_NT=ent_NT
    )
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), metrics, grads, logp_NT.detach() * mask_NT, ref_NT


def _assert_paths_agree(model, packed, rows, overrides=(), ref=None):
    assert shared_prompt_unsupported(model) is None
    loss_a, metrics_a, grads_a, logp_a, ref_a = _loss_and_grads(model, packed, rows, True, overrides, ref)
    loss_b, metrics_b, grads_b, logp_b, ref_b = _loss_and_grads(model, packed, rows, False, overrides, ref)
    assert_close(logp_a, logp_b, "log-probs")
    if ref is not None:
        mask = packed.rows(rows).mask_NT.double()
        assert_close(ref_a * mask, ref_b * mask, "reference log-probs")
    assert_close(loss_a, loss_b, "loss")
    assert loss_b.abs() > 1e-4  # a loss that can tell the paths apart
    for k in metrics_b:
        assert_close(metrics_a[k].double(), metrics_b[k].double(), k)
    assert grads_a.keys() == grads_b.keys() and grads_b
    for name in grads_b:
        assert grads_b[name].abs().max() > 0, name
        assert_close(grads_a[name], grads_b[name], name)
    return grads_a


@pytest.mark.parametrize(
    "build", [functools.partial(_llama, tied=True), functools.partial(_llama, tied=False), _qwen3, _qwen2]
)
def test_full_fine_tuning_matches_the_one_forward_path(build, small_chunks):
    model = build().train()
    packed = _packed()
    _assert_paths_agree(model, packed, slice(0, 12))


@pytest.fixture
def float64_eager_softmax(monkeypatch):
    """transformers' eager attention takes its softmax in float32 even in a float64 model (as the norms above):
    keep a float64 input's softmax in float64, so both paths are float64 throughout. (In float32 the mask's
    finfo(float64).min also becomes -inf, and a left pad's fully masked row NaN.)"""
    softmax = torch.nn.functional.softmax

    def softmax_keeping_float64(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_keeping_float64)


@pytest.mark.parametrize("lora", [False, True])
def test_eager_attention_matches_the_one_forward_path(lora, small_chunks, float64_eager_softmax):
    """Eager attention (what a CPU run under bf16 autocast loads: the matmul form with an explicit 4-D mask over
    the prompt cache and the completion) gives the same log-probs, loss and gradients on both paths, with a
    reference scored through the same path, and the same values as SDPA; ragged (left-padded) prompts."""
    model = _llama()
    model.set_attn_implementation("eager")
    if lora:
        model = _lora(model)
    model.train()
    assert policy_logprobs._unwrap(model).config._attn_implementation == "eager"
    packed = _packed()
    ref = "adapter-off" if lora else _llama(tied=False).eval()
    grads = _assert_paths_agree(model, packed, slice(0, 12), overrides=["algo.beta=0.04"], ref=ref)
    policy_logprobs._unwrap(model).set_attn_implementation("sdpa")
    model.zero_grad(set_to_none=True)
    _, _, sdpa_grads, _, _ = _loss_and_grads(model, packed, slice(0, 12), True, ["algo.beta=0.04"], ref)
    for name in grads:
        assert_close(grads[name], sdpa_grads[name], f"eager vs sdpa {name}")


def test_micro_batches_that_cut_groups(small_chunks):
    """Micro-batches of 5 rows over groups of 4: each starts or ends inside a group; the row whose prompt is
    alone in its micro-batch (rows 4 and 9 here) and the empty completion ride along."""
    model = _llama()
    packed = _packed(G=4, prompt_lens=(5, 2, 7, 3))
    for rows in packed.micro_batches(5):
        _assert_paths_agree(model, packed, rows)


def test_trimming_keeps_log_probs_of_every_row_and_pads_with_zero(small_chunks):
    """A micro-batch whose prompts are all shorter than the batch's and completions shorter too: trimmed
    columns are padding; every real token keeps its log-prob, every trimmed column reads 0."""
    model = _llama()
    packed = _packed(G=3, prompt_lens=(9, 2, 3), completion_lens=[8, 8, 8, 2, 3, 1, 1, 2, 3])
    mb = packed.rows(slice(3, 9))  # longest prompt 3 of 9 columns, longest completion 3 of 8
    with torch.no_grad():
        shared, _ = _logprobs(model, mb, True)
        plain, _ = _logprobs(model, mb, False)
    assert_close(shared * mb.mask_NT, plain * mb.mask_NT, "log-probs")
    assert mb.mask_NT[:, 3:].sum() == 0 and (shared[:, 3:] == 0).all() and (shared[mb.mask_NT.bool()] != 0).all()


def test_lora_matches_and_trains_only_the_adapters(small_chunks):
    model = _lora(_llama()).train()
    grads = _assert_paths_agree(model, _packed(), slice(0, 12))
    assert all("lora_" in name for name in grads)


@pytest.mark.parametrize("lora", [False, True])
def test_kl_to_a_reference_scored_through_the_same_path(lora, small_chunks):
    if lora:  # the reference is the base model: the adapter switched off
        _assert_paths_agree(_lora(_llama()).train(), _packed(), slice(0, 12), ["algo.beta=0.1"], ref="adapter-off")
    else:
        ref = _llama(tied=False).eval()
        _assert_paths_agree(_llama().train(), _packed(), slice(0, 12), ["algo.beta=0.1"], ref=ref)


def test_gspo_sequence_level_ratio(small_chunks):
    _assert_paths_agree(_llama().train(), _packed(), slice(2, 11), ["algo.loss_type=gspo"])


def test_full_logits_head_path_is_shared_too():
    """Without the chunked head (``chunked=False``: models whose head is not a plain Linear) the shared path
    cats the prompt's last logits to the completions' logits."""
    model = _llama()
    mb = _packed().rows(slice(0, 12))
    outs = []
    for shared in (True, False):
        model.zero_grad(set_to_none=True)
        logp, _ = completion_logprobs(
            model,
            mb.input_ids_NL,
            mb.attention_mask_NL,
            mb.position_ids_NL,
            mb.completion_ids_NT,
            1.0,
            chunked=False,
            shared_prompt=shared,
        )
        (logp * mb.mask_NT).sum().backward()
        outs.append((logp.detach() * mb.mask_NT, model.model.embed_tokens.weight.grad.clone()))
    assert_close(outs[0][0], outs[1][0], "log-probs")
    assert_close(outs[0][1], outs[1][1], "embedding gradient")


def test_prompt_runs_once_per_distinct_prompt(bucket_cost):
    """What the feature is for: the prompt pass sees B prompts, the completion pass only completion tokens; packed,
    one pass sees B sequences, each its prompt once and its completions' tokens once."""
    model = _llama()
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    mb = _packed(G=4, prompt_lens=(5, 2, 7), completion_lens=[8] * 12).rows(slice(0, 12))
    _logprobs(model, mb, True)
    _, packed = bucket_cost
    if packed:  # the longest group: a prompt of 7 tokens and 4 completions of 7 fed tokens each (the last never)
        assert seen == [(3, 7 + 4 * 7)]
    else:  # 3 prompts of <= 7 tokens; 12 completions, the last token never fed
        assert seen == [(3, 7), (12, 7)]


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_gradient_checkpointing_matches(lora, attention, small_chunks, float64_eager_softmax):
    """Checkpointed layers replay their forward in backward: the caches must give the same keys/values again,
    and the prompt's gradient must still arrive through the non-reentrant checkpoint. With SDPA and with eager
    attention (a small model's on CPU), whose replay saves the attention probabilities again."""
    model = _llama()
    model.set_attn_implementation(attention)
    model.gradient_checkpointing_enable()  # transformers' default: non-reentrant
    model = (_lora(model) if lora else model).train()
    grads = _assert_paths_agree(
        model, _packed(), slice(0, 12), ["algo.beta=0.1"], ref="adapter-off" if lora else _llama(tied=False).eval()
    )
    assert all("lora_" in name for name in grads) == lora


def test_unsupported_setups_fall_back_with_a_reason():
    from transformers import Gemma2Config, Gemma2ForCausalLM

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
    assert "gemma2" in shared_prompt_unsupported(gemma)
    from peft import LoraConfig, get_peft_model

    # Dropout in training mode: G forwards draw G masks over the prompt, one prompt pass one (LoRA's or the model's).
    lora_dropout = get_peft_model(_llama(), LoraConfig(r=4, lora_dropout=0.1, target_modules="all-linear")).train()
    assert "dropout" in shared_prompt_unsupported(lora_dropout)
    assert shared_prompt_unsupported(lora_dropout.eval()) is None
    attention_dropout = _llama().train()
    attention_dropout.config.attention_dropout = 0.1
    assert "dropout" in shared_prompt_unsupported(attention_dropout)
    model = _llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    assert "reentrant" in shared_prompt_unsupported(model)
    with torch.no_grad():  # the no-grad passes (old/ref log-probs) do not checkpoint: they share
        assert shared_prompt_unsupported(model) is None
    mb = _packed().rows(slice(0, 12))
    with pytest.warns(UserWarning, match="reentrant"):
        policy_logprobs._WARNED.clear()
        shared, _ = _logprobs(model, mb, True)
    plain, _ = _logprobs(model, mb, False)
    assert torch.equal(shared, plain)  # it took the one-forward path


def test_one_token_completions_take_the_one_forward_path():
    """No completion pass to run (every completion of the micro-batch is 0 or 1 token): the plain path, so DDP
    still sees its one forward per micro-batch."""
    model = _llama()
    mb = _packed(G=4, prompt_lens=(5, 2), completion_lens=[1, 0, 1, 1, 1, 1, 0, 1]).rows(slice(0, 8))
    assert (
        policy_logprobs._shared_prompt_logprobs(
            model, mb.input_ids_NL, mb.attention_mask_NL, mb.position_ids_NL, mb.completion_ids_NT, 1.0, False, None, 0
        )
        is None
    )
    with torch.no_grad():
        assert torch.equal(_logprobs(model, mb, True)[0], _logprobs(model, mb, False)[0])


def test_length_buckets_minimise_padded_positions_plus_a_price_per_pass():
    need = [7, 2, 7, 0, 2, 7, 2, 2]
    # One pass: 7 rows x 7 = 49 positions + 64. Two ([2]x4, [7]x3): 8 + 21 + 128 = 157 > 113, so one at price 64;
    # at price 10: 8 + 21 + 20 = 49 < 49 + 10 = 59: two. The empty row never costs a pass.
    assert length_buckets(need, pass_cost=64) == [([3], 0), ([0, 1, 2, 4, 5, 6, 7], 7)]
    assert length_buckets(need, pass_cost=10) == [([3], 0), ([1, 4, 6, 7], 2), ([0, 2, 5], 7)]
    assert length_buckets([5, 5, 5], pass_cost=0) == [([0, 1, 2], 5)]
    assert length_buckets([], pass_cost=0) == []
    # Many distinct lengths are rounded up onto at most 64 levels (here multiples of ceil(1000 / 64) = 16: 63 of
    # them); a group's width is its longest real length.
    groups = length_buckets(list(range(1, 1001)), pass_cost=0)
    assert len(groups) == 63 and sorted(r for rows, _ in groups for r in rows) == list(range(1000))
    assert all(width == max(rows) + 1 for rows, width in groups)


def test_auto_pass_price_grows_as_a_layer_shrinks():
    """auto: 64 positions for reading the weights again, plus the dispatch cost over a layer's matmul parameters."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from rlvr.models import tiny_model_path
    from rlvr.policy_logprobs import bucket_pass_cost

    # The shipped model's layer: q, k, v, o of 96 x (4 heads x 24) and gate, up, down of 96 x 256:
    # 4 x 9216 + 3 x 24576 = 110592 parameters; 2.6e7 / 110592 = 235.1.
    tiny = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    assert bucket_pass_cost(tiny) == 64 + 235
    assert bucket_pass_cost(tiny, 5) == 5 and bucket_pass_cost(tiny, 0) == 0  # a number is the price
    # Grouped-query attention counts its narrower k and v: hidden 576, 9 heads of 64, 3 KV heads, MLP 1536:
    # 576 x 64 x (18 + 6) + 3 x 576 x 1536 = 884736 + 2654208 = 3538944; 2.6e7 / 3538944 = 7.3.
    smol = LlamaForCausalLM(LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=1,
                                        num_attention_heads=9, num_key_value_heads=3, vocab_size=50))
    assert bucket_pass_cost(smol) == 64 + 7
    assert load_config(None, []).train.length_bucket_pass_cost == "auto"
    with pytest.raises(Exception, match="greater than or equal to 0"):
        load_config(None, ["train.length_bucket_pass_cost=-1"])


def test_auto_packs_short_completions_and_never_attention_the_plain_path_would_not_score():
    """Hand-derived on the shipped model's layer (4 heads of 24, 110592 matmul parameters): a pair costs
    4 x 4 x 24 / 110592 = 0.00347 positions."""
    from transformers import AutoModelForCausalLM

    from rlvr.models import tiny_model_path

    tiny = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    group_N, plen_N = [0] * 4 + [1] * 4, [5] * 8
    need_N = [2, 2, 3, 1, 2, 2, 2, 2]
    one_pass = [(list(range(8)), 3)]
    # Packed: 2 sequences of 5 + 8 = 13: 26 positions + 299 + 2 x 13^2 = 338 pairs (1.17) = 326.2. Prefix: 2 x 5 +
    # 8 x 3 = 34 positions + 2 passes x 299 + (2 x 5^2 + 8 x 3 x 8 = 242 pairs: 0.84) = 632.8. Pairs 338 <= the
    # plain path's 8 x (5 + 3 + 1)^2 = 648.
    assert PACKING_PAYS(tiny, "auto", group_N, plen_N, need_N, 5, one_pass, 299) is True
    # Passes free: packed 26 + 1.17 still beats 34 + 0.84 (no padding between completions)...
    assert PACKING_PAYS(tiny, "auto", group_N, plen_N, need_N, 5, one_pass, 0) is True
    # ...but not when no row is shorter than another: 2 x 17 = 34 positions + 2 x 17^2 pairs (2.01) > 34 + 0.84.
    assert PACKING_PAYS(tiny, "auto", group_N, plen_N, [3] * 8, 5, one_pass, 0) is False
    # Long completions: one sequence of 5 + 8 x 20 = 165 would score 27225 pairs, the plain path 8 x 26^2 = 5408.
    assert PACKING_PAYS(tiny, "auto", [0] * 8, plen_N, [20] * 8, 5, [(list(range(8)), 20)], 10**6) is False
    # true packs where the estimate would not, never past the plain path's pairs.
    assert PACKING_PAYS(tiny, True, group_N, plen_N, [3] * 8, 5, one_pass, 0) is True
    assert PACKING_PAYS(tiny, True, [0] * 8, plen_N, [20] * 8, 5, [(list(range(8)), 20)], 0) is False
    assert PACKING_PAYS(tiny, False, group_N, plen_N, need_N, 5, one_pass, 299) is False
    assert load_config(None, []).train.group_packing == "auto"


def test_completion_passes_are_grouped_by_length(monkeypatch):
    """The feature: short completions are not padded to the longest; each group's pass is as wide as its longest
    row needs (the last token is never fed)."""
    monkeypatch.setattr(policy_logprobs, "length_buckets", lambda need, pass_cost: length_buckets(need, 0))
    monkeypatch.setattr(policy_logprobs, "packing_pays", lambda *args: False)  # the prefix path's passes
    model = _llama()
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    mb = _packed(G=4, prompt_lens=(5, 2), completion_lens=[8, 3, 3, 8, 1, 3, 8, 3]).rows(slice(0, 8))
    shared, _ = _logprobs(model, mb, True)
    assert seen == [(2, 5), (4, 2), (3, 7)]  # the prompts; rows of 3 tokens; rows of 8 (the 1-token row: no pass)
    plain, _ = _logprobs(model, mb, False)
    assert_close(shared * mb.mask_NT, plain * mb.mask_NT, "log-probs")
