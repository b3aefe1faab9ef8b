"""The target's KV memory plan counts the draft's KV pool (faser_sglang.memory_plan).

The arithmetic runs through SGLang's own ``DefaultPoolConfigurator.calculate_pool_sizes``;
the end-to-end tests (here and in test_e2e_faser.py) read the plan a real server logged.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator, MemoryPoolConfigurator
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from faser_sglang import memory_plan
from faser_sglang.kit.drafts import truncate_layers
from faser_sglang.plugin import FaserSpecAlgo
from fuzz_utils import faser_flags
from server_utils import generate, launch_server


def default_configurator(cell_size: int) -> DefaultPoolConfigurator:
    """SGLang's configurator for a plain model, with ``cell_size`` KV bytes per token
    (its __init__ reads a whole model runner; only these fields matter to the plan)."""
    configurator = object.__new__(DefaultPoolConfigurator)
    configurator._cell_size = cell_size
    configurator._zero_kv_max_tokens = 0
    return configurator


def kvc(*, faser: bool = True, draft_worker: bool = False) -> SimpleNamespace:
    algorithm = FaserSpecAlgo("FASER", lambda args: None) if faser else SpeculativeAlgorithm.STANDALONE
    return SimpleNamespace(spec_algorithm=algorithm, is_draft_worker=draft_worker)


@pytest.fixture
def draft_bytes(monkeypatch):
    """The draft's KV bytes per token, as note_draft records them."""
    monkeypatch.setattr(memory_plan, "_draft_bytes", 300)
    monkeypatch.setattr(memory_plan, "_counted", None)
    return 300


def test_the_target_plan_divides_the_budget_by_target_and_draft_bytes(draft_bytes, caplog):
    with caplog.at_level(logging.INFO, logger="faser_sglang.memory_plan"):
        configurator = memory_plan.count_draft_kv(lambda k: default_configurator(1000), kvc())
    config = configurator.calculate_pool_sizes(available_bytes=13_000_000, page_size=16)
    assert config.max_total_num_tokens == 13_000_000 // 1300 // 16 * 16  # 10000 tokens, page-aligned
    assert "1300 KV bytes per token (target 1000 + draft 300)" in caplog.text
    # SGLang builds the target's configurator more than once; each counts the draft once.
    again = memory_plan.count_draft_kv(lambda k: default_configurator(1000), kvc())
    assert again._cell_size == 1300
    assert caplog.text.count("KV bytes per token") == 1


@pytest.mark.parametrize("case", [{"faser": False}, {"draft_worker": True}])
def test_other_plans_are_left_alone(draft_bytes, case):
    configurator = memory_plan.count_draft_kv(lambda k: default_configurator(1000), kvc(**case))
    assert configurator._cell_size == 1000


def test_a_plan_of_another_kind_is_left_alone_and_the_pool_check_warns(draft_bytes, caplog):
    other = object.__new__(MemoryPoolConfigurator)
    assert memory_plan.count_draft_kv(lambda k: other, kvc()) is other
    with caplog.at_level(logging.WARNING, logger="faser_sglang.memory_plan"):
        memory_plan.check_draft_pool(SimpleNamespace(get_kv_size_bytes=lambda: (0, 0)), tokens=10)
    assert "does not count the draft's KV pool; pass --max-total-tokens" in caplog.text


def pool(bytes_per_token: int, tokens: int, page_size: int = 64) -> SimpleNamespace:
    """A KV pool as SGLang reports its size: (K bytes, V bytes) of its buffers, which
    hold one page past its size."""
    rows = tokens + page_size
    half = rows * bytes_per_token // 2
    return SimpleNamespace(page_size=page_size, get_kv_size_bytes=lambda: (half, half))


def test_the_pool_check_accepts_what_was_counted_and_flags_a_bigger_pool(draft_bytes, caplog):
    memory_plan.count_draft_kv(lambda k: default_configurator(1000), kvc())
    with caplog.at_level(logging.WARNING, logger="faser_sglang.memory_plan"):
        memory_plan.check_draft_pool(pool(300, tokens=1000), tokens=1000)
        assert caplog.text == ""
        memory_plan.check_draft_pool(pool(302, tokens=1000), tokens=1000)
    assert "takes 302 bytes per token, the plan counted 300" in caplog.text


def test_no_draft_recorded_leaves_the_plan_alone(monkeypatch):
    monkeypatch.setattr(memory_plan, "_draft_bytes", None)
    configurator = memory_plan.count_draft_kv(lambda k: default_configurator(1000), kvc())
    assert configurator._cell_size == 1000


def test_kv_bytes_per_token_reads_only_a_plain_plan():
    assert memory_plan.kv_bytes_per_token(default_configurator(4096)) == 4096
    assert memory_plan.kv_bytes_per_token(object.__new__(MemoryPoolConfigurator)) is None



def test_a_server_counts_a_draft_of_another_depth(tiny_models, tmp_path):
    """A one-layer draft of the tiny target (float32, 2 KV heads x head dim 16, K and V):
    256 KV bytes per token beside the target's 512, and the server serves."""
    draft = truncate_layers(tiny_models.draft, tmp_path / "draft-1-layer", 1)
    with launch_server(tiny_models.target, *faser_flags(draft, 3), "--skip-server-warmup") as server:
        (out,) = generate(server.base_url, ["def main():"], {"max_new_tokens": 8, "temperature": 0})
        log = server.log_tail(2_000_000)
    assert len(out["output_ids"]) == 8
    assert "FASER memory plan: 768 KV bytes per token (target 512 + draft 256)" in log
    assert "FASER memory plan: the" not in log  # no warning about either pool
