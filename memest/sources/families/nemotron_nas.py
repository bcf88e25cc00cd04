"""NVIDIA's NAS-pruned Llama derivatives: nemotron-nas (``DeciLMForCausalLM``: Llama-3.3-Nemotron-Super-49B,
Llama-3.1-Nemotron-Ultra-253B, Llama-3.1-Nemotron-51B), a config-only family: transformers does not ship it.

Follows the ``modeling_decilm.py`` of the Hub repositories, as its ports read it (NVIDIA-NeMo/Automodel
@ 973123eccfbf2f36d096ca73567c06e80a284890 : nemo_automodel/components/models/decilm/layers.py, whose
``Block`` matches the Hub checkpoint's keys; vLLM ``vllm/model_executor/models/nemotron_nas.py``):
a Llama model whose layers differ one by one, as ``block_configs[n]`` says:

- ``attention``: ``no_op`` -- no attention and no ``input_layernorm`` (the layer caches nothing);
  ``replace_with_linear`` -- ``input_layernorm`` and one bias-free ``self_attn.linear_attn (h, h)``
  (no token mixing, no cache); otherwise ``input_layernorm`` and Llama's GQA projections with
  ``num_attention_heads / n_heads_in_group`` KV heads, biased per ``attention_bias``;
- ``ffn``: ``no_op`` -- no MLP and no ``post_attention_layernorm``; ``replace_with_linear`` --
  ``post_attention_layernorm`` and ``mlp.linear_mlp (h, h)``; otherwise a SwiGLU MLP of
  ``_ffn_mult_to_intermediate_size(ffn_mult, h)`` = ``int(2 ffn_mult h / 3)`` rounded up to a multiple
  of 256, biased per ``mlp_bias``.

Embedding, final norm and lm_head are Llama's. Sliding-window and attention-sink variants of a block
(``window_length``, ``num_sink_tokens``, ``sparsify``) are refused: no published checkpoint uses them
and memest does not model them.
"""

from __future__ import annotations

from typing import Any

from memest.errors import ConfigError
from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    MLP,
    decoder_spec,
    gated_mlp,
    gqa_projections,
    head_dim_of,
    intern,
    linear,
    norm,
)
from memest.spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, Split

# DeciLMConfig (a LlamaConfig subclass in the Hub repos' configuration_decilm.py) defaults read here
_DEFAULTS: dict[str, object] = {
    "vocab_size": 32000,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}
_UNSUPPORTED = ("window_length", "num_sink_tokens", "sparsify")


def ffn_intermediate_size(ffn_mult: float, hidden_size: int) -> int:
    """DeciLM's ``_ffn_mult_to_intermediate_size``: ``int(2 ffn_mult h / 3)`` rounded up to 256."""
    size = int(2 * ffn_mult * hidden_size / 3)
    return size if size % 256 == 0 else size + 256 - size % 256


def _block(cfg: HFConfig, n: int, part: str) -> dict[str, Any]:
    blocks = cfg.get("block_configs")
    if not isinstance(blocks, list):
        raise ConfigError(f"{cfg.what}: 'block_configs' must be a list of per-layer blocks, got {blocks!r}")
    value = blocks[n].get(part) if isinstance(blocks[n], dict) else None
    if not isinstance(value, dict):
        raise ConfigError(f"{cfg.what}: block_configs[{n}] has no {part!r} section; pass the complete "
                          "config.json")
    for key in _UNSUPPORTED:
        if value.get(key):
            raise ConfigError(f"{cfg.what}: block_configs[{n}].{part}.{key} = {value[key]!r} is not "
                              "modelled by memest; only full, linear and no-op blocks are")
    return value


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a nemotron-nas (DeciLM) config."""
    cfg = cfg.with_defaults(_DEFAULTS)
    h = cfg.int("hidden_size")
    a = cfg.int("num_attention_heads")
    d = head_dim_of(cfg, h, a)
    vocab = cfg.int("vocab_size")
    num_layers = cfg.int("num_hidden_layers")
    blocks = cfg.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != num_layers:
        raise ConfigError(f"{cfg.what}: 'block_configs' must list {num_layers} blocks (one per layer), "
                          f"got {len(blocks) if isinstance(blocks, list) else blocks!r}")
    activation = cfg.str("hidden_act")
    attention_bias, mlp_bias = cfg.bool("attention_bias"), cfg.bool("mlp_bias")
    no_mixer = AttentionSpec(kind="none", num_heads=0, num_kv_heads=0, head_dim=0)
    kinds: dict[object, LayerSpec] = {}

    def attention_of(n: int) -> tuple[object, AttentionSpec, list]:
        block = _block(cfg, n, "attention")
        if block.get("no_op"):
            return "none", no_mixer, []
        if block.get("replace_with_linear"):
            return "linear", no_mixer, [*norm("input_layernorm", h),
                                        *linear("self_attn.linear_attn", h, h, ATTN, Split.NONE)]
        group = block.get("n_heads_in_group")
        if not isinstance(group, int) or isinstance(group, bool) or group < 1 or a % group:
            raise ConfigError(f"{cfg.what}: block_configs[{n}].attention.n_heads_in_group = {group!r}; "
                              f"it must be a divisor of num_attention_heads ({a})")
        k = a // group
        return ("gqa", k), AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d), [
            *norm("input_layernorm", h), *gqa_projections(h, a, k, d, qkv_bias=attention_bias, o_bias=attention_bias)]

    def ffn_of(n: int) -> tuple[object, MLPSpec, list]:
        block = _block(cfg, n, "ffn")
        if block.get("no_op"):
            return "none", MLPSpec(gated=False, intermediate_size=0, activation=activation), []
        if block.get("replace_with_linear"):
            return "linear", MLPSpec(gated=False, intermediate_size=0, activation=activation), [
                *norm("post_attention_layernorm", h), *linear("mlp.linear_mlp", h, h, MLP, Split.NONE)]
        mult = block.get("ffn_mult")
        if isinstance(mult, bool) or not isinstance(mult, int | float) or mult <= 0:
            raise ConfigError(f"{cfg.what}: block_configs[{n}].ffn.ffn_mult = {mult!r}; it must be a "
                              "positive number")
        i = ffn_intermediate_size(mult, h)
        return i, MLPSpec(gated=True, intermediate_size=i, activation=activation), [
            *norm("post_attention_layernorm", h), *gated_mlp(h, i, bias=mlp_bias)]

    def layer(n: int) -> LayerSpec:
        attention_key, attention, attention_tensors = attention_of(n)
        ffn_key, mlp, ffn_tensors = ffn_of(n)
        return intern(kinds, (attention_key, ffn_key), lambda: LayerSpec(
            attention=attention, mlp=mlp, tensors=(*attention_tensors, *ffn_tensors)))

    layers = [layer(n) for n in range(num_layers)]
    without = sum(1 for layer_ in layers if layer_.attention.kind == "none")
    notes = (f"{without} of {num_layers} layers have no attention (block_configs no_op / replace_with_linear): "
             "they cache no KV",) if without else ()
    return decoder_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=layers,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        notes=notes,
    )
