"""Tests of the CPU harness: the sgl_kernel stand-in, the SGLang plugin, the
tiny-model kit, and (marked ``server``) real SGLang servers on tiny models.

Kernel tests compare against naive per-token references written straight
from the C++ CPU kernels' documented semantics.
"""

from __future__ import annotations

import math
from pathlib import Path

import faser_cpu_harness
import pytest
import server_utils
import sgl_kernel
import torch
from faser_sglang.kit.tiny import (
    build_identity_transition_model,
    build_tiny_llama,
    build_tokenizer,
)
from sgl_kernel import speculative as spec_kernels

# ---------------------------------------------------------------------------
# Attention ops
# ---------------------------------------------------------------------------


def _naive_attention(
    q: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    scale: float,
    logit_cap: float,
    sink: float | None,
) -> torch.Tensor:
    """One query head over explicit key/value lists, in float64."""
    scores = []
    for key in keys:
        s = scale * float(q.double() @ key.double())
        if logit_cap > 0:
            s = logit_cap * math.tanh(s / logit_cap)
        scores.append(s)
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    denom = sum(weights) + (math.exp(sink - top) if sink is not None else 0.0)
    out = torch.zeros_like(values[0], dtype=torch.float64)
    for w, value in zip(weights, values):
        out += w / denom * value.double()
    return out


def _paged_setup(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, pool_len: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """KV buffers with scattered slots and a req_to_token map for the requests."""
    num_slots = 256
    k_buffer = torch.randn(num_slots, num_kv_heads, head_dim)
    v_buffer = torch.randn(num_slots, num_kv_heads, head_dim)
    req_to_token = torch.zeros(8, pool_len, dtype=torch.int32)
    slots = torch.randperm(num_slots - 1)[: sum(seq_lens)] + 1  # slot 0 unused
    req_pool_indices = torch.tensor([5, 1, 3, 6][: len(seq_lens)], dtype=torch.int64)
    used = 0
    for row, length in zip(req_pool_indices.tolist(), seq_lens):
        req_to_token[row, :length] = slots[used : used + length].to(torch.int32)
        used += length
    return k_buffer, v_buffer, req_to_token, req_pool_indices


@pytest.mark.parametrize("logit_cap", [0.0, 2.0])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_decode_attention_matches_reference(logit_cap: float, with_sinks: bool) -> None:
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim = 4, 2, 16
    seq_lens = [5, 1, 17]
    k_buffer, v_buffer, req_to_token, rpi = _paged_setup(seq_lens, num_kv_heads, head_dim)
    bs = len(seq_lens)
    query = torch.randn(bs, num_heads, head_dim)
    key = torch.randn(bs, num_kv_heads, head_dim)
    value = torch.randn(bs, num_kv_heads, head_dim)
    # The new token is the last of each sequence; its slot is `loc`.
    loc = torch.stack([req_to_token[r, n - 1].long() for r, n in zip(rpi, seq_lens)])
    sinks = torch.randn(num_heads) if with_sinks else None
    output = torch.empty(bs, num_heads, head_dim)
    attn_logits = torch.zeros(bs, num_heads, 8, head_dim + 1)
    scale = head_dim**-0.5

    torch.ops.sgl_kernel.decode_attention_cpu(
        query, k_buffer, v_buffer, output, key, value, loc, attn_logits,
        req_to_token, rpi, torch.tensor(seq_lens), scale, logit_cap, False, 0,
        None, sinks,
    )  # fmt: skip

    assert torch.equal(k_buffer[loc], key) and torch.equal(v_buffer[loc], value)
    group = num_heads // num_kv_heads
    for b, (row, length) in enumerate(zip(rpi.tolist(), seq_lens)):
        slots = req_to_token[row, :length].long()
        for h in range(num_heads):
            expected = _naive_attention(
                query[b, h],
                list(k_buffer[slots, h // group]),
                list(v_buffer[slots, h // group]),
                scale,
                logit_cap,
                float(sinks[h]) if sinks is not None else None,
            )
            torch.testing.assert_close(output[b, h].double(), expected, atol=1e-5, rtol=1e-5)


def test_decode_attention_sliding_window() -> None:
    torch.manual_seed(1)
    seq_len, window, head_dim = 12, 4, 16
    k_buffer, v_buffer, req_to_token, rpi = _paged_setup([seq_len], 1, head_dim)
    query = torch.randn(1, 2, head_dim)
    output = torch.empty(1, 2, head_dim)

    torch.ops.sgl_kernel.decode_attention_cpu(
        query, k_buffer, v_buffer, output, None, None, None,
        torch.zeros(1, 2, 8, head_dim + 1), req_to_token, rpi,
        torch.tensor([seq_len]), 0.25, 0.0, False, window, None, None,
    )  # fmt: skip

    slots = req_to_token[rpi[0], seq_len - window : seq_len].long()
    for h in range(2):
        expected = _naive_attention(
            query[0, h], list(k_buffer[slots, 0]), list(v_buffer[slots, 0]), 0.25, 0.0, None
        )
        torch.testing.assert_close(output[0, h].double(), expected, atol=1e-5, rtol=1e-5)


def _run_extend(
    prefix_lens: list[int],
    extend_lens: list[int],
    tree_mask: torch.Tensor | None = None,
    logit_cap: float = 0.0,
) -> None:
    """Run extend_attention_cpu on random data and check it against the reference."""
    num_heads, num_kv_heads, head_dim = 4, 2, 16
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    k_buffer, v_buffer, req_to_token, rpi = _paged_setup(seq_lens, num_kv_heads, head_dim)
    cache_before = (k_buffer.clone(), v_buffer.clone())
    total = sum(extend_lens)
    q = torch.randn(total, num_heads, head_dim)
    k = torch.randn(total, num_kv_heads, head_dim)
    v = torch.randn(total, num_kv_heads, head_dim)
    o = torch.zeros(total, num_heads, head_dim)
    starts = [sum(extend_lens[:i]) for i in range(len(extend_lens))]
    scale = head_dim**-0.5

    torch.ops.sgl_kernel.extend_attention_cpu(
        q, k, v, o, k_buffer, v_buffer, req_to_token, rpi,
        torch.tensor(seq_lens), torch.tensor(extend_lens, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32), max(extend_lens), scale,
        logit_cap, False, 0, None, None, tree_mask,
    )  # fmt: skip

    assert torch.equal(k_buffer, cache_before[0]) and torch.equal(v_buffer, cache_before[1])
    group = num_heads // num_kv_heads
    mask = None if tree_mask is None else tree_mask.view(len(prefix_lens), max(extend_lens), -1)
    for b, (row, prefix, ext, start) in enumerate(
        zip(rpi.tolist(), prefix_lens, extend_lens, starts)
    ):
        slots = req_to_token[row, :prefix].long()
        for i in range(ext):
            visible = [
                j for j in range(ext) if (mask[b, i, j] if mask is not None else j <= i)
            ]
            for h in range(num_heads):
                kv = h // group
                keys = list(k_buffer[slots, kv]) + [k[start + j, kv] for j in visible]
                values = list(v_buffer[slots, kv]) + [v[start + j, kv] for j in visible]
                expected = _naive_attention(q[start + i, h], keys, values, scale, logit_cap, None)
                torch.testing.assert_close(
                    o[start + i, h].double(), expected, atol=1e-5, rtol=1e-5
                )


def test_extend_attention_prefix_and_causal_gqa() -> None:
    torch.manual_seed(2)
    _run_extend(prefix_lens=[0, 7, 3], extend_lens=[5, 3, 1])


def test_extend_attention_logit_cap() -> None:
    torch.manual_seed(3)
    _run_extend(prefix_lens=[4, 2], extend_lens=[3, 6], logit_cap=1.5)


def test_extend_attention_tree_mask() -> None:
    torch.manual_seed(4)
    # Tree root 0 with children 1 and 2; node 3 is a child of 1.
    one = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool
    )
    tree_mask = torch.stack([one, one]).flatten()
    _run_extend(prefix_lens=[6, 2], extend_lens=[4, 4], tree_mask=tree_mask)


# ---------------------------------------------------------------------------
# Cache-location and speculative helpers
# ---------------------------------------------------------------------------


def test_assign_req_to_token_pool_and_extend_cache_locs_roundtrip() -> None:
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    rpi = torch.tensor([2, 0, 3])
    start = torch.tensor([1, 0, 5], dtype=torch.int32)
    end = torch.tensor([4, 0, 7], dtype=torch.int32)
    locs = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)

    sgl_kernel.assign_req_to_token_pool_cpu(rpi, req_to_token, start, end, locs, 16)

    expected = torch.zeros(4, 16, dtype=torch.int32)
    expected[2, 1:4] = torch.tensor([11, 12, 13])
    expected[3, 5:7] = torch.tensor([21, 22])
    assert torch.equal(req_to_token, expected)

    out = torch.full((7,), -5, dtype=torch.int64)  # longer than needed: tail untouched
    sgl_kernel.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, out, 16)
    assert out.tolist() == [11, 12, 13, 21, 22, -5, -5]


def test_assign_draft_cache_locs_contiguous() -> None:
    req_to_token = torch.arange(3 * 20, dtype=torch.int32).view(3, 20)
    out = torch.empty(2 * 2 * 3, dtype=torch.int64)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(
        torch.tensor([2, 0]), req_to_token, torch.tensor([4, 10]), out, 20, 2, 3
    )
    assert out.tolist() == list(range(44, 50)) + list(range(10, 16))


def test_build_draft_decode_metadata_expands_candidates() -> None:
    req_to_token = torch.arange(2 * 20, dtype=torch.int32).view(2, 20) + 100
    seq_lens = torch.tensor([3, 5])
    draft = sgl_kernel.build_draft_decode_metadata_cpu(
        req_to_token, torch.tensor([1, 0]), seq_lens, 2, 2, 20
    )
    assert draft.shape == (4, 20) and draft.dtype == torch.int32
    row1, row0 = req_to_token[1].tolist(), req_to_token[0].tolist()
    # Candidate k's draft slots sit at seq_len + k * num_steps in the source row.
    assert draft[0, :5].tolist() == row1[:3] + row1[3:5]
    assert draft[1, :5].tolist() == row1[:3] + row1[5:7]
    assert draft[2, :7].tolist() == row0[:5] + row0[5:7]
    assert draft[3, :7].tolist() == row0[:5] + row0[7:9]


def test_fill_bonus_tokens_and_accept_out_cache_loc() -> None:
    accept_tokens = torch.tensor([[5, 6, 7], [8, 9, 10]], dtype=torch.int32)
    bonus = torch.zeros(2, dtype=torch.int32)
    accept_lens = torch.tensor([2, 3], dtype=torch.int32)
    sgl_kernel.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, 3)
    assert bonus.tolist() == [6, 10]

    accept_index = torch.tensor([[0, 2, -1], [4, -1, -1]], dtype=torch.int32)
    out_cache_loc = torch.tensor([100, 101, 102, 103, 104, 105])
    compact = torch.zeros(6, dtype=torch.int64)
    sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, compact)
    assert compact.tolist() == [100, 102, 104, 0, 0, 0]


@pytest.mark.parametrize("use_select_index", [False, True])
def test_rotate_input_ids(use_select_index: bool) -> None:
    input_ids = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int64)
    select = torch.tensor([1, 5]) if use_select_index else None
    sgl_kernel.rotate_input_ids_cpu(
        input_ids,
        torch.tensor([0, 3], dtype=torch.int32),
        torch.tensor([3, 3]),
        torch.tensor([50, 60]),
        select,
    )
    expected = [2, 50, 3, 5, 6, 60] if use_select_index else [2, 3, 50, 5, 6, 60]
    assert input_ids.tolist() == expected


def test_verify_tree_greedy_accepts_matching_chain_prefix() -> None:
    # Two requests, chain trees of 4 nodes: root -> 1 -> 2 -> 3.
    candidates = torch.tensor([[9, 10, 11, 12], [9, 20, 21, 22]])
    retrive_index = torch.arange(8).view(2, 4)
    next_token = torch.tensor([[1, 2, 3, -1], [1, 2, 3, -1]])
    next_sibling = torch.full((2, 4), -1)
    # Request 0 agrees on the first two drafts, request 1 on none.
    target = torch.tensor([[10, 11, 99, 98], [77, 21, 22, 23]])
    predicts = torch.zeros(8, dtype=torch.int32)
    accept_index = torch.full((2, 4), -1, dtype=torch.int32)
    accept_num = torch.zeros(2, dtype=torch.int32)

    sgl_kernel.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=candidates, retrive_index=retrive_index,
        retrive_next_token=next_token, retrive_next_sibling=next_sibling,
        target_predict=target,
    )  # fmt: skip

    assert accept_num.tolist() == [2, 0]
    assert accept_index.tolist() == [[0, 1, 2, -1], [4, -1, -1, -1]]
    assert predicts.tolist() == [10, 11, 99, 0, 77, 0, 0, 0]


@pytest.mark.parametrize("tree_mask_mode", [0, 1])
def test_build_tree_kernel_efficient_topk1_chain(tree_mask_mode: int) -> None:
    bs, depth, n = 2, 3, 4
    parent_list = torch.tensor([[-1, 0, 1], [-1, 0, 1]])
    selected_index = torch.tensor([[0, 1, 2], [0, 1, 2]])
    seq_lens = torch.tensor([5, 2])
    if tree_mask_mode == 1:
        tree_mask = torch.empty(bs * n * n, dtype=torch.bool)
    else:  # FULL_MASK: caller pre-fills the prefix columns with True
        tree_mask = torch.ones(int(seq_lens.sum()) * n + bs * n * n, dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.int64)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.int64)

    sgl_kernel.build_tree_kernel_efficient_cpu(
        parent_list, selected_index, seq_lens, tree_mask, positions,
        retrieve[0], retrieve[1], retrieve[2], 1, depth, n, tree_mask_mode,
    )  # fmt: skip

    assert positions.tolist() == [5, 6, 7, 8, 2, 3, 4, 5]
    assert retrieve[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert retrieve[1].tolist() == [[1, 2, 3, -1]] * 2
    assert retrieve[2].tolist() == [[-1] * 4] * 2
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if tree_mask_mode == 1:
        assert torch.equal(tree_mask.view(bs, n, n), torch.stack([causal, causal]))
    else:
        offset = 0
        for seq_len in seq_lens.tolist():
            rows = tree_mask[offset : offset + n * (seq_len + n)].view(n, seq_len + n)
            assert rows[:, :seq_len].all() and torch.equal(rows[:, seq_len:], causal)
            offset += n * (seq_len + n)


def test_build_tree_kernel_efficient_topk2_branching() -> None:
    # Step-0 draft tokens 0, 1 hang off the root; step-1 tokens 2, 3 off token 0
    # and 4, 5 off token 1 (parent_list[g] = parent token of group g). Selecting
    # tokens [0, 1, 2] gives: root -> {node 1, node 2}, node 1 -> node 3.
    parent_list = torch.tensor([[-1, 0, 1]])
    selected_index = torch.tensor([[0, 1, 2]])
    tree_mask = torch.empty(16, dtype=torch.bool)
    positions = torch.empty(4, dtype=torch.int64)
    retrieve = torch.full((3, 1, 4), -1, dtype=torch.int64)

    sgl_kernel.build_tree_kernel_efficient_cpu(
        parent_list, selected_index, torch.tensor([9]), tree_mask, positions,
        retrieve[0], retrieve[1], retrieve[2], 2, 2, 4, 1,
    )  # fmt: skip

    assert positions.tolist() == [9, 10, 10, 11]
    assert retrieve[1].tolist() == [[1, 3, -1, -1]]  # first child
    assert retrieve[2].tolist() == [[-1, 2, -1, -1]]  # next sibling
    assert tree_mask.view(4, 4).int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]


def test_reconstruct_indices_from_tree_mask() -> None:
    # Root 0; children 1 and 3 of the root; node 2 is a child of 1.
    mask = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool
    ).flatten()
    positions = torch.empty(4, dtype=torch.int64)
    index, next_token, next_sibling = (torch.empty(1, 4, dtype=torch.int64) for _ in range(3))
    spec_kernels.reconstruct_indices_from_tree_mask(
        mask, torch.tensor([10]), positions, index, next_token, next_sibling, 1, 4
    )
    assert positions.tolist() == [10, 11, 12, 11]
    assert index.tolist() == [[0, 1, 2, 3]]
    assert next_token.tolist() == [[1, 2, -1, -1]]
    assert next_sibling.tolist() == [[-1, 3, -1, -1]]


def test_copy_all_layer_kv_cache_copies_every_buffer() -> None:
    buffers = [torch.arange(40, dtype=torch.float32).view(10, 4) + 100 * i for i in range(3)]
    expected = [b.clone() for b in buffers]
    tgt, src = torch.tensor([1, 7, 2]), torch.tensor([2, 3, 1])  # overlapping swap of 1, 2
    for e in expected:
        e[tgt] = e[src].clone()
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])

    sgl_kernel.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)

    for b, e in zip(buffers, expected):
        assert torch.equal(b, e)


def test_unimplemented_kernels_import_but_raise_when_called() -> None:
    from sgl_kernel.flash_attn import flash_attn_varlen_func
    from sgl_kernel.scalar_type import scalar_types

    with pytest.raises(NotImplementedError, match="flash_attn_varlen_func"):
        flash_attn_varlen_func()
    with pytest.raises(NotImplementedError, match="uint4b8"):
        scalar_types.uint4b8()
    # SGLang probes this op to decide on AMX-only code paths; it must stay absent.
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")


# ---------------------------------------------------------------------------
# Plugin
# ---------------------------------------------------------------------------


def test_register_is_a_noop_without_cpu_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    before = {target: list(hooks) for target, hooks in HookRegistry._hooks.items()}
    faser_cpu_harness.register()
    after = {target: list(hooks) for target, hooks in HookRegistry._hooks.items() if hooks}
    assert after == {t: h for t, h in before.items() if h}


def test_seq_lens_bug_is_detected_in_installed_sglang() -> None:
    assert faser_cpu_harness._methods_overwriting_seq_lens() == {
        "forward_extend",
        "forward_decode",
    }


def test_keep_intel_amx_only_affects_cpu_intel_amx() -> None:
    class View:
        def __init__(self, device: str, backend: str) -> None:
            self.device, self.attention_backend = device, backend

    def fallback(view: View) -> dict:
        return {"attention_backend": "torch_native"}

    assert faser_cpu_harness._keep_intel_amx(fallback, View("cpu", "intel_amx")) == {}
    assert faser_cpu_harness._keep_intel_amx(fallback, View("xpu", "intel_xpu")) == {
        "attention_backend": "torch_native"
    }


# ---------------------------------------------------------------------------
# Tiny model kit
# ---------------------------------------------------------------------------


def test_tiny_llama_build_is_deterministic(tmp_path: Path) -> None:
    first = build_tiny_llama(tmp_path / "a", seed=3)
    second = build_tiny_llama(tmp_path / "b", seed=3)
    names = sorted(p.name for p in first.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_tokenizer_has_chat_template_and_eos() -> None:
    tokenizer = build_tokenizer()
    assert 400 <= len(tokenizer) <= 512
    assert tokenizer.eos_token == "</s>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|assistant|>\n")
    assert tokenizer.decode(tokenizer("print('ok')").input_ids) == "print('ok')"


def test_identity_model_next_token_depends_only_on_current_token(tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(
        str(build_identity_transition_model(tmp_path / "id", seed=1)), dtype=torch.float32
    )
    with torch.no_grad():
        a = model(torch.tensor([[7, 300, 42]])).logits[0, -1]
        b = model(torch.tensor([[42]])).logits[0, -1]
    assert torch.equal(a.argmax(), b.argmax())
    torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------
# Real servers
# ---------------------------------------------------------------------------

SPECULATIVE_ARGS = (
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip
GREEDY = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}


def _mixed_prompts(model_dir: Path) -> list[list[int]]:
    """Greedy test prompts of very different lengths (1 to ~250 tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = [
        "a",
        "hello world",
        "def foo(x):\n    return",
        "import os\nimport sys\n\nclass Config:",
        "The quick brown fox jumps over the lazy dog. " * 3,
        "for i in range(10):\n    print(i)\n" * 6,
        "x = [1, 2, 3]\n" * 20,
        "json.dumps({'key': [1, 2, {'nested': True}]})\n" * 12,
        "?",
    ]
    return [tokenizer(text).input_ids for text in texts]


def _serve(model_dir: Path, prompts: list[list[int]], *args: str) -> list[dict]:
    with server_utils.launch_server(model_dir, *args) as server:
        return server_utils.generate(server.base_url, prompts, GREEDY)


@pytest.mark.server
def test_standalone_speculative_output_matches_plain_decoding(
    tmp_path: Path,
) -> None:
    model_dir = build_tiny_llama(tmp_path / "tiny", seed=0)
    prompts = _mixed_prompts(model_dir)

    plain = _serve(model_dir, prompts)
    speculative = _serve(
        model_dir, prompts,
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(model_dir),
        *SPECULATIVE_ARGS,
    )  # fmt: skip

    assert all(len(out["output_ids"]) == GREEDY["max_new_tokens"] for out in plain)
    assert [o["output_ids"] for o in speculative] == [o["output_ids"] for o in plain]
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in speculative)


@pytest.mark.server
def test_identity_model_self_draft_accepts_every_token(tmp_path: Path) -> None:
    model_dir = build_identity_transition_model(tmp_path / "identity", seed=0)
    prompts = _mixed_prompts(model_dir)[:4]

    outputs = _serve(
        model_dir, prompts,
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(model_dir),
        *SPECULATIVE_ARGS,
    )  # fmt: skip

    for out in outputs:
        assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
        assert out["meta_info"]["spec_accept_rate"] == 1.0
