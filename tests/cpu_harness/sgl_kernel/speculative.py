"""Pure-torch versions of sgl_kernel's CPU cache-location and speculative kernels.

Semantics follow the C++ CPU kernels (``sgl-kernel/csrc/cpu``) argument for
argument, including which tensors are written in place, so SGLang's call
sites work unchanged. Index math is vectorized with ragged-range helpers;
the tree kernels walk their (tiny) draft trees in Python.
"""

from __future__ import annotations

import torch

from sgl_kernel._missing import missing_getattr

__getattr__ = missing_getattr(__name__)


def _ragged_ranges(
    start: torch.Tensor, end: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten the ranges ``[start[i], end[i])`` into (segment id, position) pairs.

    The pairs come out in segment order, which is also the packed order of
    the flat ``out_cache_loc`` vectors these kernels read or write.
    """
    start = start.to(torch.int64)
    lengths = end.to(torch.int64) - start
    segment = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=start.device), lengths
    )
    packed_begin = torch.cumsum(lengths, 0) - lengths
    offset_in_segment = torch.arange(segment.numel(), device=start.device) - (
        packed_begin[segment]
    )
    return segment, start[segment] + offset_in_segment


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[rpi[i], start[i]:end[i]] = out_cache_loc[packed slice i]``."""
    segment, position = _ragged_ranges(start_offset, end_offset)
    rows = req_pool_indices.to(torch.int64)[segment]
    req_to_token[rows, position] = out_cache_loc[: segment.numel()].to(
        req_to_token.dtype
    )


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather ``req_to_token[rpi[i], start[i]:end[i]]`` into packed ``out_cache_loc``.

    ``out_cache_loc`` may be longer than needed; its tail is left untouched.
    """
    segment, position = _ragged_ranges(start_offset, end_offset)
    rows = req_pool_indices.to(torch.int64)[segment]
    out_cache_loc[: segment.numel()] = req_to_token[rows, position].to(
        out_cache_loc.dtype
    )


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Read the ``topk * num_steps`` draft slots reserved after each prefix."""
    copy_len = topk * num_steps
    columns = seq_lens.to(torch.int64)[:, None] + torch.arange(
        copy_len, device=seq_lens.device
    )
    rows = req_pool_indices.to(torch.int64)[:, None]
    out_cache_loc.view(-1, copy_len)[:] = req_to_token[rows, columns].to(
        out_cache_loc.dtype
    )


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Expand req_to_token for multi-step draft decode.

    Row ``b * topk + k`` holds request b's committed prefix followed by
    candidate k's draft slots, which the contiguous layout placed at
    ``seq_len + k * num_steps``. Only the first ``seq_len + num_steps``
    entries of each row are meaningful.
    """
    rows = req_to_token[req_pool_indices.to(torch.int64)]
    draft = rows.repeat_interleave(topk, dim=0)
    seq_lens = seq_lens.to(torch.int64).repeat_interleave(topk)
    candidate = torch.arange(topk, device=rows.device).repeat(rows.shape[0])
    step = torch.arange(num_steps, device=rows.device)
    dst = seq_lens[:, None] + step
    src = dst + (candidate * num_steps)[:, None]
    draft.scatter_(1, dst, torch.gather(draft, 1, src))
    return draft


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[i]`` = the last accepted token of request i."""
    bs = accept_lens.numel()
    flat_index = (
        torch.arange(bs, device=accept_lens.device) * accept_stride
        + accept_lens.to(torch.int64)
        - 1
    )
    bonus_tokens.copy_(accept_tokens.reshape(-1)[flat_index])


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact ``out_cache_loc`` at the accepted (non ``-1``) indices, in order."""
    flat = accept_index.reshape(-1).to(torch.int64)
    accepted = flat[flat > -1]
    accept_out_cache_loc[: accepted.numel()] = out_cache_loc[accepted]


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each extend segment left by one and append the new draft token.

    The token goes to the segment's last slot, or to ``select_index[i]`` when
    given. Mutates ``input_ids`` in place.
    """
    start = extend_start_loc.to(torch.int64)
    lengths = extend_seq_lens.to(torch.int64)
    _, position = _ragged_ranges(start, start + (lengths - 1).clamp(min=0))
    input_ids[position] = input_ids[position + 1]
    nonempty = lengths > 0
    if select_index is not None:
        target = select_index.to(torch.int64)
    else:
        target = start + lengths - 1
    input_ids[target[nonempty]] = topk_index.reshape(-1)[nonempty].to(input_ids.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: accept the longest root path matching the target.

    Writes ``predicts`` (verified token per flat draft index), ``accept_index``
    (flat indices of accepted tokens; rejected slots keep the caller's -1) and
    ``accept_token_num`` (accepted drafts per request, bonus excluded).
    """
    batch_size, num_draft_tokens = candidates.shape
    num_spec_step = accept_index.shape[1]
    cand = candidates.tolist()
    index = retrive_index.tolist()
    next_token = retrive_next_token.tolist()
    next_sibling = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()

    predicted: dict[int, int] = {}
    for bx in range(batch_size):
        last_accept = index[bx][0]
        accept_index[bx, 0] = last_accept
        num_correct = 0
        cur = 0
        for _ in range(1, num_spec_step):
            cur = next_token[bx][cur]
            while cur != -1:
                if cand[bx][cur] == target[last_accept]:
                    predicted[last_accept] = target[last_accept]
                    num_correct += 1
                    accept_index[bx, num_correct] = index[bx][cur]
                    last_accept = index[bx][cur]
                    break
                cur = next_sibling[bx][cur]
            if cur == -1:
                break
        accept_token_num[bx] = num_correct
        predicted[last_accept] = target[last_accept]

    if predicted:
        flat = torch.tensor(list(predicted), dtype=torch.int64)
        values = torch.tensor(list(predicted.values()), dtype=predicts.dtype)
        predicts[flat] = values


def _tree_node(selected: list[int], token_idx: int) -> int:
    """Tree node holding draft ``token_idx``; -1 if absent (malformed tree)."""
    return selected.index(token_idx) if token_idx in selected else -1


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the draft token tree consumed by target verify.

    Fills the tree attention mask, per-token positions and the retrieval
    linkage (index / first child / next sibling) used by verify_tree_greedy.
    ``tree_mask_mode`` 0 is FULL_MASK (rows span prefix + draft; the caller
    pre-fills the prefix columns), 1 is QLEN_ONLY (draft x draft rows).
    ``retrive_next_token`` / ``retrive_next_sibling`` arrive pre-filled with -1.
    """
    if tree_mask_mode not in (0, 1):
        raise ValueError(f"unsupported tree_mask_mode {tree_mask_mode}")
    bs = parent_list.shape[0]
    parents = parent_list.reshape(bs, -1).tolist()
    selected = selected_index.reshape(bs, -1).tolist()
    seq_lens = verified_seq_len.tolist()
    next_token = retrive_next_token.reshape(bs, draft_token_num).tolist()
    next_sibling = retrive_next_sibling.reshape(bs, draft_token_num).tolist()
    pos = [[0] * draft_token_num for _ in range(bs)]

    mask_rows: list[tuple[int, list[int]]] = []  # (row start, allowed columns)
    mask_row_offset = 0
    for bid in range(bs):
        seq_len = seq_lens[bid]
        sel = selected[bid]
        pos[bid][0] = seq_len

        for i in range(draft_token_num - 1, 0, -1):
            parent_tb_idx = sel[i - 1] // topk
            parent_position = 0
            if parent_tb_idx > 0:
                found = _tree_node(sel, parents[bid][parent_tb_idx])
                if found < 0:
                    continue
                parent_position = found + 1
            origin = next_token[bid][parent_position]
            next_token[bid][parent_position] = i
            if origin != -1:
                next_sibling[bid][i] = origin

        if tree_mask_mode == 1:
            row_len, first_col = draft_token_num, 0
            base = bid * draft_token_num * draft_token_num
        else:
            row_len, first_col = seq_len + draft_token_num, seq_len
            base = mask_row_offset
            mask_row_offset += draft_token_num * row_len
        for tid in range(draft_token_num):
            allowed = [0]
            if tid > 0:
                position = 0
                cur = tid - 1
                while position < depth:
                    position += 1
                    allowed.append(cur + 1)
                    ptb = sel[cur] // topk
                    if ptb == 0:
                        break
                    cur = _tree_node(sel, parents[bid][ptb])
                    if cur < 0:
                        break
                pos[bid][tid] = position + seq_len
            mask_rows.append((base + tid * row_len + first_col, allowed))

    flat_mask = tree_mask.view(-1)
    for row_start, allowed in mask_rows:
        flat_mask[row_start : row_start + draft_token_num] = False
        flat_mask[[row_start + c for c in allowed]] = True
    offsets = torch.arange(bs * draft_token_num, dtype=retrive_index.dtype)
    retrive_index.view(-1).copy_(offsets)
    positions.view(-1).copy_(torch.tensor(pos, dtype=positions.dtype).view(-1))
    retrive_next_token.view(-1).copy_(
        torch.tensor(next_token, dtype=retrive_next_token.dtype).view(-1)
    )
    retrive_next_sibling.view(-1).copy_(
        torch.tensor(next_sibling, dtype=retrive_next_sibling.dtype).view(-1)
    )


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Recover tree linkage from a QLEN-layout boolean tree mask (NGRAM path).

    Per node: position = depth + verified prefix length, retrieval index =
    flat node index, first child and next sibling (a later node sharing the
    parent with no intervening ancestor).
    """
    n = draft_token_num
    mask = tree_mask.reshape(batch_size, n, n).to(torch.bool)
    strictly_lower = torch.ones(n, n, dtype=torch.bool).tril(-1)
    ancestors = mask & strictly_lower  # [b, node, earlier node]
    depth = ancestors.sum(-1)
    positions.view(batch_size, n).copy_(depth + verified_seq_len.view(-1, 1))
    retrive_index.view(-1).copy_(torch.arange(batch_size * n))

    # The parent is the nearest (highest index) ancestor.
    col = torch.arange(n).expand(batch_size, n, n)
    parent = torch.where(ancestors, col, torch.full_like(col, -1)).amax(-1)

    next_token = torch.full((batch_size, n), -1, dtype=torch.int64)
    next_sibling = torch.full((batch_size, n), -1, dtype=torch.int64)
    mask_list = mask.tolist()
    parent_list = parent.tolist()
    for b in range(batch_size):
        rows = mask_list[b]
        for tid in range(n):
            for i in range(tid + 1, n):
                if rows[i][tid]:
                    next_token[b, tid] = i
                    break
            p = parent_list[b][tid]
            if p == -1:
                continue
            for i in range(tid + 1, n):
                if rows[i][p] and not any(rows[i][p + 1 : i]):
                    next_sibling[b, tid] = i
                    break
    retrive_next_token.view(batch_size, n).copy_(next_token)
    retrive_next_sibling.view(batch_size, n).copy_(next_sibling)
