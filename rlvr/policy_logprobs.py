"""Completion log-probs of a Hugging Face causal LM without full-vocabulary logits.

The model's forward runs as usual (through its DDP and PEFT wrappers, so DDP's gradient hooks and LoRA
adapters act) with its output head made to pass the final hidden states through; those and the head's
weight go to :func:`rlvr.core.head_logprobs`, which computes the log-probs (and entropy) a chunk of tokens
at a time. Architectures whose forward changes the logits after the head (Gemma 2/3 soft-capping,
Granite's and Cohere's logit scaling) or whose head is not a plain ``nn.Linear`` (a LoRA-adapted head)
take the plain path: full logits, then :func:`rlvr.core.token_logprobs`.

Shared-prompt forward (``shared_prompt=True``): the G completions of a group are G rows with the same prompt.
A causal model's prompt states do not depend on what follows, so the prompt is run once per distinct prompt of
the micro-batch and its per-layer keys and values are handed to the completion rows as a cache
(``index_select`` by row: differentiable, so each completion's gradient flows back into the one prompt pass and
the G contributions add up there). Loss and gradients are those of G separate forwards; the prompt's matmuls
run once instead of G times, i.e. a fraction ``(G-1)/G * P / (P + T)`` of the forward and backward FLOPs is
saved (P prompt, T completion tokens). Attention over the prompt is still paid per completion row, and the
prompt's K/V are copied to every row (the plain path holds those rows too). Only supported setups take it
(:func:`shared_prompt_unsupported` says why not); the others, and micro-batches with no repeated prompt, take
the one-forward path.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F

from rlvr import core, fsdp
from rlvr.memory import ModelShape

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
    shared_prompt: bool = False,
    pass_cost: int | str | None = "auto",
    group_packing: bool | str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and detached entropy) of the T completion tokens under ``softmax(logits / temperature)``.

    Rows are [left-padded prompt | right-padded completion]. The plain path is one forward over all of it, of
    which only the last T+1 positions reach the head. ``shared_prompt``: one forward per distinct prompt, then
    the completions against its cached keys and values (module docstring), where supported, in passes grouped by
    completion length (:func:`length_buckets`, each extra pass priced at ``pass_cost`` positions; ``auto``:
    :func:`bucket_pass_cost`), or, where ``group_packing`` says so (:func:`packing_pays`), each group as one
    sequence in a single pass (:func:`_packed_group_logprobs`)."""
    head = plain_linear_head(model) if chunked else None
    # Small enough to keep the head's probabilities for backward (rlvr.core.lm_head): decided once for the
    # micro-batch, whose passes all live until its backward.
    keep = head is not None and completion_ids_NT.numel() * head.weight.shape[0] <= core.HEAD_KEEP_ELEMENTS
    if shared_prompt:
        reason = shared_prompt_unsupported(model)
        if reason is None:
            out = _shared_prompt_logprobs(
                model,
                input_ids_NL,
                attention_mask_NL,
                position_ids_NL,
                completion_ids_NT,
                temperature,
                with_entropy,
                head,
                bucket_pass_cost(model, pass_cost),
                keep,
                group_packing,
            )
            if out is not None:
                return out
        elif reason not in _WARNED:
            _WARNED.add(reason)
            warnings.warn(
                f"train.shared_prompt_forward: {reason}; using one forward over prompt and completion.", stacklevel=2
            )
    T = completion_ids_NT.shape[1]
    kwargs = dict(
        input_ids=input_ids_NL,
        attention_mask=attention_mask_NL,
        position_ids=position_ids_NL,
        use_cache=False,
        logits_to_keep=T + 1,
    )
    with _head_passes_hidden_states(head) if head is not None else nullcontext():
        out_NTX = model(**kwargs).logits[:, :-1, :]  # position t predicts token t+1
    return _logprobs_from(out_NTX, completion_ids_NT, temperature, with_entropy, head, keep)


def _logprobs_from(out_NTX, ids_NT, temperature, with_entropy, head, keep=False):
    """The forward's output at the positions that predict ``ids_NT``: final hidden states when ``head`` passed
    them through (chunked head), else full logits."""
    if head is not None:
        weight, bias = head.weight, head.bias
        device_type = out_NTX.device.type
        if torch.is_autocast_enabled(device_type):
            # Mixed precision: the head's matmuls in the autocast dtype, as the model's own head would run
            # them; one differentiable cast of the weight here rather than one per chunk inside the head.
            low = torch.get_autocast_dtype(device_type)
            weight, bias = weight.to(low), None if bias is None else bias.to(low)
            out_NTX = out_NTX.to(low)
        return core.head_logprobs(
            out_NTX, weight, ids_NT, temperature, bias, with_entropy=with_entropy, keep_probs=keep
        )
    logp_NT = core.token_logprobs(out_NTX, ids_NT, temperature=temperature)
    ent_NT = core.entropy_from_logits(out_NTX.detach(), temperature=temperature) if with_entropy else None
    return logp_NT, ent_NT


# ------------------------------------------------------------------------------ shared-prompt forward

# Architectures whose decoder is all full attention with transformers' standard dynamic cache, checked by
# tests/train/test_shared_prompt.py to give the one-forward path's log-probs and gradients.
SHARED_PROMPT_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3"})
_WARNED: set[str] = set()


def shared_prompt_unsupported(model: torch.nn.Module) -> str | None:
    """Why the shared-prompt forward cannot run on ``model`` as it is now, or None when it can."""
    inner = _unwrap(model)
    config = getattr(inner, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SHARED_PROMPT_MODEL_TYPES:
        verified = ", ".join(sorted(SHARED_PROMPT_MODEL_TYPES))
        return f"model type {model_type!r} is not one it is verified on ({verified})"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "the model has sliding-window layers, whose cache drops old keys"
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return f"attention implementation {config._attn_implementation!r} (verified: sdpa, eager)"
    if inner.training and (
        getattr(config, "attention_dropout", 0.0)
        or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in inner.modules())
    ):
        # Separate forwards draw G dropout masks over the prompt; one prompt pass draws one for all G.
        return "dropout is active in training mode (the G completions would share one dropout draw on the prompt)"
    if _checkpointed_layers(inner) and inner.training and torch.is_grad_enabled():
        # transformers' checkpointed layers drop the cache argument unless the layer declares it only reads it
        # (its backward replay would write it twice); both caches here give the same result when replayed, so
        # they are declared so. The prompt's keys/values reach the completion pass outside the checkpointed
        # call's inputs: only a non-reentrant checkpoint (transformers' default) carries their gradient.
        if not hasattr(_gradient_checkpointing_layer(), "_can_checkpoint_with_cache"):
            return "gradient checkpointing in this transformers version drops the prompt cache"
        if any(_reentrant(layer) for layer in _checkpointed_layers(inner)):
            return "reentrant gradient checkpointing would not carry the gradient of the prompt's keys and values"
    if _cache_classes() is None:
        return "this transformers version has no layered cache (transformers >= 4.56 with DynamicLayer needed)"
    return None


def _gradient_checkpointing_layer():
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return object
    return GradientCheckpointingLayer


def _checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    cls = _gradient_checkpointing_layer()
    return [m for m in model.modules() if isinstance(m, cls) and getattr(m, "gradient_checkpointing", False)]


def _reentrant(layer: torch.nn.Module) -> bool:
    fn = getattr(layer, "_gradient_checkpointing_func", None)
    return getattr(fn, "keywords", {}).get("use_reentrant", True) is not False  # torch's own default is reentrant


@contextmanager
def _checkpointed_layers_keep_the_cache(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, checkpointed decoder layers are told the cache is read-only (it is: see the callers),
    so they keep it; the class's attribute is restored on exit."""
    layers = _checkpointed_layers(_unwrap(model))
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache


def _cache_classes():
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return None
    return DynamicCache, DynamicLayer


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.24 renamed ``past_key_values`` to ``cache``; take whichever the forward declares."""
    params = inspect.signature(type(_bare(model)).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _bare(model: torch.nn.Module) -> torch.nn.Module:
    inner = _unwrap(model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def _capture_cache(num_layers: int):
    """A cache that keeps each layer's latest keys/values and returns them as they are: the prompt pass attends
    to its own tokens only, and a checkpoint's replay of a layer stores the same values again."""
    DynamicCache, DynamicLayer = _cache_classes()

    class CaptureLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            self.keys, self.values, self.is_initialized = key_states, value_states, True
            self.device, self.dtype = key_states.device, key_states.dtype
            return key_states, value_states

    cache = DynamicCache()
    cache.layers = [CaptureLayer() for _ in range(num_layers)]
    return cache


def _prefix_cache(layers_kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """A cache that serves fixed prompt keys/values and never grows: ``update`` returns [prompt | new] without
    storing it, so the cache stays the prompt alone whatever runs through it (a checkpoint's replay included)."""
    DynamicCache, DynamicLayer = _cache_classes()

    class PrefixLayer(DynamicLayer):
        def __init__(self, keys, values):
            super().__init__()
            self.keys, self.values = keys, values
            self.device, self.dtype, self.is_initialized = keys.device, keys.dtype, True

        def update(self, key_states, value_states, *args, **kwargs):
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    cache = DynamicCache()
    cache.layers = [PrefixLayer(k, v) for k, v in layers_kv]
    return cache


# Length buckets for the completion pass. One pass pads every row to the micro-batch's longest completion; with
# EOS-stopped sampling most rows are shorter, so rows are grouped by length and each group padded only to its own
# longest. A pass has a cost of its own beyond its positions, priced in token positions (a split is taken only
# when it saves more positions than that). Two parts, fitted by benchmarks/update_phase.py --pass-cost (forward
# and backward of one completion pass at widths 1-16, a line through time against positions; 2-core CPU):
# - reading the weights again: every pass reads each weight in forward and twice in backward, which on CPU costs
#   as much as ~64 positions whatever the size (27M Llama: 64, SmolLM2-135M: 70);
# - dispatching the ops again: a fixed ~0.5-2 ms per layer, which is nothing against a large layer's positions
#   but ~240 positions of the shipped model's (110K parameters a layer: its pass measured 300 positions).
# On CUDA both are estimates, not measurements: H200-class bandwidth against bf16 throughput puts the weight
# reads near 200 positions, and a kernel launch (~5 us) per op against a position's FLOPs makes the dispatch
# part ~1000x the CPU's for the same layer.
BUCKET_PASS_COST = 64  # CPU, the weight-reading part
_DISPATCH_COST_PARAMS = {"cpu": 2.6e7, "cuda": 4e10}  # the dispatch part x a layer's matmul parameters
_WEIGHT_READ_COST = {"cpu": BUCKET_PASS_COST, "cuda": 200}


def bucket_pass_cost(model: torch.nn.Module, setting: int | str | None = "auto") -> int:
    """The price of one more completion pass in token positions: ``setting`` if it is a number, else estimated
    for ``model`` on its device (the comment above)."""
    if isinstance(setting, int):
        return setting
    device = "cuda" if next(_bare(model).parameters()).device.type == "cuda" else "cpu"
    _, layer_params = _layer_shape(model)
    return _WEIGHT_READ_COST[device] + round(_DISPATCH_COST_PARAMS[device] / max(layer_params, 1))


def _layer_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(attention heads x head_dim, matmul parameters) of one decoder layer, from the model's config."""
    shape = ModelShape.from_hf_config(_bare(model).config)
    return shape.heads * shape.head_dim, sum(i * o for i, o in shape.linears().values())


_ONE_PASS = 1 << 62  # a price no split can beat: all completions in one pass
_MAX_LENGTH_LEVELS = 64  # distinct lengths the search considers (quantised beyond): keeps it O(64^2) in Python


def length_buckets(need_N: list[int], pass_cost: int = BUCKET_PASS_COST) -> list[tuple[list[int], int]]:
    """Rows grouped into completion passes: ``[(rows, width), ...]`` with every row in one group, each group's
    ``width`` its longest ``need`` (positions the row needs in the pass). Minimises the padded positions plus
    ``pass_cost`` per pass by dynamic programming over the sorted distinct lengths (the optimal groups of a
    sorted list are contiguous); rows that need no position form a group of width 0, which costs no pass. Rows
    keep their order within a group."""
    top = max(need_N, default=0)
    step = -(-top // _MAX_LENGTH_LEVELS) or 1
    level_N = [-(-n // step) * step for n in need_N]  # lengths rounded up onto at most 64 levels
    levels = sorted(set(level_N))
    count = {v: 0 for v in levels}
    for v in level_N:
        count[v] += 1
    rows_upto = [0]
    for v in levels:
        rows_upto.append(rows_upto[-1] + count[v])
    # best[j]: least cost of the first j levels in groups; cut[j]: where the last of those groups starts.
    best, cut = [0.0] + [float("inf")] * len(levels), [0] * (len(levels) + 1)
    for j in range(1, len(levels) + 1):
        v = levels[j - 1]
        for i in range(j):
            cost = best[i] + (rows_upto[j] - rows_upto[i]) * v + (pass_cost if v > 0 else 0)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(levels)
    while j > 0:
        bounds.append((levels[cut[j]], levels[j - 1]))
        j = cut[j]
    groups = []
    for lo, hi in reversed(bounds):
        rows = [r for r, v in enumerate(level_N) if lo <= v <= hi]
        groups.append((rows, max(need_N[r] for r in rows)))
    return groups


# Group packing. The prefix path above runs a prompt pass and one pass per length group, and copies the prompt's
# keys and values to every completion row. For short completions its fixed costs dominate: the shipped task's
# completions are 2-3 tokens past a 7-token prompt. Packed, each group is one sequence [prompt | completion 1 |
# ... | completion G] (no padding between completions) whose attention mask lets a completion's tokens see the
# prompt and that completion's own earlier tokens, and nothing else: every token sees exactly the keys it sees in
# its own row of the plain path, at the same rotary positions, so log-probs and gradients are the same. One pass
# per micro-batch; the price is attention over the whole group, dense in its length: a packed group of length L
# scores L^2 query-key pairs where the prefix path scores each completion against its prompt and itself.
# ``auto`` packs when (a) the packed attention scores no more pairs than the plain path's N x S^2 (what the memory
# plan counts for eager attention's probabilities), and (b) its estimated cost is lower, in token positions as
# :func:`bucket_pass_cost` prices a pass: positions + passes x pass price + pairs x a pair's price, where a pair
# costs its attention products (4 x heads x head_dim, forward) and as much again in mask, softmax and their
# backward, against a position's 2 x a layer's matmul parameters: 4 x heads x head_dim / layer parameters.
# The shipped task's update (256 completions): forward and backward 36 -> 29 ms; SmolLM2's and the 27M
# workload's completions of ~100 tokens fail (a): 8 x 100 tokens in one group would score 4x the plain path's pairs.


def packing_pays(
    model: torch.nn.Module,
    setting: bool | str,
    group_N: list[int],
    plen_N: list[int],
    need_N: list[int],
    p_len: int,
    groups: list[tuple[list[int], int]],
    pass_cost: int,
) -> bool:
    """Whether to score the micro-batch's groups packed (the comment above). Never when the packed attention would
    score more pairs than the plain path (the memory plan's bound); else ``True`` packs, ``auto`` estimates.
    ``groups`` are the prefix path's length groups, ``p_len`` its prompt width."""
    if setting is not True and setting != "auto":
        return False
    seq_U: dict[int, int] = {}
    for u, p, need in zip(group_N, plen_N, need_N, strict=True):
        seq_U[u] = seq_U.get(u, p) + need
    U, width = len(seq_U), max(seq_U.values())
    plain_pairs = len(need_N) * (p_len + max(need_N) + 1) ** 2
    packed_pairs = U * width * width
    if packed_pairs > plain_pairs:
        return False
    if setting is True:
        return True
    # The prefix path's cost and the packed one's, in token positions.
    attention_width, layer_params = _layer_shape(model)
    pair = 4 * attention_width / max(layer_params, 1)
    prefix_pairs = U * p_len * p_len + sum(len(rows) * w * (p_len + w) for rows, w in groups)
    prefix_positions = U * p_len + sum(len(rows) * w for rows, w in groups)
    prefix_passes = 1 + sum(1 for _, w in groups if w > 0)
    prefix = prefix_positions + prefix_passes * pass_cost + prefix_pairs * pair
    packed = U * width + pass_cost + packed_pairs * pair
    return packed < prefix


def _packed_group_logprobs(model, ids_NL, pos_NL, comp_NT, group_N, plen_N, t_N, temperature, with_entropy, head,
                           keep=False):
    """Each group of rows as one sequence in one pass (the comment above ``packing_pays``)."""
    N, T = comp_NT.shape
    P = ids_NL.shape[1] - T
    ids, pos = torch.stack([ids_NL, pos_NL]).tolist()  # one copy to the host: the sequences are built there
    # Per group: its tokens, their rotary positions, and whose they are (0: the prompt, n + 1: row n's completion);
    # per row: where the positions that predict its tokens sit (the prompt's last, then its own but the last).
    seq_ids: dict[int, list[int]] = {}
    seq_pos: dict[int, list[int]] = {}
    seq_own: dict[int, list[int]] = {}
    predict_N: list[tuple[int, list[int]]] = []
    for n, (u, p, t) in enumerate(zip(group_N, plen_N, t_N, strict=True)):
        if u not in seq_ids:
            seq_ids[u], seq_pos[u], seq_own[u] = ids[n][P - p : P], pos[n][P - p : P], [0] * p
        start, need = len(seq_ids[u]), max(t - 1, 0)
        seq_ids[u] += ids[n][P : P + need]
        seq_pos[u] += pos[n][P : P + need]
        seq_own[u] += [n + 1] * need
        predict_N.append((u, ([p - 1] + list(range(start, start + need)))[:t]))
    U, L = len(seq_ids), max(len(v) for v in seq_ids.values())
    device = ids_NL.device
    ids_UL = torch.tensor([seq_ids[u] + [0] * (L - len(seq_ids[u])) for u in range(U)], device=device)
    pos_UL = torch.tensor([seq_pos[u] + [0] * (L - len(seq_pos[u])) for u in range(U)], device=device)
    own_UL = torch.tensor([seq_own[u] + [-1] * (L - len(seq_own[u])) for u in range(U)], device=device)
    at = torch.arange(L, device=device)
    q_own, k_own = own_UL[:, :, None], own_UL[:, None, :]
    # A query sees earlier real keys of the prompt or of its own completion; every position sees itself, so a
    # padding position's softmax has a key (its output is never read).
    sees_ULL = ((at[None, :] <= at[:, None]) & (k_own >= 0) & ((k_own == 0) | (k_own == q_own))) | (
        at[None, :] == at[:, None]
    )
    if _bare(model).config._attn_implementation == "sdpa":
        mask = sees_ULL[:, None]  # SDPA takes a boolean mask, True where attention is allowed
    else:  # eager adds its mask to the scores
        low = torch.finfo(torch.float32).min
        mask = torch.zeros(sees_ULL.shape, device=device).masked_fill_(~sees_ULL, low)[:, None]
    Tm = max(t_N)
    index_NT = torch.tensor([[u * L + i for i in at_n] + [0] * (Tm - len(at_n)) for u, at_n in predict_N],
                            device=device)
    real_NT = torch.tensor([[True] * len(at_n) + [False] * (Tm - len(at_n)) for _, at_n in predict_N],
                           device=device)
    with _head_passes_hidden_states(head) if head is not None else nullcontext():
        out_ULX = model(input_ids=ids_UL, attention_mask=mask, position_ids=pos_UL, use_cache=False,
                        logits_to_keep=0).logits
    out_NTX = out_ULX.reshape(U * L, -1).index_select(0, index_NT.view(-1)).view(N, Tm, -1)
    logp_NT, ent_NT = _logprobs_from(out_NTX, comp_NT[:, :Tm], temperature, with_entropy, head, keep)
    # Past a row's own tokens: padding, log-prob and entropy 0 there, outside every loss mask.
    logp_NT = F.pad(logp_NT * real_NT, (0, T - Tm))
    ent_NT = None if ent_NT is None else F.pad(ent_NT * real_NT, (0, T - Tm))
    return logp_NT, ent_NT


class _PromptRows(torch.autograd.Function):
    """``x_U.index_select(0, prompt_of_n)``: each completion row's copy of its prompt's tensor (last hidden state,
    a layer's keys or values), whose backward sums the rows' gradients into their prompt. Same as index_select's
    own backward, done as one index_add_ over [U, features] rows: ATen's CPU backward scatters through an index
    expanded to the gradient's full shape, measured 2-5x slower for the op on small models' prefix keys (within
    the noise of the shipped model's whole update)."""

    @staticmethod
    def forward(ctx, x_U, prompt_of_n):
        ctx.save_for_backward(prompt_of_n)
        ctx.shape = x_U.shape
        return x_U.index_select(0, prompt_of_n)

    @staticmethod
    def backward(ctx, grad_n):
        (prompt_of_n,) = ctx.saved_tensors
        grad_nF = grad_n.reshape(grad_n.shape[0], -1)
        grad_UF = grad_nF.new_zeros(ctx.shape[0], grad_nF.shape[1]).index_add_(0, prompt_of_n, grad_nF)
        return grad_UF.view(ctx.shape), None


def _shared_prompt_logprobs(
    model, ids_NL, attn_NL, pos_NL, comp_NT, temperature, with_entropy, head, pass_cost, keep=False, packing="auto"
):
    """The shared-prompt forward (module docstring); None when no prompt repeats (nothing to share)."""
    N, L = ids_NL.shape
    T = comp_NT.shape[1]
    P = L - T
    prompt_NP, pmask_NP = ids_NL[:, :P], attn_NL[:, :P]
    # Rows of a group are consecutive: a row whose prompt (ids and padding) equals the previous row's shares its
    # pass. Decided by content, so a micro-batch that starts or ends inside a group is handled like any other.
    new_N = torch.ones(N, dtype=torch.bool, device=ids_NL.device)
    new_N[1:] = ((prompt_NP[1:] != prompt_NP[:-1]) | (pmask_NP[1:] != pmask_NP[:-1])).any(-1)
    first_U = new_N.nonzero().squeeze(1)  # two host syncs per micro-batch: this and the lengths below
    # All-pad columns change nothing (masked keys; completion pads come after every real token): trim them to
    # this micro-batch's longest prompt, and each completion group to its longest completion; the last completion
    # token is never fed (it predicts nothing).
    prompt_of_N = new_N.cumsum(0) - 1
    plen_N = pmask_NP.sum(-1)
    lengths = torch.cat([plen_N.max().view(1), attn_NL[:, P:].sum(-1), plen_N, prompt_of_N]).tolist()
    p_len, t_N, plen_N, group_N = lengths[0], lengths[1 : N + 1], lengths[N + 1 : 2 * N + 1], lengths[2 * N + 1 :]
    # Nothing to share; or no completion pass to run, which under DDP would leave the micro-batch without the one
    # DDP forward its reducer expects before backward.
    share = not (first_U.numel() == N or p_len == 0 or max(t_N) <= 1)
    sharded = fsdp.is_sharded(_unwrap(model))
    if sharded:
        # The completions take one pass (below). Each pass is also a round of all-gathers, and at this price the
        # estimate packs (one pass) wherever its attention bound allows.
        pass_cost = _ONE_PASS
    need_N = [max(t - 1, 0) for t in t_N]
    groups = length_buckets(need_N, pass_cost) if share else []
    pack = share and packing_pays(model, packing, group_N, plen_N, need_N, p_len, groups, pass_cost)
    if sharded:
        # Every pass through a sharded model all-gathers each layer's weights, a collective: all ranks must make
        # the same passes. So they agree on the path (two flags, all-reduced: share at all, and pack).
        flags = torch.tensor([int(share), int(pack)], device=ids_NL.device)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
        share, pack = bool(flags[0].item()), bool(flags[1].item())
    if not share:
        return None
    if pack:
        return _packed_group_logprobs(
            model, ids_NL, pos_NL, comp_NT, group_N, plen_N, t_N, temperature, with_entropy, head, keep
        )
    cols = slice(P - p_len, P)
    key = _cache_kwarg(model)
    # use_cache=False with an explicit cache: the layers still read and write it (transformers only builds a
    # cache of its own when use_cache is set), and no "incompatible with gradient checkpointing" warning.
    with (
        _head_passes_hidden_states(head) if head is not None else nullcontext(),
        _checkpointed_layers_keep_the_cache(model),
    ):
        # The prompt pass (and every completion pass but the widest) runs through the model without DDP: the
        # widest completion pass is the one DDP forward of this micro-batch, so its reducer sees one forward and
        # one backward; its parameter hooks see the sum of all passes' gradients (autograd adds a parameter's
        # uses within one backward before its hook runs).
        # Under FSDP2 both passes (one completion pass, above) go through the sharded model, whose hooks run per
        # call: each layer's weights are gathered for each pass in forward and backward (twice the all-gathers of
        # the one-forward path, and its gradient reduced once per pass), the gradients adding up as on one process
        # (tests/train/test_fsdp.py compares FSDP, DDP and one process, all on this path).
        cache = _capture_cache(_bare(model).config.get_text_config().num_hidden_layers)
        last_U1X = _unwrap(model)(
            input_ids=prompt_NP[first_U, cols],
            attention_mask=pmask_NP[first_U, cols],
            position_ids=pos_NL[first_U, cols],
            use_cache=False,
            logits_to_keep=1,
            **{key: cache},
        ).logits
        widest = max(range(len(groups)), key=lambda g: groups[g][1])
        parts = []
        for g, (rows, width) in enumerate(groups):
            rows_n = None if len(groups) == 1 else torch.tensor(rows, device=ids_NL.device)
            pick = (lambda x: x) if rows_n is None else (lambda x: x.index_select(0, rows_n))
            prompt_of_n = pick(prompt_of_N)
            # The prompt's last position predicts completion token 0; completion position t predicts token t+1.
            out_ntX = _PromptRows.apply(last_U1X, prompt_of_n)
            if width > 0:
                prefix = [
                    (_PromptRows.apply(layer.keys, prompt_of_n), _PromptRows.apply(layer.values, prompt_of_n))
                    for layer in cache.layers
                ]
                out = (model if g == widest else _unwrap(model))(
                    input_ids=pick(comp_NT[:, :width]),
                    attention_mask=torch.cat([pick(pmask_NP[:, cols]), pick(attn_NL[:, P : P + width])], dim=1),
                    position_ids=pick(pos_NL[:, P : P + width]),
                    use_cache=False,
                    logits_to_keep=0,
                    **{key: _prefix_cache(prefix)},
                ).logits
                out_ntX = torch.cat([out_ntX, out], dim=1)
            ids_nt = pick(comp_NT[:, : width + 1])
            parts.append((rows, _logprobs_from(out_ntX, ids_nt, temperature, with_entropy, head, keep)))
    # Trimmed columns are padding: log-prob and entropy 0 there, outside every loss mask.
    logp_NT = torch.cat([F.pad(lp, (0, T - lp.shape[1])) for _, (lp, _) in parts])
    ent_NT = None if not with_entropy else torch.cat([F.pad(e, (0, T - e.shape[1])) for _, (_, e) in parts])
    if len(parts) > 1:  # back to the micro-batch's row order
        order_N = torch.tensor([r for rows, _ in parts for r in rows], device=ids_NL.device)
        inverse_N = torch.empty_like(order_N)
        inverse_N[order_N] = torch.arange(N, device=ids_NL.device)
        logp_NT = logp_NT.index_select(0, inverse_N)
        ent_NT = None if ent_NT is None else ent_NT.index_select(0, inverse_N)
    return logp_NT, ent_NT
