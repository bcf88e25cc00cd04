"""Xiaomi MiMo-7B (``mimo``, ``MiMoForCausalLM``), a config-only family: transformers does not ship it.

The Hub repositories' ``modeling_mimo.py`` (XiaomiMiMo/MiMo-7B-Base; the same code in vLLM's and
SGLang's ports) is Qwen2 -- ``MiMoConfig(Qwen2Config)``, ``MiMoForCausalLM(Qwen2ForCausalLM)`` -- plus
``num_nextn_predict_layers`` multi-token-prediction layers that ``MiMoModel`` instantiates as
``model.mtp_layers.N`` (``MiMoMTPLayers``): RMSNorms ``input_layernorm``, ``post_attention_layernorm``,
``token_layernorm``, ``hidden_layernorm``, ``final_layernorm``; ``input_proj (h, 2h)`` without bias; a
``Qwen2Attention`` (Q/K/V biased, O not) and a ``Qwen2MLP``. They are loaded with the model, so they
are counted (in ``head``: they run after the last layer, on the last pipeline stage); the decoder
runs them only to draft tokens (vLLM: ``--speculative-config`` method ``mimo_mtp``), so no KV cache is
counted for them, and the spec's notes say so.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families import llama
from memest.sources.families._build import (
    OTHER,
    gated_mlp,
    gqa_projections,
    linear,
    norm,
)
from memest.spec import ModelSpec, Split, TensorSpec

_DEFAULTS: dict[str, object] = {"num_nextn_predict_layers": 0}  # MiMoConfig; the rest is Qwen2Config's


def mtp_layer(prefix: str, h: int, a: int, k: int, d: int, i: int) -> list[TensorSpec]:
    """One ``MiMoMTPLayers`` (see the module docstring)."""
    return [
        *norm(f"{prefix}input_layernorm", h),
        *norm(f"{prefix}post_attention_layernorm", h),
        *norm(f"{prefix}token_layernorm", h),
        *norm(f"{prefix}hidden_layernorm", h),
        *linear(f"{prefix}input_proj", 2 * h, h, OTHER, Split.NONE),
        *norm(f"{prefix}final_layernorm", h),
        *gqa_projections(h, a, k, d, prefix=f"{prefix}self_attn", qkv_bias=True),
        *gated_mlp(h, i, prefix=f"{prefix}mlp"),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a mimo config: the Qwen2 model and its MTP layers."""
    cfg = cfg.with_defaults(_DEFAULTS)
    qwen2 = llama.build(HFConfig({**cfg.raw, "model_type": "qwen2"}, name=cfg.name, source=cfg.source,
                                 note=cfg.note, code_from=cfg.code_from))
    h, a, k, d, i = qwen2.hidden_size, qwen2.num_heads, qwen2.num_kv_heads, qwen2.head_dim, qwen2.intermediate_size
    mtp = cfg.int("num_nextn_predict_layers", minimum=0)
    tensors = [t for n in range(mtp) for t in mtp_layer(f"model.mtp_layers.{n}.", h, a, k, d, i)]
    notes = (f"{mtp} multi-token-prediction layer(s) (model.mtp_layers, {sum(t.numel for t in tensors):,} "
             "parameters) are counted as weights; they draft tokens only with MTP speculative decoding and "
             "no KV cache is counted for them",) if mtp else ()
    return qwen2.replace(model_type=cfg.model_type, head=(*tensors, *qwen2.head), notes=(*qwen2.notes, *notes))
