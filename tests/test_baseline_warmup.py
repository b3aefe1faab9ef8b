"""FASER_WARM_SPEC_KERNELS (baseline_warmup.py): which servers the startup warm-up of
SGLang's speculative KV allocation kernel runs in, and with what. The A/B test
(test_ab_benchmark.py) sees it in a real STANDALONE server's log; its compiles on a GPU
are tested in tests/gpu/test_gpu_kernel_warmup.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from faser_sglang import baseline_warmup, plugin
from faser_sglang.spec_worker import kernel_warmup


@pytest.fixture
def launches(monkeypatch) -> list[tuple[torch.Tensor, int]]:
    calls: list[tuple[torch.Tensor, int]] = []

    def warm(rows: torch.Tensor, max_batch: int) -> int:
        calls.append((rows, max_batch))
        return 0  # as off CUDA

    monkeypatch.setattr(kernel_warmup, "warm_decode_allocation", warm)
    return calls


def scheduler(algorithm) -> SimpleNamespace:
    req_to_token = torch.zeros((4, 16), dtype=torch.int32)
    return SimpleNamespace(
        spec_algorithm=algorithm, req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), max_running_requests=48
    )


@pytest.mark.parametrize("name", ["STANDALONE", "EAGLE", "NGRAM"])
def test_sglang_speculative_servers_warm_up(name, launches, caplog):
    server = scheduler(SpeculativeAlgorithm[name])
    with caplog.at_level("INFO", logger=baseline_warmup.__name__):
        assert baseline_warmup.warm_after_init(None, server) is None  # __init__ returns None
    assert launches == [(server.req_to_token_pool.req_to_token, 48)]
    assert f"{name} server, 0 launches of SGLang's speculative KV allocation kernel" in caplog.text
    assert "for decode batches up to 48 (none off CUDA)" in caplog.text


def test_no_spec_and_faser_servers_do_not(launches):
    plugin.register()
    faser = SpeculativeAlgorithm.from_string(plugin.ALGORITHM_NAME)
    assert isinstance(faser, plugin.FaserSpecAlgo)  # its worker warms itself (worker.init_cuda_graphs)
    for algorithm in (SpeculativeAlgorithm.NONE, faser):
        baseline_warmup.warm_after_init(None, scheduler(algorithm))
    assert launches == []


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("1", True)])
def test_enabled_by_the_variable(value, on, monkeypatch):
    if value is None:
        monkeypatch.delenv(baseline_warmup.ENV, raising=False)
    else:
        monkeypatch.setenv(baseline_warmup.ENV, value)
    assert baseline_warmup.enabled() is on
