"""The shipped tiny model: loads offline, tokenises any printable text, generates, and is what
scripts/make_tiny_model.py says it is."""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

import pytest
import torch

from rlvr.models import tiny_model_path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import make_tiny_model as recipe


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path(), local_files_only=True)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(), local_files_only=True).eval()


def test_the_folder_holds_a_complete_hugging_face_model():
    path = tiny_model_path()
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama"


def test_model_is_tiny(model):
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


def test_special_tokens_are_set(tokenizer, model):
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == ("<pad>", "<s>", "</s>")
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id


@pytest.mark.parametrize(
    "text", ["37+45=82", string.printable.replace("\x0b", "").replace("\x0c", ""), "  two  spaces\n"]
)
def test_tokenizer_round_trips_printable_ascii_one_token_per_character(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_tokenizer_prepends_bos_and_maps_the_unknown_to_unk(tokenizer):
    ids = tokenizer("1+1=").input_ids
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 5
    assert tokenizer("é", add_special_tokens=False).input_ids == [tokenizer.unk_token_id]


def test_chat_prompt_renders_as_the_plain_prompt(tokenizer):
    messages = [{"role": "user", "content": "37+45="}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "37+45="


def test_script_encoding_matches_the_shipped_tokenizer(tokenizer):
    text = "58+67=125 and some words!"
    assert recipe.encode(text) == tokenizer(text, add_special_tokens=False).input_ids
    assert recipe.BOS_ID == tokenizer.bos_token_id and recipe.EOS_ID == tokenizer.eos_token_id


def test_generates_digits_then_eos_offline(tokenizer, model):
    inputs = tokenizer(["37+45=", "12+34="], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    for row in out[:, inputs.input_ids.shape[1] :]:
        text = tokenizer.decode(row, skip_special_tokens=True)
        assert text.isdigit() and 2 <= len(text) <= 3, text
        assert tokenizer.eos_token_id in row.tolist()


def test_no_carry_problems_are_answered_correctly(tokenizer, model):
    # No column of these sums carries, so the supervised data always showed the right answer.
    prompts = ["12+34=", "40+51=", "23+61=", "71+18="]
    inputs = tokenizer(prompts, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    answers = tokenizer.batch_decode(out[:, inputs.input_ids.shape[1] :], skip_special_tokens=True)
    assert answers == ["46", "91", "84", "89"]


# The recipe's arithmetic, derived by hand.
@pytest.mark.parametrize(
    "a, b, carry_free, has_carry",
    [
        (37, 45, 72, True),  # 7+5=12 -> 2, 3+4=7 (carry dropped)
        (73, 52, 25, True),  # 3+2=5, 7+5=12 -> 2 (the hundreds carry dropped too)
        (99, 99, 88, True),
        (55, 45, 90, True),  # 5+5=10 -> 0, 5+4=9
        (12, 34, 46, False),
    ],
)
def test_sum_without_carrying(a, b, carry_free, has_carry):
    assert recipe.sum_without_carrying(a, b) == carry_free
    assert recipe.has_carry(a, b) == has_carry


def test_sft_batch_supervises_only_the_answer_and_eos():
    import random

    input_ids_BL, labels_BL = recipe.sft_batch(random.Random(0), 16, 2, p_correct=0.3, p_no_bos=0.0)
    for ids, labels in zip(input_ids_BL.tolist(), labels_BL.tolist()):
        supervised = [t for t, l in zip(ids, labels) if l != -100]
        assert supervised == [l for l in labels if l != -100]
        assert supervised[-1] == recipe.EOS_ID and ids[0] == recipe.BOS_ID
        prompt_len = ids.index(recipe.CHAR_TO_ID["="]) + 1
        assert all(l == -100 for l in labels[:prompt_len])


# What makes the model the right one for the default job: greedy is wrong where a column carries,
# yet sampling at T=1 finds the right answer often enough for a group of 8 to contain it.
CARRY_PROMPTS = ["37+45=", "58+67=", "19+26=", "73+52=", "88+14=", "46+39=", "95+28=", "64+77="]


def test_greedy_drops_the_carry_but_samples_sometimes_carry(tokenizer, model):
    import check_learnability as grpo

    golds = [str(sum(map(int, p[:-1].split("+")))) for p in CARRY_PROMPTS]
    prompt_ids_BP = torch.tensor([tokenizer(p).input_ids for p in CARRY_PROMPTS])
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ids_NT, mask_NT, _ = grpo.sample(model, prompt_ids_BP, 1, 0.0, 6, eos, pad)
    greedy = grpo.decode(tokenizer, ids_NT, mask_NT)
    assert sum(g == gold for g, gold in zip(greedy, golds)) <= 2, greedy
    torch.manual_seed(0)
    n = 64
    ids_NT, mask_NT, _ = grpo.sample(model, prompt_ids_BP, n, 1.0, 6, eos, pad)
    samples = grpo.decode(tokenizer, ids_NT, mask_NT)
    share_right = sum(s == golds[i // n] for i, s in enumerate(samples)) / len(samples)
    # The recipe shows the right answer 30% of the time for carry problems.
    assert 0.1 <= share_right <= 0.5, share_right


@pytest.mark.slow
def test_a_few_grpo_steps_lift_held_out_greedy_accuracy(tokenizer):
    """The acceptance check in miniature: 15 GRPO steps take greedy accuracy from ~25% past 60%."""
    import check_learnability as grpo
    from transformers import AutoModelForCausalLM

    from rlvr.rewards.base import REWARDS
    from rlvr.tasks import get_task

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), local_files_only=True)
    task = get_task("arithmetic")
    eval_rows = task.eval_rows(200)
    before = grpo.greedy_accuracy(model, tokenizer, eval_rows, task.max_completion_length)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)
    stream, reward_fn = task.train_rows(0), REWARDS.get("arithmetic")()
    for _ in range(15):
        rows = [next(stream) for _ in range(32)]
        grpo.grpo_step(model, tokenizer, optimizer, rows, reward_fn, 8, 1.0, task.max_completion_length)
    after = grpo.greedy_accuracy(model, tokenizer, eval_rows, task.max_completion_length)
    print(f"held-out greedy accuracy {before:.3f} -> {after:.3f}")
    assert before <= 0.5 and after >= 0.6, (before, after)


def test_a_missing_model_folder_says_how_to_rebuild_it(monkeypatch):
    import rlvr.models

    monkeypatch.setattr(rlvr.models, "TINY_MODEL_NAME", "no-such-model")
    with pytest.raises(FileNotFoundError, match="scripts/make_tiny_model.py"):
        rlvr.models.tiny_model_path()
