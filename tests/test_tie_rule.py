"""The bf16 near-tie rule the GPU greedy-equality tests use, on recorded divergences."""

import pytest

from gpu.test_gpu_faser import bf16_ulp, is_near_tie


def test_bf16_ulp():
    assert bf16_ulp(-10.0) == 0.0625 and bf16_ulp(14.3) == 0.0625 and bf16_ulp(-20.0) == 0.125
    assert bf16_ulp(1.0) == 2**-7


# Divergences recorded on the H200 (FlashInfer bf16, single GPU and TP=2); the tiny
# GPU target's largest |logit| is 14.3, so one logit ULP is 0.0625.
ULP = 0.0625


@pytest.mark.parametrize(
    "d, tie",
    [
        ({"margin": 0.0, "runner_up": False}, True),  # exact tie
        ({"margin": 0.0625, "runner_up": True}, True),  # 1 ULP
        ({"margin": 0.0937, "runner_up": True}, True),  # 1.5 ULPs
        ({"margin": 0.125, "runner_up": True}, True),  # 2 ULPs
        ({"margin": 0.1875, "runner_up": True}, False),  # 3 ULPs
        ({"margin": 0.0625, "runner_up": False}, False),  # not the runner-up
    ],
)
def test_near_tie(d, tie):
    assert is_near_tie(d, ULP) == tie
