"""pack: [left-padded prompt | right-padded completion] rows, masks, positions and sampler log-probs,
checked element by element on a hand-written batch."""

from __future__ import annotations

import math

import torch

from rlvr.batch import Rollouts, pack
from rlvr.rollout.base import Completion

PAD = 0


def test_rows_masks_positions_and_sampler_logprobs_by_hand():
    comps = [
        Completion(0, [7, 8], "", "stop", logprobs=[-0.5, -0.25]),
        Completion(0, [], "", "length", logprobs=[]),
        Completion(1, [9, 10, 11], "", "length", logprobs=None),  # the engine gave none: NaN row
        Completion(1, [12], "", "stop", logprobs=[-1.0]),
    ]
    packed = pack(Rollouts(2, [{"prompt": ""}] * 2, [[3, 4, 5], [6]], comps), PAD, torch.device("cpu"))
    assert packed.prompt_len == 3
    assert packed.input_ids_NL.tolist() == [
        [3, 4, 5, 7, 8, PAD],
        [3, 4, 5, PAD, PAD, PAD],
        [PAD, PAD, 6, 9, 10, 11],
        [PAD, PAD, 6, 12, PAD, PAD],
    ]
    assert packed.attention_mask_NL.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 1, 0, 0],
    ]
    assert packed.position_ids_NL.tolist() == [
        [0, 1, 2, 3, 4, 4],
        [0, 1, 2, 2, 2, 2],
        [0, 0, 0, 1, 2, 3],
        [0, 0, 0, 1, 1, 1],
    ]
    assert packed.completion_ids_NT.tolist() == [[7, 8, PAD], [PAD, PAD, PAD], [9, 10, 11], [12, PAD, PAD]]
    assert packed.mask_NT.dtype == torch.float32
    assert packed.mask_NT.tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 0, 0]]
    s = packed.sampler_logp_NT.tolist()
    assert s[0] == [-0.5, -0.25, 0.0] and s[1] == [0.0, 0.0, 0.0] and s[3] == [-1.0, 0.0, 0.0]
    assert all(math.isnan(v) for v in s[2])


def test_no_sampler_logprobs_anywhere_gives_none():
    comps = [Completion(0, [7], "", "stop"), Completion(0, [8, 9], "", "stop")]
    packed = pack(Rollouts(2, [{"prompt": ""}], [[3]], comps), PAD, torch.device("cpu"))
    assert packed.sampler_logp_NT is None
    assert packed.input_ids_NL.tolist() == [[3, 7, PAD], [3, 8, 9]]
