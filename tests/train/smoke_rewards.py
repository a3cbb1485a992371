"""Reward functions the trainer tests reference by dotted path ('smoke_rewards:length_bonus')."""


def exact_answer(prompts, completions, completion_ids=None, answer=None, **_):
    """1.0 when the stripped completion equals the gold answer."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def length_bonus(prompts, completions, completion_ids=None, **_):
    """Spread even for a random model: longer completions score higher."""
    return [len(ids) / 8.0 for ids in completion_ids]


def flaky(prompts, completions, completion_ids=None, **_):
    raise RuntimeError("checker service unavailable")


def wrong_length(prompts, completions, completion_ids=None, **_):
    return [1.0]


def spread_only_for_big_a(prompts, completions, completion_ids=None, **_):
    """Zero spread (constant 1.0) for prompts 'a+b=' with a < 5; length-based spread otherwise."""
    return [1.0 if int(p[0]) < 5 else len(ids) / 8.0 for p, ids in zip(prompts, completion_ids)]


def constant(prompts, completions, completion_ids=None, **_):
    return [1.0] * len(completions)
