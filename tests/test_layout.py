"""RaggedLayout: the worked example of its docstring, and round trips."""

import pytest
import torch

from faser_sglang.layout import RaggedLayout


def test_worked_example():
    layout = RaggedLayout.build([2, 0, 1], max_draft_len=2, device="cpu")
    assert layout.verify_lens_cpu == (3, 1, 2)
    assert layout.qo_indptr.tolist() == [0, 3, 4, 6]
    assert layout.pad_index.tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 5]]
    assert layout.pad_mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert layout.num_verify_tokens == 6


def test_positions_example():
    layout = RaggedLayout.build([2, 0, 1], max_draft_len=2, device="cpu")
    assert layout.verify_positions(torch.tensor([10, 4, 7])).tolist() == [10, 11, 12, 4, 7, 8]


@pytest.mark.parametrize("lens", [[0, 0, 0], [4, 4], [1, 3, 0, 2, 4], [0]])
def test_flat_padded_round_trip(lens):
    layout = RaggedLayout.build(lens, max_draft_len=4, device="cpu")
    flat = torch.arange(layout.num_verify_tokens * 3).view(-1, 3)
    assert torch.equal(layout.to_flat(layout.to_padded(flat)), flat)


def test_rejects_out_of_range_lengths():
    with pytest.raises(ValueError, match="outside"):
        RaggedLayout.build([5], max_draft_len=4, device="cpu")
    with pytest.raises(ValueError, match="outside"):
        RaggedLayout.build([-1], max_draft_len=4, device="cpu")
