"""benchmarks/vs_trl.py gives TRL and rlvr the same workload: every shared setting reaches both configs
with the same value, and the fixed-length workload's EOS is a token its model cannot emit."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_trl.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vs_trl_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _files(tmp_path: Path) -> dict:
    from rlvr.models import tiny_model_path

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(10, 30)))
    return {"model_path": str(tiny_model_path()), "prompts": str(prompts), "reward": f"{BENCH}:id_reward"}


# GRPOConfig field -> where rlvr keeps the same setting.
RLVR_FIELD = {
    "num_generations": "rollout.num_generations",
    "per_device_train_batch_size": "train.per_device_train_batch_size",
    "gradient_accumulation_steps": "train.gradient_accumulation_steps",
    "max_completion_length": "rollout.max_completion_length",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "learning_rate": "train.learning_rate",
    "lr_scheduler_type": "train.lr_scheduler_type",
    "max_grad_norm": "train.max_grad_norm",
    "loss_type": "algo.loss_type",
    "beta": "algo.beta",
    "epsilon": "algo.epsilon",
    "scale_rewards": "algo.scale_rewards",
    "num_iterations": "algo.num_iterations",
    "max_steps": "train.max_steps",
    "seed": "train.seed",
}


@pytest.mark.parametrize(("name", "prompts_per_step"), [("tiny", None), ("27m", None), ("smollm2", None),
                                                        ("smollm2", 3), ("smollm2", 4)])
def test_both_frameworks_get_the_same_workload(bench, tmp_path, name, prompts_per_step):
    from trl import GRPOConfig

    from rlvr.config import load_config

    w = bench.scaled(bench.WORKLOADS[name], prompts_per_step)
    trl = GRPOConfig(**bench.trl_args(w, 7, str(tmp_path / "trl"), bf16=False))
    cfg = load_config(None, bench.rlvr_overrides(w, _files(tmp_path), 7, 2, tmp_path / "run"))
    shared = bench.shared_settings(w, 7)
    assert set(shared) == set(RLVR_FIELD)
    for trl_name, where in RLVR_FIELD.items():
        section, key = where.split(".")
        rlvr_value = getattr(getattr(cfg, section), key)
        trl_value = getattr(trl, trl_name)
        trl_value = getattr(trl_value, "value", trl_value)  # transformers' enums (lr_scheduler_type)
        assert rlvr_value == trl_value == shared[trl_name], trl_name
    # The generation batch: completions per optimizer step, cut into the same micro-batches.
    gen_batch = cfg.train.per_device_train_batch_size * cfg.train.micro_batches_per_generation
    assert gen_batch == trl.generation_batch_size == w.completions_per_step == w.micro_batch * w.grad_accum
    assert trl.steps_per_generation == cfg.train.micro_batches_per_generation == w.grad_accum
    # TRL: CPU, no vLLM, nothing saved, quiet; rlvr: float32, the native engine, the requested threads.
    assert (trl.use_cpu, trl.use_vllm, trl.save_strategy, trl.bf16, trl.report_to) == (True, False, "no", False, [])
    assert (cfg.model.dtype, cfg.rollout.backend, cfg.train.num_threads) == ("float32", "native", 2)


def test_fixed_length_workload_cannot_emit_its_eos(bench, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2, max_position_embeddings=64)
    monkeypatch.setattr(bench, "LLAMA_27M", small)
    bench._save_random_llama(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    logits = model(torch.tensor([tok.encode("12+34=")])).logits
    assert logits.shape[-1] == tok.eos_token_id == len(tok) - 1  # one past the last id the model scores
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_prompts_per_step_keeps_the_micro_batch(bench):
    w = bench.scaled(bench.WORKLOADS["smollm2"], 3)
    assert (w.completions_per_step, w.micro_batch, w.grad_accum) == (24, 8, 3)
    with pytest.raises(SystemExit, match="micro-batch"):
        bench.scaled(bench.WORKLOADS["27m"], 3)  # 24 completions in micro-batches of 16
