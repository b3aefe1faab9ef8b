"""The bf16 near-tie rule the GPU greedy-equality tests use, on recorded divergences."""

import pytest

from gpu.test_gpu_faser import bf16_ulp, is_near_tie


def test_bf16_ulp():
    assert bf16_ulp(-10.0) == 0.0625 and bf16_ulp(-20.0) == 0.125 and bf16_ulp(1.0) == 2**-7


@pytest.mark.parametrize(
    "d, tie",
    [
        ({"margin": 0.0, "runner_up": False, "top_logprob": -3.0}, True),
        ({"margin": 0.0625, "runner_up": True, "top_logprob": -9.5}, True),
        ({"margin": 0.125, "runner_up": True, "top_logprob": -20.0}, True),
        ({"margin": 0.125, "runner_up": True, "top_logprob": -2.0}, False),  # 8 ULPs at 2
        ({"margin": 0.0625, "runner_up": False, "top_logprob": -9.5}, False),  # not the runner-up
    ],
)
def test_near_tie(d, tie):
    assert is_near_tie(d) == tie
