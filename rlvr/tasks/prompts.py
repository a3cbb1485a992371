"""Prompt text -> token ids, the one place that decides how prompts are rendered.

Chat-message prompts (``[{"role": "user", "content": ...}]``) go through the tokenizer's chat
template with the generation prompt appended and are tokenized without extra special tokens (the
template already holds BOS where the model wants it); plain strings are tokenized with the
tokenizer's own special tokens (BOS for Llama-style tokenizers). Both as TRL 1.16 does.
"""

from __future__ import annotations

from typing import Any


def render_prompt(tokenizer: Any, prompt: str | list[dict]) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the dataset has chat-message prompts but the tokenizer has no chat template; "
                "use a chat/instruct model, set tokenizer.chat_template, or give plain-text prompts"
            )
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")


def encode_prompts(tokenizer: Any, prompts: list, max_prompt_length: int | None = None) -> list[list[int]]:
    """Render and tokenize; longer prompts keep their last max_prompt_length tokens (TRL does the same)."""
    ids: list[list[int]] = [[] for _ in prompts]
    # One tokenizer call per kind (plain text gets the tokenizer's special tokens, a rendered chat has its own):
    # a fast tokenizer encodes a list in one call into Rust, ~5x less time than a call per prompt.
    for plain in (True, False):
        rows = [i for i, p in enumerate(prompts) if isinstance(p, str) == plain]
        if rows:
            texts = [render_prompt(tokenizer, prompts[i]) for i in rows]
            for i, row_ids in zip(rows, tokenizer(texts, add_special_tokens=plain)["input_ids"], strict=True):
                ids[i] = list(row_ids)
    if max_prompt_length is not None:
        ids = [x[-max_prompt_length:] for x in ids]
    empty = [i for i, x in enumerate(ids) if not x]
    if empty:
        raise ValueError(f"prompt {empty[0]} tokenizes to nothing; every prompt needs at least one token")
    return ids


def as_completion_payload(prompt: str | list[dict], text: str) -> str | list[dict]:
    """TRL passes conversational completions as message lists; plain prompts get plain text."""
    if isinstance(prompt, list):
        return [{"role": "assistant", "content": text}]
    return text
