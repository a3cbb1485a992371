"""rlvr: reinforcement learning from verifiable rewards (GRPO and its refinements).

Suffix legend used across the code base (docs/architecture.md):
  B prompts in a generation batch, G completions per prompt (group), N = B·G completions,
  T completion tokens (padded), P prompt tokens, V vocabulary, K reward functions.
Provenance prefixes: ``old_`` (policy that sampled, recomputed by the trainer), ``ref_`` (frozen
reference), ``sampler_`` (log-probs reported by the rollout engine itself).
"""

__version__ = "0.1.0"
