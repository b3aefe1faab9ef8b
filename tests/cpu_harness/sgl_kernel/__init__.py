"""Pure-torch stand-in for SGLang's ``sgl_kernel`` extension, for CPU-only tests.

Every name SGLang imports from ``sgl_kernel`` resolves: kernels that CPU
serving actually calls are implemented in plain torch (see ``speculative``,
``kvcacheio`` and ``attention``, which also registers the
``torch.ops.sgl_kernel`` attention ops); any other name is a placeholder
that raises ``NotImplementedError(name)`` when called.

Ops that would make SGLang pick its AMX-only code paths (e.g.
``convert_weight_packed``) are deliberately not registered, so
``cpu_has_amx_support()`` stays False and model layers use native torch.
"""

from sgl_kernel import attention as _attention  # noqa: F401  registers torch ops
from sgl_kernel._missing import missing_getattr
from sgl_kernel.kvcacheio import copy_all_layer_kv_cache_cpu
from sgl_kernel.speculative import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]

__getattr__ = missing_getattr(__name__)
