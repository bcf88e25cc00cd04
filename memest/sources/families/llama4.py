"""Meta Llama 4 checkpoints: llama4 (Scout, Maverick; ``Llama4ForConditionalGeneration``) and
llama4_text (``Llama4ForCausalLM``).

Follows transformers ``models/llama4/modeling_llama4.py``:

- Text layers (``Llama4TextDecoderLayer``): RMSNorms ``input_layernorm`` / ``post_attention_layernorm``;
  GQA projections biased per ``attention_bias``; the q/k norm (``use_qk_norm``) is an L2 norm without
  weights. A layer listed in ``moe_layers`` (by default every ``interleave_moe_layer_step``-th,
  ``Llama4TextConfig.__post_init__``) has ``feed_forward.router (E, h)``, routed experts stored
  ``(E, h, 2i)`` / ``(E, i, h)`` (``Llama4TextExperts``) and one always-on ``feed_forward.shared_expert``
  SwiGLU ``intermediate_size`` wide; the others a dense SwiGLU ``feed_forward`` ``intermediate_size_mlp``
  wide.
- Attention: the rotary (``no_rope_layers`` = 1, by default three of every four) layers are
  ``chunked_attention`` layers (each token attends within its ``attention_chunk_size`` chunk:
  :attr:`AttentionSpec.chunk_size`); the NoPE layers attend fully. Engines bound those layers' KV by
  the chunk: vLLM gives them a ``ChunkedLocalAttentionSpec`` (``vllm/model_executor/models/llama4.py``
  ``Llama4Attention``: ``use_irope=not self.nope``, vllm-project/vllm @ 0121c95e), whose
  ``max_memory_usage_bytes`` is ``min(chunk + max_num_batched_tokens, max_model_len)`` tokens, and
  transformers a ``DynamicSlidingWindowLayer`` of ``attention_chunk_size``. (vLLM releases whose
  ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`` defaults to 0 turn the hybrid KV-cache
  manager off for such models, ``vllm/config/vllm.py``, and then allocate every layer as full
  attention; the spec's notes say so.) Parameters do not depend on it.
- Vision (``Llama4VisionModel``, :attr:`Component.OTHER`): an unfold + bias-free ``patch_embedding.linear
  (vh, C p^2)``; ``class_embedding (vh)``; ``positional_embedding_vlm ((S/p)^2 + 1, vh)``; LayerNorms
  ``layernorm_pre`` / ``layernorm_post``; ``num_hidden_layers`` encoder layers (LayerNorms, biased
  vh x vh attention projections, biased ``mlp.fc1`` / ``fc2``); the pixel-shuffle adapter
  ``vision_adapter.mlp.fc1 (projector_input_dim, intermediate_size)`` and ``fc2 (out, out)``; and
  ``multi_modal_projector.linear_1 (h, vision_output_dim)``.
- ``Llama4ForConditionalGeneration`` keeps the text model at ``language_model.model`` and its lm_head
  at ``language_model.lm_head``, tied per the top-level ``tie_word_embeddings`` (default false).
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    OTHER,
    expert_stack,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    linear,
    lm_head,
    model_spec,
    norm,
    router,
    token_embedding,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

# Llama4TextConfig defaults (models/llama4/configuration_llama4.py) of the fields read here
_TEXT_DEFAULTS: dict[str, object] = {
    "vocab_size": 202048,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "tie_word_embeddings": False,
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
    "moe_layers": None,
    "interleave_moe_layer_step": 1,
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "attention_bias": False,
}
# Llama4VisionConfig defaults of the fields read here
_VISION_DEFAULTS: dict[str, object] = {
    "hidden_size": 768,
    "num_hidden_layers": 34,
    "num_channels": 3,
    "intermediate_size": 5632,
    "vision_output_dim": 7680,
    "image_size": 448,
    "patch_size": 14,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
}


def _text(cfg: HFConfig, prefix: str) -> tuple[list[LayerSpec], list[TensorSpec], list[TensorSpec], int, int, str]:
    """Layers, embedding, final norm, vocab, width and the chunked-attention note of the text model."""
    cfg = cfg.with_defaults(_TEXT_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    k = cfg.int("num_key_value_heads", default=a)
    d = head_dim_of(cfg, h, a)
    i = cfg.int("intermediate_size")
    dense_i = cfg.int("intermediate_size_mlp")
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    num_experts = cfg.int("num_local_experts")
    activation = cfg.str("hidden_act")
    moe_layers = cfg.get("moe_layers", default=None)
    if moe_layers is None:
        step = cfg.int("interleave_moe_layer_step")
        moe_layers = list(range(step - 1, num_layers, step))
    moe_set = set(moe_layers)
    chunk = cfg.int("attention_chunk_size", default=None)
    rope = cfg.get("no_rope_layers", default=None) or [
        int((n + 1) % cfg.int("no_rope_layer_interval") != 0) for n in range(num_layers)]
    if not isinstance(rope, list) or len(rope) != num_layers:
        raise ConfigError(f"{cfg.what}: 'no_rope_layers' must list {num_layers} entries (1: rotary, "
                          f"0: NoPE), got {rope!r}")
    chunked_at = [bool(r) and chunk is not None for r in rope]
    attentions = {chunked: AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, chunk_size=chunk if chunked else None)
                  for chunked in (False, True)}
    attention_tensors = gqa_projections(h, a, k, d, qkv_bias=cfg.bool("attention_bias"),
                                        o_bias=cfg.bool("attention_bias"))
    norms = (*norm("input_layernorm", h), *norm("post_attention_layernorm", h))
    kinds: dict[object, LayerSpec] = {}

    def dense(attention: AttentionSpec) -> LayerSpec:
        return LayerSpec(attention=attention, mlp=MLPSpec(gated=True, intermediate_size=dense_i, activation=activation),
                         tensors=(*attention_tensors, *gated_mlp(h, dense_i, prefix="feed_forward"), *norms))

    def moe(attention: AttentionSpec) -> LayerSpec:
        mlp = MLPSpec(gated=True, intermediate_size=i, activation=activation, num_experts=num_experts,
                      num_experts_per_tok=cfg.int("num_experts_per_tok"), num_shared_experts=1,
                      shared_intermediate_size=i)
        return LayerSpec(attention=attention, mlp=mlp, tensors=(
            *attention_tensors,
            *expert_stack(h, i, num_experts, prefix="feed_forward.experts", transposed=True),
            *router("feed_forward.router", h, num_experts),
            *gated_mlp(h, i, prefix="feed_forward.shared_expert"),
            *norms,
        ))

    def layer(n: int) -> LayerSpec:
        is_moe, chunked = n in moe_set, chunked_at[n]
        make = moe if is_moe else dense
        return intern(kinds, (is_moe, chunked), lambda: make(attentions[chunked]))

    layers = [layer(n) for n in range(num_layers)]
    chunked = sum(chunked_at)
    note = (
        f"{chunked} of {num_layers} layers use chunked attention (attention_chunk_size {chunk}): their KV cache holds "
        "at most one chunk per sequence (vLLM ChunkedLocalAttentionSpec: the chunk plus one step's tokens); vLLM "
        "releases that turn the hybrid KV-cache manager off for chunked attention "
        "(VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0) allocate them as full attention instead"
        if chunked else ""
    )
    embedding = [token_embedding(f"{prefix}embed_tokens.weight", vocab, h)]
    return layers, embedding, norm(f"{prefix}norm", h), vocab, h, note


def _vision(v: HFConfig, h: int) -> list[TensorSpec]:
    """The vision model and the multimodal projector (see the module docstring)."""
    v = v.with_defaults(_VISION_DEFAULTS)
    vh, vi = v.int("hidden_size"), v.int("intermediate_size")
    patch, channels = v.int("patch_size"), v.int("num_channels")
    p = "vision_model."
    tensors = [
        TensorSpec(f"{p}class_embedding", (vh,), OTHER),
        TensorSpec(f"{p}positional_embedding_vlm", ((v.int("image_size") // patch) ** 2 + 1, vh), OTHER),
        *linear(f"{p}patch_embedding.linear", channels * patch * patch, vh, OTHER, Split.NONE),
        *norm(f"{p}layernorm_pre", vh, bias=True, component=OTHER),
        *norm(f"{p}layernorm_post", vh, bias=True, component=OTHER),
    ]
    for n in range(v.int("num_hidden_layers")):
        q = f"{p}model.layers.{n}."
        tensors += [
            *(t for name in ("q_proj", "k_proj", "v_proj") for t in linear(f"{q}self_attn.{name}", vh, vh, OTHER, Split.COL, bias=True)),
            *linear(f"{q}self_attn.o_proj", vh, vh, OTHER, Split.ROW, bias=True),
            *linear(f"{q}mlp.fc1", vh, vi, OTHER, Split.COL, bias=True),
            *linear(f"{q}mlp.fc2", vi, vh, OTHER, Split.ROW, bias=True),
            *norm(f"{q}input_layernorm", vh, bias=True, component=OTHER),
            *norm(f"{q}post_attention_layernorm", vh, bias=True, component=OTHER),
        ]
    out = v.int("projector_output_dim")
    return [
        *tensors,
        *linear(f"{p}vision_adapter.mlp.fc1", vi, v.int("projector_input_dim"), OTHER, Split.NONE),
        *linear(f"{p}vision_adapter.mlp.fc2", out, out, OTHER, Split.NONE),
        *linear("multi_modal_projector.linear_1", v.int("vision_output_dim"), h, OTHER, Split.NONE),
    ]


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a llama4 / llama4_text config."""
    if cfg.model_type == "llama4_text":
        layers, embedding, final_norm, vocab, h, note = _text(cfg, "model.")
        text_cfg, towers, head_name = cfg.with_defaults(_TEXT_DEFAULTS), [], "lm_head"
    else:
        text_cfg = cfg.sub("text_config").with_defaults(_TEXT_DEFAULTS)
        layers, embedding, final_norm, vocab, h, note = _text(text_cfg, "language_model.model.")
        raw_vision = cfg.raw.get("vision_config")
        vision = HFConfig(raw_vision if isinstance(raw_vision, dict) else {}, name=cfg.name, source=cfg.source)
        towers, head_name = _vision(vision, h), "language_model.lm_head"
    tied = bool(cfg.get("tie_word_embeddings", default=False))
    notes = [note] if note else []
    if towers:
        notes.append("the vision model and multimodal projector are counted in 'embedding' (component other)")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        embedding=[*towers, *embedding],
        head=[*final_norm, *([] if tied else lm_head(vocab, h, name=head_name))],
        tie_word_embeddings=tied,
        max_position_embeddings=text_cfg.int("max_position_embeddings"),
        notes=tuple(notes),
    )
