"""RaggedLayout: the worked example of its docstring, and round trips."""

import pytest
import torch

from faser_sglang.layout import RaggedLayout
from host_reads import host_reads

def test_worked_example():
    layout = RaggedLayout.build([2, 0, 1], max_draft_len=2, device="cpu")
    assert layout.verify_lens_cpu == (3, 1, 2)
    assert layout.draft_lens.tolist() == [2, 0, 1]
    assert layout.pad_index.tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 5]]
    assert layout.flat_index.tolist() == [0, 1, 2, 3, 6, 7]
    assert layout.num_verify_tokens == 6


def test_positions_example():
    layout = RaggedLayout.build([2, 0, 1], max_draft_len=2, device="cpu")
    assert layout.verify_positions(torch.tensor([10, 4, 7])).tolist() == [10, 11, 12, 4, 7, 8]


@pytest.mark.parametrize("lens", [[0, 0, 0], [4, 4], [1, 3, 0, 2, 4], [0]])
def test_flat_padded_round_trip(lens):
    layout = RaggedLayout.build(lens, max_draft_len=4, device="cpu")
    flat = torch.arange(layout.num_verify_tokens * 3).view(-1, 3)
    assert torch.equal(layout.to_flat(layout.to_padded(flat)), flat)


def test_moving_between_layouts_never_waits_for_the_device():
    """No op whose output size or value the host must read back (on a GPU, a sync)."""
    layout = RaggedLayout.build([1, 3, 0, 2], max_draft_len=4, device="cpu")
    padded = torch.arange(4 * 5 * 2).view(4, 5, 2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        layout.to_padded(layout.to_flat(padded))
        layout.verify_positions(torch.tensor([10, 4, 7, 3]))
    assert not host_reads(prof.events())


def test_rejects_out_of_range_lengths():
    with pytest.raises(ValueError, match="outside"):
        RaggedLayout.build([5], max_draft_len=4, device="cpu")
    with pytest.raises(ValueError, match="outside"):
        RaggedLayout.build([-1], max_draft_len=4, device="cpu")
