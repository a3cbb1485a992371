"""Suite-wide settings.

One intra-op thread: the models in tests are tiny, and on a 2-core machine shared with other work
(CI, a second pytest) torch's thread pool spin-waits, making a [16, 8, 32] linear ~30x slower than
single-threaded. Results do not depend on it; speed is measured in benchmarks/, not here.
"""

import os

import torch

torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
