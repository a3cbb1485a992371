"""Tiny models and a char-level tokenizer built locally (no hub), shaped like the default task:
~8-token arithmetic prompts ("37+45=") and short completions.

Test modules import these from here (``from rollout_models import tiny_model``), not from conftest:
several test folders have a conftest.py, and ``from conftest import`` picks whichever was loaded first.
"""

from __future__ import annotations

from rlvr.models.toy import CHARS, char_tokenizer, toy_model  # noqa: F401  (re-exported for the tests)


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    """A 2-layer GQA model of ``arch`` over ``char_tokenizer()``. A wide init (0.2) makes the random
    model's next-token distribution peaked, so greedy paths and stop conditions are meaningful rather
    than decided by float ties between ~uniform logits."""
    tok = char_tokenizer()
    return toy_model(arch, len(tok), seed=seed, **{"initializer_range": 0.2, **overrides}), tok
