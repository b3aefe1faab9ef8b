"""The startup warm-up compiles every variant of SGLang's speculative KV allocation
kernel a decode step uses (kernel_warmup.py): afterwards a decode batch of any size up
to the warmed one, with its KV slots at an unaligned place in the free list, compiles
nothing and writes its rows as before; a larger one still compiles. A STANDALONE server
with FASER_WARM_SPEC_KERNELS set runs the same warm-up (baseline_warmup.py)."""

from __future__ import annotations

import re

import pytest
import requests
import torch

from conftest import build_tiny_models

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def compiled_variants() -> int:
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    return len(assign_req_to_token_pool.device_caches[torch.cuda.current_device()][0])


def assign(req_to_token: torch.Tensor, rows: list[int], starts: list[int], ends: list[int], offset: int) -> list[int]:
    """SGLang's write of a decode step's new slots, as alloc_for_spec_decode calls it,
    with ``out_cache_loc`` ``offset`` int64s into a free list; returns the slots."""
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool_func

    need = sum(e - s for s, e in zip(starts, ends))
    free_list = torch.arange(1000, 1000 + offset + need, dtype=torch.int64, device="cuda")
    out_cache_loc = free_list[offset:]
    assign_req_to_token_pool_func(
        torch.tensor(rows, dtype=torch.int64, device="cuda"),
        req_to_token,
        torch.tensor(starts, dtype=torch.int32, device="cuda"),
        torch.tensor(ends, dtype=torch.int32, device="cuda"),
        out_cache_loc,
        len(rows),
    )
    torch.cuda.synchronize()
    return out_cache_loc.tolist()


def test_warm_up_compiles_every_decode_variant():
    from faser_sglang.spec_worker.kernel_warmup import batch_buckets, warm_decode_allocation

    req_to_token = torch.full((48, 96), -1, dtype=torch.int32, device="cuda")  # [rows, width]
    assert warm_decode_allocation(req_to_token, 40) == 2 * len(batch_buckets(40))
    assert bool((req_to_token == -1).all()), "the warm-up wrote into a request row"
    warmed = compiled_variants()

    rows = list(range(21))
    starts = [3 * r % 50 for r in rows]
    ends = [s + 1 + r % 4 for s, r in zip(starts, rows)]
    for offset in (0, 1, 3):  # aligned and not
        slots = iter(assign(req_to_token, rows, starts, ends, offset))
        table = req_to_token.tolist()
        for r, s, e in zip(rows, starts, ends):
            assert table[r][s:e] == [next(slots) for _ in range(s, e)]
    assert compiled_variants() == warmed, "a decode batch of 21 compiled after the warm-up"

    # The count sees a compile: a batch past the warmed sizes (bucket 64 -> 128) makes one.
    assign(req_to_token, list(range(48)) + list(range(17)), [0] * 65, [0] * 65, 0)
    assert compiled_variants() == warmed + 1


def test_standalone_server_warms_up_with_the_variable(tmp_path):
    from faser_sglang import baseline_warmup
    from faser_sglang.bench import servers
    from faser_sglang.spec_worker.kernel_warmup import batch_buckets

    # FlashInfer kernels need head_dim >= 64: 256 hidden / 4 heads.
    models = build_tiny_models(tmp_path, hidden_size=256, intermediate_size=512)
    standalone = servers.contender("standalone-k3", str(models.draft), 3)
    flags = (
        "--attention-backend", "flashinfer", "--dtype", "bfloat16", "--cuda-graph-backend-prefill", "disabled",
        "--mem-fraction-static", "0.3", "--max-running-requests", "24", *standalone.args,
    )  # fmt: skip
    with servers.launch(models.target, flags, env={baseline_warmup.ENV: "1"}) as server:
        r = requests.post(
            server.base_url + "/generate",
            json={"text": ["def f(x):"] * 5, "sampling_params": {"max_new_tokens": 16, "temperature": 0}},
            timeout=300,
        )
        r.raise_for_status()
        log = server.log_tail(2_000_000)
    ((launches, max_batch),) = re.findall(r"STANDALONE server, (\d+) launches .* up to (\d+)", log)
    assert int(max_batch) > 1
    assert int(launches) == 2 * len(batch_buckets(int(max_batch)))  # aligned and not, per power of two
