"""The embedded MoE families beyond Mixtral: DeepSeek-V3 (multi-head latent attention, sigmoid
routing with a score-correction bias, grouped top-k, a shared expert, a dense first layer) and
Qwen3-MoE (q/k RMSNorm, softmax top-k renormalised), written in their checkpoints' naming
(docs/families.md).

Each variant is small enough that the float64 reference stays cheap, but keeps the shapes the
frameworks' kernels are selected by: the DeepSeek latent cache is 512 + 64 = 576 wide, the one
head size vLLM's CPU MLA decode kernel is built for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adaptcheck.frameworks.synthetic import ArchWriter, SyntheticSpec, register

if TYPE_CHECKING:
    import torch

Layout = list[tuple[str, tuple[int, ...], str]]

# ---- DeepSeek-V3 ----------------------------------------------------------------------------

DEEPSEEK_V3 = SyntheticSpec(
    name="tiny-deepseek-v3",
    architecture="DeepseekV3ForCausalLM",
    model_type="deepseek_v3",
    description="DeepSeek-V3: MLA (latent 512 + rope 64 = 576, q_lora 128), sigmoid routing with "
                "correction bias, 8 experts in 4 groups (top-2 groups, top-2 experts), 1 shared expert, "
                "first layer dense",
    hidden_size=256, intermediate_size=512, num_layers=3, num_heads=4, num_kv_heads=4,
    head_dim=128,  # qk_nope + qk_rope: the width a query head is scored with
    num_experts=8, experts_per_token=2,
    # Sigmoid scores saturate: logits of a few units put several experts near 1 and their order
    # at the mercy of rounding. ~1/sqrt(hidden) * 1.5 keeps the logits around +-1.5, where the
    # sigmoid still separates experts (the Mixtral-style 0.2 would not).
    router_std=0.1,
    extra=tuple(sorted({
        "kv_lora_rank": 512,
        "q_lora_rank": 128,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        "moe_intermediate_size": 128,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        # The correction bias is of the order of the gaps between sigmoid scores, so routing
        # without it picks other experts for a good share of tokens (a kernel that ignores it
        # is visible), while every choice keeps a clear margin (see _deepseek_init).
        "correction_bias_std": 0.15,
        # RMS of the query and KV latents before their RMSNorms (see _deepseek_init).
        "latent_rms": 20.0,
    }.items())),
)


def _deepseek_config(spec: SyntheticSpec, common: dict[str, Any]) -> dict[str, object]:
    import transformers

    k = spec.knob
    fields: dict[str, Any] = dict(common)
    fields.update(
        moe_intermediate_size=k("moe_intermediate_size"), n_shared_experts=k("n_shared_experts"),
        n_routed_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
        routed_scaling_factor=k("routed_scaling_factor"), kv_lora_rank=k("kv_lora_rank"),
        q_lora_rank=k("q_lora_rank"), qk_rope_head_dim=k("qk_rope_head_dim"),
        qk_nope_head_dim=k("qk_nope_head_dim"), v_head_dim=k("v_head_dim"), n_group=k("n_group"),
        topk_group=k("topk_group"), first_k_dense_replace=k("first_k_dense_replace"), norm_topk_prob=True,
        rope_interleave=True,  # vLLM's DeepSeek rotary is GPT-J style (interleaved pairs) only
        num_nextn_predict_layers=0,  # no multi-token-prediction layer: nothing but the causal LM
    )
    cfg = transformers.DeepseekV3Config(**fields)
    data = cfg.to_diff_dict()
    # Read by vLLM (DeepSeek's own config keys, which transformers' config class does not keep):
    # without them vLLM would route by softmax and ignore the correction bias.
    data.update({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1})
    return data


def _mlp(prefix: str, h: int, i: int) -> Layout:
    return [(prefix + "gate_proj.weight", (i, h), "linear"), (prefix + "up_proj.weight", (i, h), "linear"),
            (prefix + "down_proj.weight", (h, i), "linear")]


def _deepseek_layout(spec: SyntheticSpec) -> Layout:
    k = spec.knob
    h, v, heads = spec.hidden_size, spec.vocab_size, spec.num_heads
    rank, q_rank = k("kv_lora_rank"), k("q_lora_rank")
    nope, rope, vd = k("qk_nope_head_dim"), k("qk_rope_head_dim"), k("v_head_dim")
    out: Layout = [("model.embed_tokens.weight", (v, h), "embed")]
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        out += [(p + "input_layernorm.weight", (h,), "ones"), (p + "post_attention_layernorm.weight", (h,), "ones")]
        if q_rank is None:
            out.append((a + "q_proj.weight", (heads * (nope + rope), h), "linear"))
        else:
            out += [(a + "q_a_proj.weight", (q_rank, h), "latent_down"),
                    (a + "q_a_layernorm.weight", (q_rank,), "ones"),
                    (a + "q_b_proj.weight", (heads * (nope + rope), q_rank), "linear")]
        out += [
            (a + "kv_a_proj_with_mqa.weight", (rank + rope, h), "latent_down"),
            (a + "kv_a_layernorm.weight", (rank,), "ones"),
            (a + "kv_b_proj.weight", (heads * (nope + vd), rank), "latent_up"),
            (a + "o_proj.weight", (h, heads * vd), "linear"),
        ]
        if layer < k("first_k_dense_replace"):
            out += _mlp(p + "mlp.", h, spec.intermediate_size)
            continue
        m = p + "mlp."
        moe_i = k("moe_intermediate_size")
        out += [(m + "gate.weight", (spec.num_experts, h), "router"),
                (m + "gate.e_score_correction_bias", (spec.num_experts,), "correction_bias")]
        for e in range(spec.num_experts):
            out += _mlp(m + f"experts.{e}.", h, moe_i)
        out += _mlp(m + "shared_experts.", h, moe_i * k("n_shared_experts"))
    out += [("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "lm_head")]
    return out


def _deepseek_init(name: str, shape: tuple[int, ...], kind: str, gen: torch.Generator) -> torch.Tensor | None:
    import torch

    if kind == "correction_bias":
        # Evenly spread values in a random order (not Gaussian draws): no two experts get nearly
        # the same bias, so the bias never turns two experts' scores into a near-tie by itself.
        n = shape[0]
        std = DEEPSEEK_V3.knob("correction_bias_std")
        levels = torch.linspace(-1.0, 1.0, n, dtype=torch.float32) * std * 1.7  # std of a uniform grid ~ 0.58 * width/2
        return levels[torch.randperm(n, generator=gen)]
    # One DeepSeek variant: its knobs are read here (the init callback is per model_type).
    if kind == "latent_down":
        # The projections into the two latents, whose RMSNorms transformers builds with eps 1e-6
        # whatever config.json says while vLLM takes rms_norm_eps (0.05 here, see RMS_NORM_EPS):
        # latents of RMS ~20 make eps irrelevant to both (5e-5 of the mean square), so the two
        # frameworks compute the same model. (At RMS ~1 the difference alone moved vLLM's bf16 KL
        # from the float64 reference to 16x the control: measured, generator version 3.) The
        # rotary key rows at the end of kv_a_proj_with_mqa are not normalised and keep the usual
        # scale.
        scale = DEEPSEEK_V3.knob("latent_rms") * shape[1] ** -0.5  # inputs are RMS-normalised (~1)
        w = torch.randn(shape, generator=gen, dtype=torch.float32) * scale
        if name.endswith("kv_a_proj_with_mqa.weight"):
            w[-DEEPSEEK_V3.knob("qk_rope_head_dim"):] *= DEEPSEEK_V3.std / scale
        return w
    if kind == "latent_up":
        # The latent is RMS-normalised (entries ~1) and 512 wide: 1/sqrt(512) keeps keys and values
        # at the scale the other projections give (the 0.06 of a 256-wide input would double it).
        return torch.randn(shape, generator=gen, dtype=torch.float32) * shape[1] ** -0.5
    return None


register(DEEPSEEK_V3, ArchWriter(config=_deepseek_config, layout=_deepseek_layout, init=_deepseek_init),
         families=("mla", "moe"))

# ---- Qwen3-MoE --------------------------------------------------------------------------------

QWEN3_MOE = SyntheticSpec(
    name="tiny-qwen3-moe",
    architecture="Qwen3MoeForCausalLM",
    model_type="qwen3_moe",
    description="Qwen3-MoE: q/k RMSNorm, 8 experts top-2 (softmax, renormalised), head_dim 64",
    hidden_size=256, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
    num_experts=8, experts_per_token=2,
)


def _qwen3_moe_config(spec: SyntheticSpec, common: dict[str, Any]) -> dict[str, object]:
    import transformers

    fields: dict[str, Any] = dict(
        common, head_dim=spec.head_dim, num_experts=spec.num_experts,
        num_experts_per_tok=spec.experts_per_token, moe_intermediate_size=spec.intermediate_size,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
    )
    cfg = transformers.Qwen3MoeConfig(**fields)
    data = cfg.to_diff_dict()
    data["head_dim"] = spec.head_dim
    return data


def _qwen3_moe_layout(spec: SyntheticSpec) -> Layout:
    h, v, hd, i = spec.hidden_size, spec.vocab_size, spec.head_dim, spec.intermediate_size
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    out: Layout = [("model.embed_tokens.weight", (v, h), "embed")]
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        out += [
            (p + "input_layernorm.weight", (h,), "ones"),
            (p + "post_attention_layernorm.weight", (h,), "ones"),
            (a + "q_proj.weight", (q, h), "linear"),
            (a + "k_proj.weight", (kv, h), "linear"),
            (a + "v_proj.weight", (kv, h), "linear"),
            (a + "o_proj.weight", (h, q), "linear"),
            (a + "q_norm.weight", (hd,), "norm_gain"),
            (a + "k_norm.weight", (hd,), "norm_gain"),
            (p + "mlp.gate.weight", (spec.num_experts, h), "router"),
        ]
        for e in range(spec.num_experts):
            out += _mlp(p + f"mlp.experts.{e}.", h, i)
    out += [("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "lm_head")]
    return out


def _qwen3_moe_init(name: str, shape: tuple[int, ...], kind: str, gen: torch.Generator) -> torch.Tensor | None:
    import torch

    if kind == "norm_gain":
        # Per-channel gains around 1 (not all ones): a q/k norm applied with the wrong weight, or
        # to the wrong axis, then changes the attention scores.
        return 1.0 + 0.3 * torch.randn(shape, generator=gen, dtype=torch.float32)
    return None


register(QWEN3_MOE, ArchWriter(config=_qwen3_moe_config, layout=_qwen3_moe_layout, init=_qwen3_moe_init),
         families=("moe",))
