"""``vllm``: vLLM as a rollout engine, colocated in-process or as a server (docs/rollout.md).

Written against vLLM's documented APIs; vLLM is not installed on the machines this was developed
on (its wheel is CUDA-only and far larger than the GPU machine can take), so this module has not
been run: see docs/rollout.md, "What is and is not tested".

- ``mode="colocate"``: an in-process ``vllm.LLM`` on the trainer's GPU. ``n=G`` per prompt (vLLM
  shares the prompt's KV blocks across the group), sleep mode to hand the GPU back to training
  between rollouts, weights pushed from the live policy after each optimizer step through the
  model's ``load_weights`` (the path TRL 1.16 uses), LoRA policies synced as adapters through
  ``LoRARequest`` (no merge), log-probs in ``processed_logprobs`` mode (after temperature).
- ``mode="server"``: ``vllm serve`` started by the user with ``--weight-transfer-config
  '{"backend": "nccl"}'`` (and ``VLLM_SERVER_DEV_MODE=1``, ``--logprobs-mode processed_logprobs``).
  Completions come from ``/v1/completions`` (rlvr.rollout.openai), weights are pushed after each
  step over vLLM's weight-transfer routes (``/init_weight_transfer_engine``, ``/update_weights``,
  ...) with TRL's ``VLLMClient``, which implements that documented protocol.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterable, Sequence

import torch

from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.common import (
    cut_at_eos,
    make_completion,
    resolve_eos_ids,
    validate_request,
)
from rlvr.rollout.openai import OpenAICompletionsEngine

VLLM_MODES = ("colocate", "server")


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "rollout engine 'vllm' needs vLLM, which is not installed in this environment. Install the "
            "extra with `pip install 'rlvr[vllm]'` (a CUDA machine is required), or choose "
            "rollout.backend=native, which samples from the live policy without vLLM."
        )


def make_vllm_engine(model, tokenizer, mode: str = "colocate", **options):
    if mode not in VLLM_MODES:
        raise ValueError(
            f"unknown vllm mode {mode!r}; valid choices: {', '.join(VLLM_MODES)}."
        )
    _require_vllm()
    if mode == "colocate":
        return VLLMColocateEngine(model, tokenizer, **options)
    return VLLMServerEngine(model, tokenizer, **options)


def _is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


class VLLMColocateEngine:
    """An in-process vLLM engine sharing the GPU with training. ``samples_live_policy = False``
    (it holds its own copy), ``receives_weights = True`` (pushed after every optimizer step)."""

    samples_live_policy = False
    receives_weights = True
    reports_logprobs = True  # processed_logprobs mode: after temperature, as the trainer computes them
    policy_lag = 0  # weights pushed after every optimizer step

    def __init__(
        self,
        model,
        tokenizer,
        model_path: str | None = None,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = True,
        sleep_level: int = 2,
        max_model_len: int | None = None,
        dtype: str = "auto",
        seed: int = 0,
        max_lora_rank: int = 64,
        eos_token_ids: int | Sequence[int] | None = None,
        **llm_kwargs,
    ):
        from vllm import LLM

        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = resolve_eos_ids(model, tokenizer, eos_token_ids)
        self.lora = _is_peft(model)
        base = model.get_base_model() if self.lora else model
        path = model_path or getattr(base, "name_or_path", None)
        if not path or not os.path.exists(path):
            raise ValueError(
                "vllm colocate: vLLM builds its engine from a checkpoint folder, and the policy has no local "
                f"name_or_path ({path!r}). Save the initial policy with save_pretrained and pass model_path=..."
            )
        # vLLM's in-process (external_launcher) executor keeps the model in this process, so its
        # load_weights can be called directly; it reads the torch.distributed rendezvous variables.
        for key, value in (
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29533"),
        ):
            os.environ.setdefault(key, value)
        self.llm = LLM(
            model=path,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            distributed_executor_backend="external_launcher",
            logprobs_mode="processed_logprobs",  # after temperature: what the trainer recomputes
            enable_lora=self.lora,
            max_lora_rank=max_lora_rank,
            **llm_kwargs,
        )
        # Level 2 discards the weights (they are re-pushed from the live policy before the next
        # rollout, as TRL does); a LoRA policy needs level 1, which keeps the base weights in CPU RAM.
        self.sleep_mode, self.sleep_level = (
            enable_sleep_mode,
            (1 if self.lora else sleep_level),
        )
        self.version = 0
        self._lora_dir = (
            tempfile.mkdtemp(prefix="rlvr-vllm-lora-") if self.lora else None
        )
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
        self._weights_current = (
            self.sleep_level == 1
        )  # level 1 restores the weights on wake-up

    def _wake_weights(self) -> None:
        if self.sleep_mode and not self._weights_awake:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True

    def _push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._wake_weights()
        model = self._vllm_model()
        for (
            name,
            tensor,
        ) in named_tensors:  # one tensor at a time: no second full copy in memory
            model.load_weights([(name, tensor.detach())])
        self.llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights
        self._weights_current = True

    def _vllm_model(self):
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    def _save_adapter(self) -> None:
        from vllm.lora.request import LoRARequest

        path = os.path.join(self._lora_dir, f"v{self.version}")
        self.model.save_pretrained(path)
        self._lora_request = LoRARequest(
            f"policy-v{self.version}", self.version + 1, path
        )

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the live policy's weights (after an optimizer step). LoRA: save the adapter instead."""
        self.version += 1
        if self.lora:
            self._save_adapter()  # the base weights in vLLM never change
            return
        self._push(named_tensors)

    def generate(
        self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams
    ) -> list[Completion]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        validate_request(prompt_ids, n, sampling)
        if self.sleep_mode:
            if (
                not self._weights_current
            ):  # level 2 forgot them: re-push the same policy (no new version)
                self._push(self.model.named_parameters())
            self._wake_weights()
            self.llm.wake_up(tags=["kv_cache"])
        params = VLLMSamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            seed=sampling.seed,
            logprobs=0,  # the sampled token's log-prob only
            include_stop_str_in_output=True,
        )
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompt_ids],
            params,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        if self.sleep_mode:
            self._sleep()  # hand the GPU memory back to training
        eos = set(self.eos_ids)
        completions = []
        for index, request_output in enumerate(outputs):
            for out in sorted(request_output.outputs, key=lambda o: o.index):
                ids = list(out.token_ids)
                logprobs = (
                    [step[token].logprob for step, token in zip(out.logprobs, ids)]
                    if out.logprobs
                    else None
                )
                ids, logprobs, hit_eos = cut_at_eos(ids, logprobs, eos)
                completions.append(
                    make_completion(
                        index,
                        ids,
                        logprobs,
                        hit_eos,
                        self.tokenizer,
                        sampling.stop,
                        extra={"policy_version": self.version},
                    )
                )
        return completions

    def describe(self, sampling: SamplingParams) -> str:
        return "vllm engine: colocated vLLM, weights pushed after every optimizer step"

    def close(self) -> None:
        del self.llm
        torch.cuda.empty_cache()


class VLLMServerEngine:
    """``vllm serve`` over HTTP, with weights pushed after every optimizer step over vLLM's
    weight-transfer routes (NCCL from this process's GPU to the server's). ``receives_weights = True``.

    Completions go through an ``OpenAICompletionsEngine`` held inside (composition, not
    inheritance: that engine counts a stale server's lag; this one pushes weights every step).
    ``push_weights=False`` leaves the server's weights fixed: then this engine is a stale sampler."""

    samples_live_policy = False
    receives_weights = True
    reports_logprobs = True

    @property
    def policy_lag(self) -> int:
        return 0 if self.client is not None else self.http.policy_lag

    def __init__(
        self,
        model,
        tokenizer,
        base_url: str = "http://127.0.0.1:8000",
        device: int | str = 0,
        push_weights: bool = True,
        **options,
    ):
        if push_weights and _is_peft(model):
            raise ValueError(
                "vllm server mode: pushing a PEFT (LoRA) policy is not supported yet; use mode='colocate' "
                "(adapters are synced with LoRARequest) or merge the adapter before training."
            )
        self.model = model
        self.receives_weights = push_weights
        self.http = OpenAICompletionsEngine(
            model, tokenizer, base_url=base_url, **options
        )
        self.client = None
        if push_weights:
            # TRL's client implements vLLM's documented weight-transfer protocol.
            from trl.generation.vllm_client import VLLMClient

            self.client = VLLMClient(base_url=self.http.base_url)
            self.client.init_communicator(device=device)

    def generate(
        self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams
    ) -> list[Completion]:
        return self.http.generate(prompt_ids, n, sampling)

    def describe(self, sampling: SamplingParams) -> str:
        push = "weights pushed after every optimizer step" if self.client is not None else "fixed server weights"
        return f"vllm engine: vLLM server at {self.http.base_url}, {push}"

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.client is None:
            self.http.load_weights(named_tensors)  # fixed server weights: counts the lag (or reloads)
            return
        self.client.update_model_params(self.model)
        self.client.reset_prefix_cache()  # cached prompt KV was computed by the old weights

    def close(self) -> None:
        if self.client is not None:
            self.client.close_communicator()
