"""The ``openai`` engine and the trainer against a real llama.cpp server (stale samplers).

The shipped tiny model is exported to GGUF by rlvr.rollout.gguf_export and served by llama-cpp-python's
OpenAI-compatible server (``python -m llama_cpp.server``) on this machine's CPU. Greedy tokens equal
to the Hugging Face model's prove the export faithful (weights, RoPE layout, tokenizer); log-probs
equal to the trainer's prove they can drive the importance-sampling correction.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from llamacpp_server import __file__ as SERVER_SCRIPT
from smoke_config import smoke_overrides
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.core import token_logprobs
from rlvr.rollout import SamplingParams, make_engine
from rlvr.rollout.gguf_export import _byte_level, _rope_pairs_adjacent, gguf_vocab

PROMPTS = ["37+45=", "8*9=", "12-7=", "(3+4)*2="]


def test_rope_rows_become_adjacent_pairs():
    # One head, D = 4, 1 input column holding the row index: rotate-half pairs rows (0, 2) and
    # (1, 3); llama.cpp rotates adjacent rows, so the pairs must land at (0, 1) and (2, 3).
    w = torch.arange(4.0).reshape(4, 1)
    assert _rope_pairs_adjacent(w, 1).flatten().tolist() == [0.0, 2.0, 1.0, 3.0]
    # Two heads permute independently: the second head's rows 4..7 stay in their own block.
    w = torch.arange(8.0).reshape(8, 1)
    assert _rope_pairs_adjacent(w, 2).flatten().tolist() == [
        0.0,
        2.0,
        1.0,
        3.0,
        4.0,
        6.0,
        5.0,
        7.0,
    ]


def test_shipped_tokenizer_in_gpt2_alphabet(shipped_dir):
    tokens, types, merges, special = gguf_vocab(shipped_dir)
    tok = AutoTokenizer.from_pretrained(shipped_dir)
    assert len(tokens) == len(tok) and merges == []
    assert tokens[tok.convert_tokens_to_ids(" ")] == "Ġ" and tokens[tok.convert_tokens_to_ids("\n")] == "Ċ"
    assert tokens[tok.convert_tokens_to_ids("7")] == "7" and tokens[1] == "<s>"
    assert types[:4] == [3, 3, 3, 2] and set(types[4:]) == {1}  # control, unknown, then normal tokens
    assert special == {"bos": 1, "eos": 2, "pad": 0, "unk": 3}
    assert _byte_level("é") == "Ã©"  # two UTF-8 bytes 0xC3 0xA9, both printable Latin-1


def test_unsupported_tokenizer_is_a_clear_error(tmp_path, shipped_dir):
    tj = json.loads((shipped_dir / "tokenizer.json").read_text())
    tj["model"]["merges"] = [["1", "2"]]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    (tmp_path / "tokenizer_config.json").write_text((shipped_dir / "tokenizer_config.json").read_text())
    with pytest.raises(ValueError, match="character-level BPE with 1 merges"):
        gguf_vocab(tmp_path)


@pytest.fixture(scope="module")
def hf_model_and_tok(shipped_dir):
    return AutoModelForCausalLM.from_pretrained(shipped_dir).eval(), AutoTokenizer.from_pretrained(shipped_dir)


def trainer_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[T] log-probs the trainer computes for ``completion`` after ``prompt`` (temperature 1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1 : -1]
    return token_logprobs(logits, ids[:, len(prompt) :])[0]


@pytest.mark.llamacpp
def test_engine_greedy_and_logprobs_match_hf(llama_server, hf_model_and_tok):
    model, tok = hf_model_and_tok
    engine = make_engine(
        "openai",
        model,
        tok,
        base_url=llama_server.base_url + "/v1",
        dialect="llama-cpp-python",
    )
    assert engine.model_name == "tiny-arith" and engine.policy_lag == 0
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    assert all(p[0] == tok.bos_token_id for p in prompt_ids)

    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    served = engine.generate(prompt_ids, 1, greedy)
    reference = make_engine("hf", model, tok).generate(prompt_ids, 1, greedy)
    # llama-cpp-python does not return the EOS that ends a completion; the engine puts it back.
    assert [c.token_ids for c in served] == [c.token_ids for c in reference]
    assert [c.finish_reason for c in served] == [c.finish_reason for c in reference]
    assert [c.text for c in served] == [c.text for c in reference]
    assert any(c.finish_reason == "stop" for c in served)  # the shipped model answers and stops

    # Stop strings: the server cuts its text before the stop string, but its pieces still hold the
    # stop tokens, so the engine cuts ids and text after it, as every engine does.
    stopped = SamplingParams(temperature=0.0, max_tokens=8, stop=("7", "8"))
    served = engine.generate(prompt_ids, 1, stopped)
    reference = make_engine("hf", model, tok).generate(prompt_ids, 1, stopped)
    assert [c.token_ids for c in served] == [c.token_ids for c in reference]
    assert [c.text for c in served] == [c.text for c in reference]
    assert any(c.text.endswith(("7", "8")) for c in served) and all(c.logprobs is not None for c in served)

    G = 4
    sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=11)
    out = engine.generate(prompt_ids, G, sampling)
    assert [c.prompt_index for c in out] == [i for i in range(len(PROMPTS)) for _ in range(G)]
    assert all(c.finish_reason in ("stop", "length") and c.extra["policy_lag"] == 0 for c in out)
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in out)
    assert len({tuple(c.token_ids) for c in out}) > len(PROMPTS)  # G samples per prompt, not G copies
    # Same seed, same request: the same samples (seeds seed, seed+1, ... one request per sample).
    assert [c.token_ids for c in engine.generate(prompt_ids, G, sampling)] == [c.token_ids for c in out]

    # llama-cpp-python's log-probs are log_softmax of the raw logits: at temperature 1 they are the
    # trainer's. Both sides compute in float32 (the server runs a float32 KV cache). Measured here: max
    # |diff| 4e-5, mean 3e-6 over 20-30 sampled tokens; with llama.cpp's default f16 KV cache the max
    # was 0.05, which this bound catches.
    diffs = torch.cat(
        [
            (torch.tensor(c.logprobs) - trainer_logprobs(model, prompt_ids[c.prompt_index], c.token_ids)).abs()
            for c in out
            if c.token_ids
        ]
    )
    # A restored EOS has no reported log-prob (NaN): the comparison is over the tokens the server scored.
    assert diffs.isnan().sum() == sum(c.finish_reason == "stop" for c in out)
    diffs = diffs[~diffs.isnan()]
    print(
        f"llama.cpp vs trainer log-probs: {diffs.numel()} tokens, max |diff| {diffs.max():.2e}, mean {diffs.mean():.2e}"
    )
    assert diffs.numel() >= len(out) and diffs.max() < 1e-3  # on average a token or more per completion


@pytest.mark.llamacpp
def test_byte_level_gqa_model_matches_hf(byte_level_server, byte_level_dir):
    """The exporter's byte-level BPE path (merges, GPT-2 pre-tokenizer) and the k
    permutation with fewer KV heads than query heads, checked by greedy tokens and log-probs."""
    model = AutoModelForCausalLM.from_pretrained(byte_level_dir).eval()
    tok = AutoTokenizer.from_pretrained(byte_level_dir)
    engine = make_engine(
        "openai",
        model,
        tok,
        base_url=byte_level_server.base_url,
        dialect="llama-cpp-python",
    )
    prompt_ids = [tok.encode(p) for p in ["12 + 30 =", "Sum 7", " 3 + 4 = 7. Sum"]]
    assert len(prompt_ids[0]) < 1 + len("12 + 30 =")  # merges fired
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    served = engine.generate(prompt_ids, 1, greedy)
    reference = make_engine("hf", model, tok).generate(prompt_ids, 1, greedy)
    assert [c.token_ids for c in served] == [c.token_ids for c in reference]  # EOS put back by the engine
    assert [c.text for c in served] == [c.text for c in reference]
    assert all(c.logprobs is not None for c in served) and sum(len(c.token_ids) for c in served) > 10
    diffs = torch.cat([
        (torch.tensor(c.logprobs) - trainer_logprobs(model, prompt_ids[c.prompt_index], c.token_ids)).abs()
        for c in served
    ])  # fmt: skip
    assert diffs[~diffs.isnan()].max() < 1e-3


def overrides(model_dir: Path, data: Path, out: Path, engine_options: str) -> list[str]:
    """A smoke run whose rollouts come from the llama.cpp server (a stale sampler)."""
    return smoke_overrides(
        model_dir,
        data,
        out,
        "rewards=[{name: 'llamacpp_rewards:length_bonus'}]",
        "rollout.backend=openai",
        "rollout.allow_stale_sampler=true",
        f"rollout.engine_options={engine_options}",
    )


@pytest.fixture
def sums(tmp_path) -> Path:
    path = tmp_path / "sums.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": "sums"} for a in range(10) for b in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_metrics(overrides_: list[str], out: Path) -> list[dict]:
    import rlvr.train as train_mod
    from rlvr.config import load_config

    train_mod.train(load_config(None, overrides_))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.llamacpp
def test_trainer_with_stale_llamacpp_sampler(llama_server, shipped_dir, sums, tmp_path):
    out = tmp_path / "run"
    options = f"{{base_url: '{llama_server.base_url}/v1', dialect: llama-cpp-python}}"
    lines = train_metrics(overrides(shipped_dir, sums, out, options), out)
    assert [m["policy_lag"] for m in lines] == [0.0, 1.0, 2.0]
    # Step 1 samples the weights the trainer has: llama.cpp's log-probs are the trainer's. Later steps
    # sample the served (old) weights while the policy moves at lr 1e-2, and the mismatch shows it.
    print(
        "mismatch/abs_logp_diff_mean per step:",
        [m["mismatch/abs_logp_diff_mean"] for m in lines],
    )
    assert lines[0]["mismatch/abs_logp_diff_mean"] < 1e-4
    assert lines[2]["mismatch/abs_logp_diff_mean"] > 10 * lines[0]["mismatch/abs_logp_diff_mean"]
    assert lines[2]["sampling/importance_sampling_ratio/max"] != pytest.approx(1.0, abs=1e-6)


@pytest.mark.llamacpp
def test_reload_every_restarts_llamacpp_on_the_live_policy(llama_server, shipped_dir, sums, tmp_path):
    """Bounded staleness: after each step the policy is exported, converted to GGUF and the server
    restarted on it (llama-cpp-python cannot swap weights in place), so every step samples live weights."""
    out = tmp_path / "run"
    reload_command = (
        f"{sys.executable} {SERVER_SCRIPT} restart --hf {{path}} --gguf {llama_server.gguf} "
        f"--port {llama_server.port} --pid-file {llama_server.pid_file}"
    )
    options = (
        f"{{base_url: '{llama_server.base_url}/v1', dialect: llama-cpp-python, reload_every: 1, "
        f'reload_command: "{reload_command}"}}'
    )
    first_pid = llama_server.pid_file.read_text()
    lines = train_metrics(overrides(shipped_dir, sums, out, options), out)
    assert [m["policy_lag"] for m in lines] == [0.0, 0.0, 0.0]
    assert llama_server.pid_file.read_text() != first_pid  # the server really was restarted
    assert [p.name for p in (out / "policy-exports").iterdir() if p.name.startswith("policy-v")] == ["policy-v3"]
    # Every step samples the live weights, so sampler and trainer log-probs agree at every step.
    print(
        "mismatch/abs_logp_diff_mean per step:",
        [m["mismatch/abs_logp_diff_mean"] for m in lines],
    )
    assert all(m["mismatch/abs_logp_diff_mean"] < 1e-4 for m in lines)


def test_unknown_dialect_is_a_clear_error(hf_model_and_tok):
    model, tok = hf_model_and_tok
    with pytest.raises(ValueError, match="unknown dialect 'llama.cpp'; valid: openai, llama-cpp-python"):
        make_engine("openai", model, tok, base_url="http://127.0.0.1:9", dialect="llama.cpp")
