"""GPU datasheet numbers and model sizes, for the analytical (roofline) cost model.

Only used when no profiled cost file matches the deployment; the numbers are rough
on purpose (see ``cost_model.analytical``) and a profile replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# Fractions of datasheet bandwidth / tensor-core peak that large GEMMs and weight
# streaming reach in practice.
BANDWIDTH_EFFICIENCY = 0.8
FLOPS_EFFICIENCY = 0.6
# FASER's draft and verify forwards run outside CUDA graphs, so every layer pays
# kernel launches and Python time on top of its GPU work; ~100 us per layer per
# forward is what eager SGLang decoding shows on Hopper.
EAGER_SECONDS_PER_LAYER = 1e-4


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bandwidth: float  # bytes/s, HBM datasheet peak
    peak_flops: float  # FLOP/s, dense 16-bit tensor cores


# SXM parts where there are several; matched by substring of the CUDA device name in
# this order (so "L40S" is tried before "L4").
KNOWN_GPUS = (
    GpuSpec("H200", 4.8e12, 989e12),
    GpuSpec("H100", 3.35e12, 989e12),
    GpuSpec("A100", 2.0e12, 312e12),
    GpuSpec("L40S", 0.864e12, 362e12),
    GpuSpec("L4", 0.3e12, 121e12),
)
UNKNOWN_GPU = GpuSpec("unknown GPU (H100 numbers assumed)", 3.35e12, 989e12)


def gpu_spec(device_name: str) -> GpuSpec:
    """The datasheet entry whose name occurs in ``device_name``, else UNKNOWN_GPU."""
    upper = device_name.upper()
    for spec in KNOWN_GPUS:
        if spec.name in upper:
            return spec
    return UNKNOWN_GPU


_REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def dtype_bytes(dtype: str) -> int:
    """Bytes per weight of a dtype name ("bfloat16", "torch.float16", "fp8_e4m3", ...)."""
    name = str(dtype).removeprefix("torch.").lower()
    if "8" in name and ("fp8" in name or "float8" in name or "int8" in name):
        return 1
    return _DTYPE_BYTES.get(name, 2)


@dataclass(frozen=True)
class ModelShape:
    """What a dense decoder costs per forward, from its Hugging Face config."""

    layers: int
    matmul_params: int  # weights each token multiplies: decoder layers + LM head
    kv_bytes_per_token: int  # K and V of one token over all layers
    bytes_per_param: int

    @property
    def weight_bytes(self) -> int:
        return self.matmul_params * self.bytes_per_param

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any, dtype: str) -> "ModelShape":
        """Count parameters of a Llama-style decoder (gated MLP, grouped-query attention).

        ``config`` is a ``config.json`` mapping or a transformers config object. MoE
        models are counted as dense with their per-expert intermediate size, which
        underestimates their weight traffic; profile them instead.
        """
        missing = [k for k in _REQUIRED_FIELDS if _field(config, k) is None]
        if missing:
            raise ValueError(
                f"model config lacks {missing}, so the analytical cost model cannot size it; "
                "profile the deployment (scripts/profile_costs.py) and set cost_model_path"
            )
        hidden = int(_field(config, "hidden_size"))
        layers = int(_field(config, "num_hidden_layers"))
        heads = int(_field(config, "num_attention_heads"))
        kv_heads = int(_field(config, "num_key_value_heads") or heads)
        head_dim = int(_field(config, "head_dim") or hidden // heads)
        intermediate = int(_field(config, "intermediate_size"))
        vocab = int(_field(config, "vocab_size"))
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
        mlp = 3 * hidden * intermediate  # gate, up, down
        width = dtype_bytes(dtype)
        return cls(
            layers=layers,
            matmul_params=layers * (attention + mlp) + vocab * hidden,
            kv_bytes_per_token=2 * layers * kv_heads * head_dim * width,
            bytes_per_param=width,
        )


def _field(config: Mapping[str, Any] | Any, name: str) -> Any:
    """A config.json key or a transformers config attribute; None when absent."""
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)
