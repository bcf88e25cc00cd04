"""GPT-2-style decoders: gpt2 and gpt_bigcode (SantaCoder, StarCoder, OctoCoder).

Pre-norm LayerNorm blocks with learned absolute positions (``transformer.wpe``), a fused QKV
projection ``attn.c_attn`` and a GELU MLP ``mlp.c_fc``/``mlp.c_proj``, all biased; lm_head tied
to ``transformer.wte`` by default. Follows transformers:

- ``models/gpt2/modeling_gpt2.py``: projections are ``Conv1D``, whose weights are stored
  ``(in_features, out_features)``; ``c_attn`` is ``(h, 3h)``; ``n_inner`` defaults to 4h;
  ``add_cross_attention`` adds ``crossattention`` (``c_attn (h, 2h)``, ``q_attn``, ``c_proj``) and
  ``ln_cross_attn`` to every block.
- ``models/gpt_bigcode/modeling_gpt_bigcode.py``: ``nn.Linear`` projections; multi-query
  attention by default (``multi_query``: one K/V head), so ``c_attn`` is ``(h + 2d, h)``.
"""

from __future__ import annotations

from memest.sources.config import HFConfig
from memest.sources.families._build import (
    ATTN,
    MLP,
    conv1d,
    linear,
    lm_head,
    model_spec,
    norm,
    token_embedding,
)
from memest.spec import AttentionSpec, BufferSpec, Component, LayerSpec, MLPSpec, ModelSpec, Split, TensorSpec

_ALIASES = {
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}
# transformers config-class defaults (configuration_<type>.py) of the fields read here
_DEFAULTS: dict[str, dict[str, object]] = {
    "gpt2": {
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_inner": None,
        "activation_function": "gelu_new",
        "add_cross_attention": False,
        "tie_word_embeddings": True,
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
    },
    "gpt_bigcode": {
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_inner": None,
        "activation_function": "gelu_pytorch_tanh",
        "multi_query": True,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
    },
}


def build(cfg: HFConfig) -> ModelSpec:
    """ModelSpec of a gpt2 / gpt_bigcode config (the ``...LMHeadModel`` / ``...ForCausalLM`` class)."""
    model_type = cfg.model_type
    cfg = cfg.with_defaults(_DEFAULTS[model_type], aliases=_ALIASES)
    h = cfg.int("n_embd")
    a = cfg.int("n_head")
    d = cfg.divide("n_embd", h, "n_head", a)
    inner = cfg.int("n_inner", default=4 * h)
    vocab = cfg.int("vocab_size")
    positions = cfg.int("n_positions")
    cross = cfg.bool("add_cross_attention")

    if model_type == "gpt2":
        k = a
        proj = conv1d
        attn = [*conv1d("attn.c_attn", h, 3 * h, ATTN, Split.COL), *conv1d("attn.c_proj", h, h, ATTN, Split.ROW)]
    else:
        k = 1 if cfg.bool("multi_query") else a
        proj = _linear
        attn = [
            *linear("attn.c_attn", h, h + 2 * k * d, ATTN, Split.COL, bias=True),
            *linear("attn.c_proj", h, h, ATTN, Split.ROW, bias=True),
        ]
    cross_tensors: list[TensorSpec] = []
    if cross:
        cross_tensors = [
            *proj("crossattention.c_attn", h, 2 * h, ATTN, Split.COL),
            *proj("crossattention.q_attn", h, h, ATTN, Split.COL),
            *proj("crossattention.c_proj", h, h, ATTN, Split.ROW),
            *norm("ln_cross_attn", h, bias=True),
        ]
    tensors = (
        *norm("ln_1", h, bias=True),
        *attn,
        *norm("ln_2", h, bias=True),
        *cross_tensors,
        *proj("mlp.c_fc", h, inner, MLP, Split.COL),
        *proj("mlp.c_proj", inner, h, MLP, Split.ROW),
    )
    layer = LayerSpec(
        attention=AttentionSpec(num_heads=a, num_kv_heads=k, head_dim=d, cross_attention=cross, rope="none"),
        mlp=MLPSpec(gated=False, intermediate_size=inner, activation=cfg.str("activation_function")),
        norm="layer",
        tensors=tensors,
    )
    tied = cfg.bool("tie_word_embeddings")
    return model_spec(
        cfg,
        hidden_size=h,
        vocab_size=vocab,
        layers=[layer] * cfg.int("n_layer"),
        embedding=[
            token_embedding("transformer.wte.weight", vocab, h),
            TensorSpec("transformer.wpe.weight", (positions, h), Component.EMBEDDING),
        ],
        head=[*norm("transformer.ln_f", h, bias=True), *([] if tied else lm_head(vocab, h))],
        tie_word_embeddings=tied,
        max_position_embeddings=positions,
        buffers=_buffers(model_type, positions),
    )


def _buffers(model_type: str, positions: int) -> tuple[BufferSpec, ...]:
    """GPT-BigCode's causal mask: ``GPTBigCodeModel.__init__`` keeps ``self.bias = nn.Buffer(torch.tril(
    torch.ones((n_positions, n_positions), dtype=torch.bool)), persistent=False)`` (transformers 5.24
    ``modeling_gpt_bigcode.py``): allocated with the model on every device, 64 MiB at 8192 positions."""
    if model_type != "gpt_bigcode":
        return ()
    return (BufferSpec("transformer.bias", (positions, positions), itemsize=1),)


def _linear(name: str, in_features: int, out_features: int, component: Component, split: Split) -> list[TensorSpec]:
    return linear(name, in_features, out_features, component, split, bias=True)
