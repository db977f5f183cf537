"""The hybrid state-space family: ``tiny-hybrid``, an IBM Granite 4.0-H-style model
(``GraniteMoeHybridForCausalLM`` with no routed experts) whose layers alternate Mamba2
mixers and attention (docs/families.md).

Why this architecture: of the attention + Mamba2 hybrids, it is one that vLLM 0.32 still
registers (Bamba was removed from vLLM in 0.23) and that transformers 5 runs without the
CUDA-only ``mamba_ssm``/``causal_conv1d`` packages (its pure-torch path, also in float64);
with ``num_local_experts = 0`` it is dense, so a failure points at the Mamba2 layers, not at
MoE. Its multipliers are neutral (1.0) except ``attention_multiplier``, which Granite uses as
the softmax scale and is set to the usual 1/sqrt(head_dim).

The state-space parameters are drawn the way Mamba2 checkpoints are initialised:
``A = -exp(A_log)`` with ``exp(A_log)`` uniform in [1, 16], ``softplus(dt_bias)``
log-uniform in [1e-3, 1e-1], ``D = 1``. A random ``A_log``/``dt_bias`` would give decay
rates no trained model has (states that never forget, or forget within one token) and a
state-carrying defect could then hide in either extreme.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from adaptcheck.frameworks.synthetic import ArchWriter, SyntheticSpec, register

if TYPE_CHECKING:
    import torch

LAYER_TYPES = ("mamba", "attention", "mamba")
"""Mamba first so the attention layer reads state-space output, and Mamba last so the LM
head does too: a state defect cannot be washed out by the layers after it."""

A_RANGE = (1.0, 16.0)
DT_RANGE = (1e-3, 1e-1)
CONV_STD = 0.5
"""Depthwise conv taps: ~1/sqrt(kernel width 4), the fan-in scaling of a real init."""
BC_GAIN = 4.0
"""The in_proj rows that make B and C are drawn this much larger than the other rows. At the
plain scale the state's read-out ``C . h`` is ~5% of the skip ``D * x`` (B and C ~0.5, and
``h`` sums only dt ~0.01 of each token), so a state that is never carried would change no
greedy token: a random model has none of the large B/C a trained one learns. At 4x the
state's share is comparable to the skip's, as in trained models."""


def _config(spec: SyntheticSpec, common: dict[str, Any]) -> dict[str, object]:
    import transformers

    n_heads = int(spec.knob("mamba_n_heads"))
    kwargs = dict(common)
    kwargs.pop("intermediate_size")
    cfg = transformers.GraniteMoeHybridConfig(
        **kwargs,
        intermediate_size=spec.intermediate_size,
        shared_intermediate_size=spec.intermediate_size,
        num_local_experts=0,
        position_embedding_type="rope",
        attention_multiplier=1.0 / math.sqrt(spec.head_dim),
        layer_types=list(spec.knob("layer_types")),
        mamba_n_heads=n_heads,
        mamba_d_head=spec.knob("mamba_d_head"),
        mamba_d_state=spec.knob("mamba_d_state"),
        mamba_n_groups=1,
        mamba_d_conv=spec.knob("mamba_d_conv"),
        mamba_expand=spec.knob("mamba_expand"),
        mamba_chunk_size=spec.knob("mamba_chunk_size"),
    )
    data = cfg.to_diff_dict()
    # (0, inf) is the default and "Infinity" is not JSON every reader accepts.
    data.pop("time_step_limit", None)
    data["head_dim"] = spec.head_dim
    return data


def _d_inner(spec: SyntheticSpec) -> int:
    return int(spec.knob("mamba_expand")) * spec.hidden_size


def _layout(spec: SyntheticSpec) -> list[tuple[str, tuple[int, ...], str]]:
    h, i, v, hd = spec.hidden_size, spec.intermediate_size, spec.vocab_size, spec.head_dim
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    d_inner, n_heads = _d_inner(spec), int(spec.knob("mamba_n_heads"))
    d_state, d_conv = int(spec.knob("mamba_d_state")), int(spec.knob("mamba_d_conv"))
    conv_dim = d_inner + 2 * d_state  # x, B and C (one group) go through the conv
    in_proj = 2 * d_inner + 2 * d_state + n_heads  # z, x, B, C, dt
    out: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (v, h), "embed")]
    for layer, kind in enumerate(spec.knob("layer_types")):
        p = f"model.layers.{layer}."
        out += [
            (p + "input_layernorm.weight", (h,), "ones"),
            (p + "post_attention_layernorm.weight", (h,), "ones"),
            (p + "shared_mlp.input_linear.weight", (2 * i, h), "linear"),
            (p + "shared_mlp.output_linear.weight", (h, i), "linear"),
        ]
        if kind == "mamba":
            m = p + "mamba."
            out += [
                (m + "in_proj.weight", (in_proj, h), "in_proj"),
                (m + "conv1d.weight", (conv_dim, 1, d_conv), "conv"),
                (m + "conv1d.bias", (conv_dim,), "bias"),
                (m + "A_log", (n_heads,), "a_log"),
                (m + "dt_bias", (n_heads,), "dt_bias"),
                (m + "D", (n_heads,), "ones"),
                (m + "norm.weight", (d_inner,), "ones"),
                (m + "out_proj.weight", (h, d_inner), "linear"),
            ]
        else:
            out += [
                (p + "self_attn.q_proj.weight", (q, h), "linear"),
                (p + "self_attn.k_proj.weight", (kv, h), "linear"),
                (p + "self_attn.v_proj.weight", (kv, h), "linear"),
                (p + "self_attn.o_proj.weight", (h, q), "linear"),
            ]
    out += [("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "lm_head")]
    return out


def _init(name: str, shape: tuple[int, ...], kind: str, gen: torch.Generator) -> torch.Tensor | None:
    import torch

    if kind == "a_log":
        lo, hi = A_RANGE
        return torch.log(lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float32))
    if kind == "dt_bias":
        lo, hi = (math.log(x) for x in DT_RANGE)
        dt = torch.exp(lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64))
        return (dt + torch.log(-torch.expm1(-dt))).float()  # softplus⁻¹(dt)
    if kind == "in_proj":
        # Rows: z and x (d_inner each), then B and C (d_state each), then dt (one per head).
        rows = torch.randn(shape, generator=gen, dtype=torch.float32) * STD
        n_heads, d_state = KNOBS["mamba_n_heads"], KNOBS["mamba_d_state"]
        bc = slice(shape[0] - n_heads - 2 * d_state, shape[0] - n_heads)
        rows[bc] *= BC_GAIN
        return rows
    if kind == "conv":
        return torch.randn(shape, generator=gen, dtype=torch.float32) * CONV_STD
    return None


KNOBS: dict[str, Any] = {
    "layer_types": LAYER_TYPES, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 32,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 16, "bc_gain": BC_GAIN,
}
"""The family knobs of ``tiny-hybrid`` (:attr:`SyntheticSpec.extra`)."""
STD = 0.06
"""SyntheticSpec's default ``std`` (the other linear layers')."""

TINY_HYBRID = register(
    SyntheticSpec(
        name="tiny-hybrid",
        architecture="GraniteMoeHybridForCausalLM",
        model_type="granitemoehybrid",
        description="Granite 4.0-H-style hybrid: Mamba2 / attention / Mamba2, d_state 32, 8 SSM heads of 64",
        hidden_size=256, intermediate_size=512, num_layers=len(LAYER_TYPES), num_heads=4, num_kv_heads=2,
        head_dim=64,
        extra=tuple(sorted(KNOBS.items())),
    ),
    ArchWriter(config=_config, layout=_layout, init=_init),
    families=("hybrid",),
)
