"""Batch layout and grouping: pure functions on hand-made completions."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.rollout.generator import Completion
from toolgrpo.trainer.batch import (
    Batch,
    collate,
    microbatch_indices,
    minibatch_indices,
    prompt_groups,
)

PAD = 0


def _c(i, prompt, tokens, reason="length"):
    return Completion(
        i, list(prompt), list(tokens), [-0.1 * (k + 1) for k in range(len(tokens))], reason
    )


@pytest.fixture
def comps():
    return [
        _c(0, [11, 12, 13], [21, 22]),
        _c(0, [11, 12, 13], [23]),
        _c(1, [14], [24, 25, 26, 27]),
        _c(1, [14], []),  # an empty response keeps a masked column
    ]


def test_collate_layout(comps):
    b = collate(comps, ["a", "a", "b", "b"], PAD)
    P, R = 3, 4
    assert b.input_ids_BT.shape == (4, P + R)
    assert b.response_length == R and b.size == 4
    assert b.input_ids_BT.tolist() == [
        [11, 12, 13, 21, 22, PAD, PAD],
        [11, 12, 13, 23, PAD, PAD, PAD],
        [PAD, PAD, 14, 24, 25, 26, 27],
        [PAD, PAD, 14, PAD, PAD, PAD, PAD],
    ]
    assert b.attention_mask_BT.tolist() == [
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 1],
        [0, 0, 1, 0, 0, 0, 0],
    ]
    assert b.response_mask_BR.tolist() == [
        [1, 1, 0, 0],
        [1, 0, 0, 0],
        [1, 1, 1, 1],
        [0, 0, 0, 0],
    ]
    assert b.response_mask_BR.dtype == torch.float32
    # response token j of every row sits at column P + j
    for i, c in enumerate(comps):
        for j, t in enumerate(c.token_ids):
            assert b.input_ids_BT[i, P + j] == t
            assert b.rollout_logprobs_BR[i, j] == pytest.approx(c.logprobs[j])
    assert b.rollout_logprobs_BR[0, 2:].tolist() == [0.0, 0.0]
    assert b.uids == ["a", "a", "b", "b"]
    assert b.scores_B is None and b.advantages_BR is None


def test_collate_all_empty_keeps_one_column():
    b = collate([_c(0, [5, 6], [])], ["u"], PAD)
    assert b.input_ids_BT.shape == (1, 3)
    assert b.response_mask_BR.tolist() == [[0.0]]


def test_collate_requires_one_uid_per_completion(comps):
    with pytest.raises(ValueError, match="uid"):
        collate(comps, ["a"], PAD)


def test_select_slices_tensors_and_lists(comps):
    b = collate(comps, ["a", "a", "b", "b"], PAD)
    b.scores_B = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b.task_types = ["x", "y", "z", "w"]
    s = b.select([2, 0])
    assert isinstance(s, Batch)
    assert s.uids == ["b", "a"] and s.task_types == ["z", "x"]
    assert s.scores_B.tolist() == [3.0, 1.0]
    assert torch.equal(s.input_ids_BT, b.input_ids_BT[[2, 0]])
    assert s.old_logprobs_BR is None
    assert b.size == 4  # the original is untouched


@pytest.mark.parametrize("per_mb", [1, 2, 3, 10])
def test_minibatches_never_split_a_group(per_mb):
    uids = ["g1", "g2", "g1", "g3", "g2", "g3", "g1", "g4"]
    mbs = minibatch_indices(uids, per_mb)
    flat = sorted(i for mb in mbs for i in mb)
    assert flat == list(range(len(uids)))  # every row exactly once
    owner = {}
    for k, mb in enumerate(mbs):
        for i in mb:
            owner.setdefault(uids[i], set()).add(k)
        assert len({uids[i] for i in mb}) <= per_mb
    assert all(len(v) == 1 for v in owner.values()), owner
    assert len(mbs) == -(-4 // per_mb)


def test_minibatch_group_order():
    assert minibatch_indices(["b", "a", "b", "a", "c"], 2) == [[0, 2, 1, 3], [4]]
    assert minibatch_indices(["b", "a", "b"], 0) == [[0, 2], [1]]  # 0 is treated as 1


def test_microbatch_indices():
    assert microbatch_indices([4, 5, 6, 7, 8], 2) == [[4, 5], [6, 7], [8]]
    assert microbatch_indices([1, 2], 8) == [[1, 2]]
    assert microbatch_indices([], 2) == []


def test_prompt_groups_by_prompt_tokens():
    comps = [
        _c(0, [11, 12], [1]),
        _c(1, [14], [2, 3]),
        _c(0, [11, 12], [4, 5, 6]),
        _c(2, [12], [7]),  # same last token as prompt 0 but a different prompt
        _c(1, [14], []),
    ]
    b = collate(comps, ["x", "y", "x", "z", "y"], PAD)
    assert prompt_groups(b) == [[0, 2], [1, 4], [3]]


def test_prompt_groups_ignore_left_padding_width():
    # Same real prompt tokens, but left padding puts a pad id that equals a real token id:
    # the attention mask, not the id, decides what is prompt.
    comps = [_c(0, [0, 7], [1]), _c(1, [7], [1]), _c(2, [3, 4, 5], [1])]
    b = collate(comps, ["p", "q", "r"], PAD)
    assert prompt_groups(b) == [[0], [1], [2]]
