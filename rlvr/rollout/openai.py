"""``openai``: any OpenAI-compatible ``/v1/completions`` server as a rollout engine.

llama.cpp's server, llama-cpp-python, vLLM, SGLang and TGI all speak this protocol. Such a server
holds its own copy of the weights, so it samples from a **stale** policy: ``samples_live_policy`` is
False and the trainer only accepts it with ``rollout.allow_stale_sampler: true``, counting the lag
and correcting with truncated importance sampling from the log-probs reported here.

Bounded staleness (optional, ``reload_every=k``): every k calls to ``load_weights`` (the trainer calls
it after each optimizer step) the live policy is exported with ``save_pretrained`` to
``export_dir/policy-v{version}`` (written to a temp folder, then renamed, so a server never sees a
half-written checkpoint) and the server is told to reload it, by one of:

- ``reload_url``: POST ``{"path": <folder>, "version": <int>}`` to this URL (a small admin endpoint
  next to your server, or a server that has one);
- ``reload_command``: a shell command run with ``{path}`` and ``{version}`` substituted, which must
  return once the new weights are served (e.g. convert to GGUF and restart ``llama-server``).

The engine then waits until ``/v1/models`` answers, and the lag drops to zero. Every completion
carries ``extra["policy_lag"]``: optimizer steps between the weights that sampled it and the live
policy.

Request: prompt token ids in (no re-tokenization), ``n`` completions, ``logprobs=1``, plus the
non-OpenAI sampling fields that vLLM and llama.cpp understand (``top_k``, ``min_p``,
``repetition_penalty``) and vLLM's ``return_token_ids``. Token ids out, in order of preference:
the choice's ``token_ids`` (vLLM ≥ 0.10.2), ``logprobs.tokens`` as ``"token_id:N"`` (vLLM's
``--return-tokens-as-token-ids``), else the text re-tokenized locally (log-probs are then dropped
unless the lengths agree, because they could be misaligned).

``dialect="llama-cpp-python"`` adapts the request to llama-cpp-python's server (``python -m
llama_cpp.server``, 0.3.x), which differs from the OpenAI protocol in ways read from its source
(``llama_cpp/server/types.py``, ``app.py``, ``Llama._create_completion``): its ``prompt`` must be a
string (a token-id list fails validation), it ignores ``n`` (one choice per request), its
repetition penalty is ``repeat_penalty`` (default 1.1) and its ``min_p`` / ``top_k`` default to 0.05 /
40 (``top_k=0`` disables). So the prompt ids are decoded with special tokens kept and re-tokenized by
the server (checked: ``usage.prompt_tokens`` must equal the prompt's length, else an error), ``n``
requests are sent per prompt with seeds ``s, s+1, ...`` (``s`` the prompt's stream seed, below), and every
filter is sent explicitly.
It returns no token ids; they are recovered from the per-token pieces in ``logprobs.tokens`` when
each piece re-tokenizes to exactly one token (always true for character-level vocabularies; for
SmolLM2's byte-level BPE, 48,772 of its 49,152 tokens render a piece no other token renders, and
each maps back to its id; the others, special tokens rendered as "", bytes of a split UTF-8
character, and tokens longer than the 32-byte buffer of llama-cpp-python 0.3.36's ``detokenize``
(rendered as "" in the text too), make that completion fall back to re-tokenizing its text, log-probs
dropped unless the lengths agree). Its log-probs are ``log_softmax`` of the raw logits (temperature 1, before any
filter), so they are kept only when that is the sampling distribution (temperature 1 or greedy, no
filter or penalty), else reported as None. The EOS token that ends a completion is not returned (no
piece, no log-prob): the engine puts the policy's EOS back, with a NaN log-prob, when the server says
it stopped and no stop string did (llama.cpp also ends on other end-of-generation tokens, such as
``<|endoftext|>`` for SmolLM2, which are then recorded as the policy's EOS).

Seeds: prompt ``i`` of a request seeded ``seed`` is sent ``stream_seed(seed, i·n)`` (rlvr.rollout.common),
and a server seeds its ``j``-th choice ``+ j`` (vLLM does), so no two completions of a run share a noise
stream. Greedy requests ask one completion per prompt and repeat it: greedy is deterministic, and vLLM
refuses ``n > 1`` with it (HTTP 400).

Log-prob semantics depend on the server: vLLM reports raw (pre-temperature) log-probs unless started
with ``--logprobs-mode processed_logprobs``; llama-cpp-python reports raw log-probs (kept only where
they are the sampler's, above);
llama.cpp's own ``llama-server`` reports post-sampling probabilities. The mismatch metrics
(rlvr.rollout.mismatch) show how far they are from the trainer's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.common import (
    cut_at_eos,
    make_completion,
    resolve_eos_ids,
    stream_seed,
    validate_request,
)

# ------------------------------------------------------------------------------------------ HTTP


class CompletionsClient:
    """JSON over HTTP to one OpenAI-compatible server; errors name the URL and the likely fix."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout_s = timeout_s

    def request(self, path: str, payload: dict | None = None, timeout: float | None = None) -> dict:
        url = self.base_url + path
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(url, data=data, method="GET" if payload is None else "POST")
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")[:500]
            raise RuntimeError(
                f"openai engine: {url} answered HTTP {e.code}: {body}. Check that the server supports "
                "/v1/completions with token-id prompts and the sampling fields sent."
            ) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise ConnectionError(
                f"openai engine: cannot reach {url} ({e}). Start the server (e.g. `python -m "
                "llama_cpp.server --model policy.gguf` or `vllm serve <model>`) and set base_url to it."
            ) from None

    def first_served_model(self) -> str:
        models = self.request("/v1/models", timeout=30).get("data") or []
        if not models:
            raise RuntimeError(f"openai engine: {self.base_url}/v1/models lists no model; pass model_name=...")
        return models[0]["id"]

    def wait_ready(self, timeout_s: float) -> None:
        """Until ``/v1/models`` answers (a server restarting on new weights), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.request("/v1/models", timeout=10)
                return
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


# -------------------------------------------------------------------------------------- dialects


class OpenAIDialect:
    """vLLM, SGLang, TGI, llama.cpp's llama-server: token-id prompts, ``n`` choices in one request."""

    #: The EOS that ends a completion is in the returned tokens (vLLM, llama-server return it).
    returns_eos = True

    def logprobs_follow(self, sampling: SamplingParams) -> bool:
        """Whether the reported log-probs are the sampling distribution's (the server's own setting,
        e.g. vLLM's ``--logprobs-mode``; the mismatch metrics show it when they are not)."""
        return True

    def choices(
        self, client: CompletionsClient, model_name: str, tokenizer, prompt: list[int], n: int, sampling: SamplingParams
    ) -> list[dict]:
        payload = {
            "model": model_name,
            "prompt": prompt,
            "n": n,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 1,
            "echo": False,
            # Non-OpenAI fields understood by vLLM and llama.cpp; OpenAI itself would reject them,
            # but it does not take token-id prompts of custom models either.
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "min_p": sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if sampling.stop:
            payload["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            payload["seed"] = sampling.seed
        resp = client.request("/v1/completions", payload)
        return sorted(resp.get("choices", []), key=lambda c: c.get("index", 0))


class LlamaCppPythonDialect:
    """``python -m llama_cpp.server`` (0.3.x): a text prompt, one choice per request, every filter explicit
    (its defaults filter), its own name for the repetition penalty (see the module docstring)."""

    #: Its generation loop breaks on an end-of-generation token before recording it (no piece, no log-prob).
    returns_eos = False

    def logprobs_follow(self, sampling: SamplingParams) -> bool:
        """Its log-probs are ``log_softmax`` of the raw logits (``Llama.logits_to_logprobs(self._scores)``),
        whatever the temperature and filters: the sampling distribution's only for plain sampling at
        temperature 1, or greedy (whose log-probs are defined at temperature 1). Otherwise they are a
        different distribution's, and an importance weight built on them would be wrong, not stale."""
        plain = sampling.top_p == 1.0 and sampling.top_k <= 0 and sampling.min_p == 0.0
        return sampling.temperature in (0.0, 1.0) and plain and sampling.repetition_penalty == 1.0

    def choices(
        self, client: CompletionsClient, model_name: str, tokenizer, prompt: list[int], n: int, sampling: SamplingParams
    ) -> list[dict]:
        return [self._one(client, model_name, tokenizer, prompt, sampling, i) for i in range(n)]

    def _one(
        self, client: CompletionsClient, model_name: str, tokenizer, prompt: list[int], sampling: SamplingParams, i: int
    ) -> dict:
        payload = {
            "model": model_name,
            # Special tokens kept so the server's tokenizer (special=True) maps "<s>" back to BOS.
            "prompt": tokenizer.decode(prompt, skip_special_tokens=False),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": max(sampling.top_k, 0),
            "min_p": sampling.min_p,
            "repeat_penalty": sampling.repetition_penalty,
            "logprobs": 1,
            "echo": False,
        }
        if sampling.stop:
            payload["stop"] = list(sampling.stop)
        if sampling.seed is not None:  # one request per sample: distinct, reproducible seeds
            payload["seed"] = sampling.seed + i
        resp = client.request("/v1/completions", payload)
        served = (resp.get("usage") or {}).get("prompt_tokens")
        if served is not None and served != len(prompt):
            raise RuntimeError(
                f"openai engine (llama-cpp-python): the server tokenized the {len(prompt)}-token prompt "
                f"{payload['prompt']!r} into {served} tokens, so it would sample from a different prompt. "
                "The GGUF's tokenizer must reproduce the policy's (rlvr.rollout.gguf_export writes one that "
                "does for byte-level and character-level BPE), and its add_bos_token must be false."
            )
        return (resp.get("choices") or [{}])[0]


#: Request/response conventions understood by ``dialect=``; see the module docstring.
DIALECTS: dict[str, type] = {"openai": OpenAIDialect, "llama-cpp-python": LlamaCppPythonDialect}


# ------------------------------------------------------------------------------ token-id recovery


def _piece_ids(choice: dict, n_logprobs: int, tokenizer) -> list[int] | None:
    """Ids from the per-token text pieces of ``logprobs.tokens`` (servers that return no ids), when
    each piece is exactly one token and the pieces spell the returned text; else None."""
    pieces = (choice.get("logprobs") or {}).get("tokens") or []
    if len(pieces) != n_logprobs or not "".join(pieces).startswith(choice.get("text", "")):
        return None
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in pieces]
    return [i[0] for i in ids] if all(len(i) == 1 for i in ids) else None


def choice_ids(choice: dict, tokenizer) -> tuple[list[int], list[float] | None]:
    """A choice's token ids and log-probs, ids taken in order of preference (see the module docstring);
    log-probs that cannot be aligned with the ids are reported as None rather than wrong."""
    lp = choice.get("logprobs") or {}
    logprobs = lp.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None and lp.get("tokens") and all(str(t).startswith("token_id:") for t in lp["tokens"]):
        ids = [int(str(t).split(":", 1)[1]) for t in lp["tokens"]]
    if ids is None and logprobs is not None:
        ids = _piece_ids(choice, len(logprobs), tokenizer)
    if ids is None:
        ids = tokenizer.encode(choice.get("text", ""), add_special_tokens=False)
    if logprobs is not None and (len(logprobs) != len(ids) or any(x is None for x in logprobs)):
        logprobs = None  # cannot be aligned with the ids: report none rather than wrong ones
    return list(ids), None if logprobs is None else [float(x) for x in logprobs]


# ---------------------------------------------------------------------------- export and reload


class PolicyExporter:
    """Writes the live policy for a server to reload and tells the server to reload it."""

    def __init__(
        self,
        model,
        tokenizer,
        export_dir: str | None,
        reload_url: str | None,
        reload_command: str | None,
        ready_timeout_s: float,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.export_dir = export_dir or tempfile.mkdtemp(prefix="rlvr-policy-export-")
        self.reload_url, self.reload_command, self.ready_timeout_s = reload_url, reload_command, ready_timeout_s

    def export(self, version: int) -> str:
        """``save_pretrained`` into a temp folder renamed into ``policy-v{version}``: a server never sees a
        half-written checkpoint. A PEFT policy saves its adapter only (vLLM serves adapters via
        /v1/load_lora_adapter); merging here would mutate the model being trained."""
        final = os.path.join(self.export_dir, f"policy-v{version}")
        tmp = tempfile.mkdtemp(prefix=f".policy-v{version}-", dir=self.export_dir)
        self.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def ask_server_to_reload(self, final: str, version: int) -> None:
        if self.reload_url:
            req = urllib.request.Request(
                self.reload_url, data=json.dumps({"path": final, "version": version}).encode(), method="POST"
            )
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req, timeout=self.ready_timeout_s):
                pass
        if self.reload_command:
            cmd = self.reload_command.format(path=shlex.quote(final), version=version)
            done = subprocess.run(
                cmd, shell=True, capture_output=True, text=True, timeout=self.ready_timeout_s, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"openai engine: reload_command exited {done.returncode}: {done.stderr[-500:]}. "
                    "The server keeps its previous weights; fix the command or set reload_every=0."
                )

    def prune(self, keep: str) -> None:
        """Only the served export is kept: a 7B policy is ~15 GB per copy."""
        for name in os.listdir(self.export_dir):
            path = os.path.join(self.export_dir, name)
            if name.startswith("policy-v") and path != keep:
                shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------ the engine


class OpenAICompletionsEngine:
    """Rollouts from an OpenAI-compatible completions server. ``samples_live_policy = False``.

    Composed of a ``CompletionsClient`` (HTTP), a dialect (request shape), ``choice_ids`` (token-id
    recovery) and a ``PolicyExporter`` (export and reload); the engine itself keeps the staleness count."""

    samples_live_policy = False
    #: False: ``load_weights`` cannot make the server current (a reload, when configured, lands only
    #: every ``reload_every`` steps), so the config must require ``allow_stale_sampler: true``.
    receives_weights = False
    #: True: log-probs are requested with every completion; ones that do not align with the returned
    #: tokens are dropped (that completion's ``logprobs`` is None).
    reports_logprobs = True

    def __init__(
        self,
        model,
        tokenizer,
        base_url: str,
        model_name: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 16,
        eos_token_ids: int | Sequence[int] | None = None,
        reload_every: int = 0,
        export_dir: str | None = None,
        reload_url: str | None = None,
        reload_command: str | None = None,
        ready_timeout_s: float = 600.0,
        dialect: str = "openai",
    ):
        if dialect not in DIALECTS:
            raise ValueError(
                f"openai engine: unknown dialect {dialect!r}; valid: {', '.join(DIALECTS)}. Use 'openai' for "
                "vLLM, SGLang, TGI and llama.cpp's llama-server, 'llama-cpp-python' for python -m llama_cpp.server."
            )
        if reload_every < 0:
            raise ValueError(f"reload_every must be >= 0 (0 = never reload), got {reload_every}.")
        if reload_every and not (reload_url or reload_command):
            raise ValueError(
                "openai engine: reload_every > 0 needs a way to tell the server to reload: set reload_url "
                "(POST {path, version}) or reload_command (a shell command with {path}), or set reload_every=0 "
                "to sample from the server's fixed weights."
            )
        self.dialect, self.request_dialect = dialect, DIALECTS[dialect]()
        self.tokenizer = tokenizer
        self.client = CompletionsClient(base_url, api_key, timeout_s)
        self.base_url = self.client.base_url
        self.max_concurrency = max_concurrency
        self.eos_ids = resolve_eos_ids(model, tokenizer, eos_token_ids)
        self.reload_every = reload_every
        self.exporter = PolicyExporter(model, tokenizer, export_dir, reload_url, reload_command, ready_timeout_s)
        self.export_dir = self.exporter.export_dir
        #: optimizer steps seen (one per load_weights call), and the step the server's weights are from.
        self.policy_version = 0
        self.served_version = 0
        self.model_name = model_name or self.client.first_served_model()

    def describe(self, sampling: SamplingParams) -> str:
        reload = f", reloaded every {self.reload_every} steps" if self.reload_every else ", never reloaded"
        dropped = ""
        if not self.request_dialect.logprobs_follow(sampling):
            dropped = (f"; its log-probs are not reported: {self.dialect} gives them at temperature 1 before any "
                       "filter, not for this sampling, so no importance correction")
        return f"openai engine: {self.base_url} serving {self.model_name!r} (its own weights{reload}){dropped}"

    @property
    def policy_lag(self) -> int:
        """Optimizer steps between the weights the server samples from and the live policy."""
        return self.policy_version - self.served_version

    # -- sampling -------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        validate_request(prompt_ids, n, sampling)
        workers = max(1, min(self.max_concurrency, len(prompt_ids)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            groups = list(pool.map(lambda ip: self._one_prompt(ip[0], ip[1], n, sampling), enumerate(prompt_ids)))
        return [c for group in groups for c in group]

    def _one_prompt(self, index: int, prompt: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        n_request = 1 if sampling.temperature == 0.0 else n  # greedy: one, repeated (module docstring)
        if sampling.seed is not None:  # this prompt's own noise streams, index·n + j
            sampling = dataclasses.replace(sampling, seed=stream_seed(sampling.seed, index * n))
        choices = self.request_dialect.choices(
            self.client, self.model_name, self.tokenizer, prompt, n_request, sampling
        )
        if len(choices) != n_request:
            raise RuntimeError(
                f"openai engine: asked for n={n_request} completions, the server returned {len(choices)}."
            )
        eos = set(self.eos_ids)
        keep_logprobs = self.request_dialect.logprobs_follow(sampling)
        out = []
        for choice in choices:
            ids, logprobs = choice_ids(choice, self.tokenizer)
            ids, logprobs, hit_eos = cut_at_eos(ids, logprobs if keep_logprobs else None, eos)
            extra = {"policy_lag": self.policy_lag, "server_finish_reason": choice.get("finish_reason")}
            completion = make_completion(index, ids, logprobs, hit_eos, self.tokenizer, sampling.stop, extra=extra)
            # A server may stop on its own EOS list (e.g. the GGUF's) that we do not know about.
            if not hit_eos and choice.get("finish_reason") == "stop" and len(ids) < sampling.max_tokens:
                if completion.finish_reason != "stop" and not self.request_dialect.returns_eos and len(eos) == 1:
                    # The server ended on the end-of-generation token without returning it. Put the
                    # policy's EOS back, as every other engine returns it: the trainer's completion mask
                    # keeps it, and without it a run never reinforces stopping. Its log-prob was not
                    # reported: NaN, which the importance weights and mismatch metrics skip.
                    ids = ids + [self.eos_ids[0]]
                    logprobs = None if logprobs is None else logprobs + [math.nan]
                    completion = make_completion(index, ids, logprobs, True, self.tokenizer, (), extra=extra)
                completion.finish_reason = "stop"
            elif choice.get("finish_reason") in ("abort", "error"):
                completion.finish_reason = choice["finish_reason"]  # a broken sample, not a long one
            out.append(completion)
        return [dataclasses.replace(c, extra=dict(c.extra)) for c in out for _ in range(n // n_request)]

    # -- staleness ------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Count one optimizer step; every ``reload_every`` steps, export the live policy and have the
        server reload it. The tensors themselves are not read (the live model object is exported)."""
        self.policy_version += 1
        if self.reload_every and self.policy_lag >= self.reload_every:
            self.reload()

    def reload(self) -> str:
        """Export the live policy now and make the server serve it. Returns the exported folder."""
        version = self.policy_version
        final = self.exporter.export(version)
        self.exporter.ask_server_to_reload(final, version)
        self.client.wait_ready(self.exporter.ready_timeout_s)
        self.served_version = version
        self.exporter.prune(keep=final)
        return final

    def close(self) -> None:
        pass
