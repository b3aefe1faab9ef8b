"""The plugin's hook on SGLang's KV allocation before a speculative decode step
(spec_alloc.py): the same slots and recorded lengths as SGLang's own, from a host list."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from faser_sglang import spec_alloc


class Allocator:
    """Hands out slots 100, 101, ... in order, as a fresh page-size-1 allocator."""

    def __init__(self, page_size: int = 1):
        self.page_size = page_size
        self.next = 100

    def alloc(self, n: int) -> torch.Tensor:
        out = torch.arange(self.next, self.next + n, dtype=torch.int64)
        self.next += n
        return out


def _step(cur: list[int], nxt: list[int], page_size: int = 1):
    """The arguments SGLang's eagle_prepare_for_decode passes, over fresh state."""
    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=c)) for c in cur]
    # A chunk cache: SGLang evicts nothing from it before allocating.
    tree_cache = SimpleNamespace(token_to_kv_pool_allocator=Allocator(page_size), is_chunk_cache=lambda: True)
    pool = SimpleNamespace(req_to_token=torch.full((len(cur) + 1, 32), -1, dtype=torch.int32))
    kwargs = dict(
        reqs=reqs,
        req_pool_indices=torch.arange(1, len(cur) + 1, dtype=torch.int64),
        cur_kv_lens=torch.tensor(cur, dtype=torch.int32),
        cur_kv_lens_cpu=torch.tensor(cur, dtype=torch.int32),
        nxt_kv_lens=torch.tensor(nxt, dtype=torch.int32),
        nxt_kv_lens_cpu=torch.tensor(nxt, dtype=torch.int32),
        num_needed_tokens=sum(n - c for c, n in zip(cur, nxt)),
    )
    return tree_cache, pool, kwargs


def sglangs_own():
    """SGLang's ``alloc_for_spec_decode`` without the plugin's hook (set when a test or the
    benchmark loaded the plugin)."""
    from sglang.srt.mem_cache import allocation

    original = allocation.alloc_for_spec_decode
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    return original


def test_same_slots_and_lengths_as_sglangs_own(monkeypatch):
    from sglang.srt.mem_cache import allocation

    def assign_on_host(rows, req_to_token, starts, ends, out_cache_loc, batch_size):
        # What SGLang's Triton kernel writes: each row's new slots, in row order.
        offset = 0
        for row, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist()):
            req_to_token[row, start:end] = out_cache_loc[offset : offset + end - start]
            offset += end - start

    monkeypatch.setattr(allocation, "assign_req_to_token_pool_func", assign_on_host)

    original = sglangs_own()
    cur, nxt = [4, 0, 9, 7], [8, 3, 9, 12]  # the third request needs nothing more
    tree_cache, pool, kwargs = _step(cur, nxt)
    expected = copy.deepcopy((tree_cache, pool, kwargs))
    original(expected[0], expected[1], **expected[2])

    seen = []

    def spy(*args, **kw):
        seen.append(kw["nxt_kv_lens_cpu"])
        return original(*args, **kw)

    spec_alloc.lengths_as_list(spy, tree_cache, pool, **kwargs)
    assert seen == [nxt]  # a list reached SGLang's loop
    assert torch.equal(pool.req_to_token, expected[1].req_to_token)
    assert [r.kv.kv_allocated_len for r in kwargs["reqs"]] == nxt
    assert [r.kv.kv_allocated_len for r in expected[2]["reqs"]] == nxt


def test_paged_allocation_keeps_the_tensor():
    tree_cache, pool, kwargs = _step([4], [8], page_size=16)
    seen = []
    spec_alloc.lengths_as_list(lambda *a, **kw: seen.append(kw["nxt_kv_lens_cpu"]), tree_cache, pool, **kwargs)
    (lengths,) = seen
    assert isinstance(lengths, torch.Tensor)


def test_the_plugin_hooks_sglangs_allocation_and_its_callers_import():
    script = (
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "from faser_sglang import plugin, spec_alloc\n"
        "plugin.register()\n"
        "HookRegistry.apply_hooks()\n"
        "from sglang.srt.mem_cache import allocation\n"
        "from sglang.srt.speculative import eagle_utils\n"
        "print([hasattr(m.alloc_for_spec_decode, '__wrapped__') for m in (allocation, eagle_utils)])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1:] == ["[True, True]"], out.stderr[-2000:]


@pytest.mark.parametrize("bs", [1, 128])
def test_list_lengths_are_read_as_ints(bs):
    lengths = spec_alloc.lengths_as_list(
        lambda tree_cache, *a, **kw: kw["nxt_kv_lens_cpu"],
        SimpleNamespace(token_to_kv_pool_allocator=Allocator()),
        None,
        nxt_kv_lens_cpu=torch.arange(bs, dtype=torch.int32),
    )
    assert lengths == list(range(bs)) and all(type(n) is int for n in lengths)


def test_benchmark_script_prints_both_sides():
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_spec_alloc.py"
    command = [sys.executable, str(script), "--batch-sizes", "4", "--rounds", "3"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    header, rule, row = out.stdout.strip().splitlines()[-3:]
    assert header == "| requests | SGLang ms | host list ms | ratio |"
    assert row.startswith("| 4 | ") and row.endswith("x |")
