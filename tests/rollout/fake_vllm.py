"""A stand-in for the few vLLM pieces rlvr.rollout.vllm calls, for the logic tests that must run
where vLLM is not installed. It copies vLLM 0.32's behaviour where rlvr depends on it (read from its
source): ``SamplingParams`` refuses ``n > 1`` with greedy sampling; child ``j`` of a prompt is
seeded ``seed + j``; generation ends at ``stop_token_ids``; a constructor seeds the global RNGs and
starts a one-rank torch.distributed group like vLLM's in-process worker does. Tokens are drawn
uniformly from the stream's own generator, so two completions are identical exactly when their seeds
are. What it cannot show (the real kernels, log-prob values, weight loading) is tested against real
vLLM in tests/vllm_cpu."""

from __future__ import annotations

import importlib.machinery
import random
import sys
import types
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None


@dataclass
class RequestOutput:
    outputs: list[CompletionOutput]


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, seed=None, max_tokens=16, stop_token_ids=None, **rest):
        if temperature < 1e-5 and n > 1:
            raise ValueError("n must be 1 when using greedy sampling, got 2.")  # vLLM's message
        if rest.get("top_p", 1.0) <= 0.0:
            raise ValueError("top_p must be in (0, 1].")
        self.n, self.temperature, self.seed, self.max_tokens = n, temperature, seed, max_tokens
        self.stop_token_ids = list(stop_token_ids or [])
        self.rest = rest


@dataclass
class TokensPrompt:
    prompt_token_ids: list[int]


@dataclass
class LoRARequest:
    name: str
    int_id: int
    path: str


@dataclass
class Calls:
    log: list = field(default_factory=list)


class LLM:
    vocab_size = 80
    #: finish reason forced on every output (None: vLLM's own "stop" / "length").
    force_finish: str | None = None
    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list = []
        torch.manual_seed(kwargs.get("seed", 0))  # as vLLM's in-process worker does (set_random_seed)
        random.seed(kwargs.get("seed", 0))
        if not dist.is_initialized():  # vLLM's worker starts a one-rank group (its own free port)
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        LLM.instances.append(self)

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        self.calls.append(("generate", lora_request))
        params = params if isinstance(params, list) else [params] * len(prompts)
        out = []
        for prompt, p in zip(prompts, params):
            children = []
            for j in range(p.n):
                rng = random.Random(None if p.seed is None else p.seed + j)
                ids, finish = [], "length"
                for _ in range(p.max_tokens):
                    ids.append(rng.randrange(self.vocab_size))
                    if ids[-1] in p.stop_token_ids:
                        finish = "stop"
                        break
                lps = [{t: Logprob(-1.0)} for t in ids]
                children.append(CompletionOutput(j, ids, lps, self.force_finish or finish))
            out.append(RequestOutput(children[::-1]))  # out of order: the engine must sort by index
        return out

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "weights_iterator" in kwargs:
            kwargs["weights_iterator"] = [name for name, _ in kwargs["weights_iterator"]]
        self.calls.append(("collective_rpc", method, kwargs))
        return [None]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def _destroy_model_parallel():
    pass


def _destroy_distributed_environment():
    if dist.is_initialized():
        dist.destroy_process_group()


def install(monkeypatch) -> type[LLM]:
    """Make ``import vllm`` (and the submodules rlvr uses) return this fake, for one test."""
    LLM.instances = []
    LLM.force_finish = None
    mods = {}
    for name in (
        "vllm",
        "vllm.inputs",
        "vllm.lora",
        "vllm.lora.request",
        "vllm.distributed",
        "vllm.distributed.parallel_state",
    ):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mods[name] = mod
    mods["vllm"].LLM, mods["vllm"].SamplingParams = LLM, SamplingParams
    mods["vllm.inputs"].TokensPrompt = TokensPrompt
    mods["vllm.lora.request"].LoRARequest = LoRARequest
    mods["vllm.distributed.parallel_state"].destroy_model_parallel = _destroy_model_parallel
    mods["vllm.distributed.parallel_state"].destroy_distributed_environment = _destroy_distributed_environment
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return LLM
