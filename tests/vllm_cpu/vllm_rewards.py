"""Reward the trainer test references by dotted path ('vllm_rewards:length_bonus')."""


def length_bonus(prompts, completions, completion_ids=None, **_):
    """Spread within every group whatever the policy: longer completions score higher."""
    return [len(ids) / 8.0 for ids in completion_ids]
