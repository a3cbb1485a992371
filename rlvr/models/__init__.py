"""The tiny model shipped with rlvr, and where to find it.

``tiny-arith`` is a character-level Llama of a few hundred thousand parameters, trained by
``scripts/make_tiny_model.py`` to add 2-digit numbers the way a pupil who often forgets to carry
does: its greedy answer is usually wrong when a column carries, but it samples the right answer
often enough for GRPO to find and amplify it. It is what ``rlvr train`` trains by default.
"""

from __future__ import annotations

from pathlib import Path

TINY_MODEL_NAME = "tiny-arith"


def tiny_model_path() -> Path:
    """Folder of the shipped tiny model (Hugging Face format; loads offline with
    ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``)."""
    path = Path(__file__).resolve().parent / TINY_MODEL_NAME
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the shipped tiny model is missing from {path}; rebuild it with "
            "`PYTHONPATH=. python scripts/make_tiny_model.py` from the repository root"
        )
    return path


__all__ = ["TINY_MODEL_NAME", "tiny_model_path"]
