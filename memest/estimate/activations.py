"""Activation memory of training: the tensors autograd keeps for backward, per token.

Symbols (see ``memest.estimate``): b micro-batch, s seq_len, h hidden_size, a heads, k KV heads,
d head_dim, i intermediate_size, V vocab, t tp. Byte sizes:

    c  the compute dtype (matmul outputs): 2 under bf16/fp16 and autocast, 4 in fp32
    r  the residual stream and the norms: the parameters' dtype (4 under autocast over fp32
       parameters, which is what ``amp`` means)
    m  a dropout mask element: 1 (CUDA ``native_dropout`` keeps a bool mask)

Every count below was read off autograd's saved tensors of the transformers 5.24 modules (the
``saved_tensors_hooks`` of a real forward; ``tests/test_training_cpu_measured.py`` re-measures
them) and, where noted, from the framework's source. What one layer keeps, per token:

- **RMSNorm** (transformers ``LlamaRMSNorm``, torchtune and torchtitan ``RMSNorm``): the fp32 copy
  of its input (4h, the input itself when r = 4), the fp32 rstd (4), and, when its weight trains,
  the normalized input at dtype r (r·h). **LayerNorm** (``native_layer_norm``): its input (r·h)
  and fp32 mean and rstd (8). Fused norms (Megatron / Transformer Engine): input and rstd only.
- **A norm's output** is kept by the linears that read it when they train: once (r·h) when they
  share it, once per linear (c·h each) under autocast, where every linear casts its own copy.
- **Attention**, flash / SDPA (``_scaled_dot_product_flash_attention``, flash-attn): Q and K after
  rotary, V ((a·d + 2·k·d)·c; K and V at a heads when repeated), the output (a·d·c; the output
  projection reads it as a view) and the fp32 logsumexp (4·a). **Eager**: Q, K and V repeated to
  a heads (3·a·d·c), the fp32 softmax of the s x s scores (4·a·s) and its c-byte copy (c·a·s,
  none in fp32), the dropout mask and output (m·a·s + c·a·s) when attention dropout > 0, and the
  contiguous copy the output projection reads (a·d·c).
- **Gated MLP** (SwiGLU, GeGLU): gate and up outputs, the activation's output, their product
  (4·i·c; the product only when the down projection trains). **Plain MLP**: the activation's input
  and output (2·i·c). Composite GELUs written in Python (``gelu_new``, ``gelu_fast``) keep four
  i-sized intermediates instead of one.
- **Dropout** on the residual branches: one mask per branch (2·m·h).
- **LoRA** (PEFT): a frozen linear keeps nothing; each adapted linear keeps its input cast to the
  adapter dtype (PEFT keeps adapters in fp32: 4 x its input width), the dropout mask when
  ``lora_dropout`` > 0, and A's output (4·r).
- **MoE**: the router's fp32 scores (4·E), each token's copies dispatched to and gathered from its
  top-k experts (2·topk·h·c) and the MLP tensors of top-k experts.

Tensors inside the tensor-parallel regions (Q/K/V, attention output, MLP intermediates) are divided
by t; norm inputs and outputs and dropout masks by t only with sequence parallelism (Korthikanti et
al. 2022, §4.2.2). For GPT-style layers with eager attention and dropout this reproduces their
34·s·b·h + 5·a·s²·b (§4.1) term by term.

Recompute: ``full`` keeps each layer's input (r·h) and rebuilds one layer at a time in backward;
``selective`` drops the eager s x s tensors (the attention core is recomputed); ``selective_op``
(torchtitan) keeps the layer input and the outputs of every other matmul and of the attention
kernel (``torchtitan/models/llama/parallelize_llama.py``, ``_save_list`` and its "every second
mm" rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.spec import Component, LayerSpec, Split, TensorSpec

COMPOSITE_GELUS = frozenset({"gelu_new", "gelu_fast", "quick_gelu", "gelu_accurate"})
"""Activations transformers implements as Python expressions (``activations.py``): autograd keeps
four i-sized intermediates of each (input, tanh output, and two products) instead of one input."""

LSE_BYTES = 4
"""The flash kernels' logsumexp: one fp32 per head and token."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraActivations:
    """What LoRA adapters add to a layer's saved tensors.

    Attributes:
        targets: Module names (the last component, ``q_proj``) that carry adapters.
        all_linear: True for PEFT ``all-linear``: every projection of the layer.
        rank: r.
        adapter_bytes: Bytes per element of the adapters' inputs (PEFT casts to fp32: 4).
        dropout: ``lora_dropout`` (0 keeps no mask).
    """

    targets: frozenset[str]
    all_linear: bool
    rank: int
    adapter_bytes: int = 4
    dropout: float = 0.0

    def adapts(self, tensor: TensorSpec) -> bool:
        """True when this linear weight carries an adapter."""
        if not tensor.is_linear_weight or len(tensor.shape) != 2:
            return False
        if self.all_linear:
            return True
        return tensor.module.rsplit(".", 1)[-1] in self.targets


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """How the forward runs, as far as its saved tensors go.

    Attributes:
        compute_bytes: c, bytes of matmul outputs.
        stream_bytes: r, bytes of the residual stream and norms (the parameters' dtype).
        autocast: torch.autocast over higher-precision parameters: each linear casts its input.
        eager: Eager attention (the s x s scores are stored).
        repeat_kv: K and V are repeated to num_heads before the attention kernel saves them.
        fused_norms: Norms save only their input and statistics (Megatron / Transformer Engine).
        lora: Adapters on a frozen base, or None when every weight trains.
        hidden_dropout: Residual-branch dropout probability.
        attention_dropout: Attention-probability dropout probability.
        mask_bytes: m, bytes of one dropout-mask element.
    """

    compute_bytes: int
    stream_bytes: int
    autocast: bool = False
    eager: bool = False
    repeat_kv: bool = False
    fused_norms: bool = False
    lora: LoraActivations | None = None
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    mask_bytes: int = 1


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes per token one layer keeps, split by how tensor parallelism divides them.

    Attributes:
        inside: Bytes inside tensor-parallel regions (divided by tp).
        outside: Bytes outside them (divided by tp only with sequence parallelism).
    """

    inside: float
    outside: float

    def per_rank(self, tp: int, sequence_parallel: bool) -> float:
        """Bytes per token on one TP rank."""
        return self.inside / tp + (self.outside / tp if sequence_parallel else self.outside)


def norm_bytes(kind: str, h: int, x: Execution, *, readers: int, weight_trains: bool) -> float:
    """Bytes per token one norm keeps, its output included when ``readers`` linears keep it.

    Args:
        kind: ``rms`` or ``layer``.
        h: Features normalized.
        x: The execution.
        readers: Linears that read the output and keep it for backward.
        weight_trains: The norm's own weight trains (it then keeps the normalized input).
    """
    r, c = x.stream_bytes, x.compute_bytes
    stats = 4 if kind == "rms" else 8
    if x.fused_norms or kind != "rms":
        kept = r * h + stats
    else:
        kept = 4 * h + stats + (r * h if weight_trains else 0)
    if readers:
        kept += readers * c * h if x.autocast else r * h
    return kept


def _input_bytes(readers: list[TensorSpec], width: int, x: Execution) -> tuple[int, float]:
    """(trained readers of a tensor, bytes per token the adapted ones add) for linears reading it."""
    lora = x.lora
    if lora is None:
        return len(readers), 0.0
    extra = 0.0
    kept = x.compute_bytes if x.autocast else lora.adapter_bytes  # autocast: lora_A reads a 16-bit cast
    for t in readers:
        if lora.adapts(t):
            extra += kept * width + kept * lora.rank
            if lora.dropout > 0:
                extra += x.mask_bytes * width
    return 0, extra


def _linears(layer: LayerSpec, component: Component, prefix: str = "") -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(input projections, output projections) of one block: column/KV-split vs row-split linears."""
    weights = [t for t in layer.tensors if t.component is component and t.is_linear_weight and len(t.shape) == 2
               and t.name.startswith(prefix)]
    ins = [t for t in weights if t.split in (Split.COL, Split.KV, Split.VOCAB)]
    outs = [t for t in weights if t.split is Split.ROW]
    return ins, outs


def layer_activations(layer: LayerSpec, *, hidden: int, seq_len: int, x: Execution,
                      selective: bool = False) -> LayerActivations:
    """Bytes per token one layer keeps for backward, without recompute.

    Args:
        layer: The layer.
        hidden: h, the model width.
        seq_len: s, the tokens each token attends to (eager attention stores s scores per head).
        x: The execution.
        selective: Megatron selective recompute: the eager s x s tensors are recomputed.
    """
    attn, mlp = layer.attention, layer.mlp
    c, h = x.compute_bytes, hidden
    inside = 0.0
    outside = 2 * x.mask_bytes * h if x.hidden_dropout > 0 else 0.0

    attn_in, attn_out = _linears(layer, Component.ATTENTION)
    mlp_component = Component.EXPERTS if mlp.is_moe and not _linears(layer, Component.MLP)[0] else Component.MLP
    mlp_in, mlp_out = _linears(layer, mlp_component)
    norm_trains = x.lora is None
    attn_readers, attn_extra = _input_bytes(attn_in, hidden, x)
    mlp_readers, mlp_extra = _input_bytes(mlp_in, hidden, x)
    if layer.parallel_residual:
        outside += norm_bytes(layer.norm, h, x, readers=attn_readers + mlp_readers, weight_trains=norm_trains)
    else:
        outside += norm_bytes(layer.norm, h, x, readers=attn_readers, weight_trains=norm_trains)
        outside += norm_bytes(layer.norm, h, x, readers=mlp_readers, weight_trains=norm_trains)
    inside += attn_extra + mlp_extra

    if attn.kind in ("gqa", "mla"):
        a, k, d, dv = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.v_head_dim
        if attn.kind == "mla":
            # compressed q/kv latents read by the up-projections, then full-width q, k, v
            inside += ((attn.q_lora_rank or 0) + attn.kv_lora_rank + attn.qk_rope_head_dim) * c
            k = a
        out_readers, out_extra = _input_bytes(attn_out, a * dv, x)
        inside += out_extra
        blocks = 2 if attn.cross_attention else 1
        if x.eager:
            probs = 0.0 if selective else _eager_probs(a, seq_len, x)
            inside += blocks * ((2 * a * d + a * dv) * c + probs + (a * dv * c if out_readers else 0))
        else:
            kv = a if x.repeat_kv else k
            inside += blocks * ((a * d + kv * d + kv * dv + a * dv) * c + LSE_BYTES * a)
        if attn.cross_attention:
            outside += norm_bytes(layer.norm, h, x, readers=1 if x.lora is None else 0, weight_trains=norm_trains)
    elif attn.kind == "mamba":
        # seed: the mixer's in_proj output (2 x d_inner = 4h), conv and SSM inputs; not yet traced
        inside += 6 * h * c

    down_readers, down_extra = _input_bytes(mlp_out, mlp.intermediate_size, x)
    per_mlp = _mlp_bytes(mlp.gated, mlp.activation, mlp.intermediate_size, c, keep_product=down_readers > 0) + down_extra
    if mlp.is_moe:
        inside += mlp.num_experts_per_tok * per_mlp
        outside += 4 * mlp.num_experts + 2 * mlp.num_experts_per_tok * h * c
        if mlp.num_shared_experts:
            inside += _mlp_bytes(mlp.gated, mlp.activation, mlp.shared_intermediate_size, c, keep_product=down_readers > 0)
    else:
        inside += per_mlp
    return LayerActivations(inside=inside, outside=outside)


def _eager_probs(a: int, s: int, x: Execution) -> float:
    """Bytes per token of eager attention's s x s tensors: fp32 softmax, its cast, dropout."""
    c = x.compute_bytes
    kept = 4 * a * s
    if x.attention_dropout > 0:
        kept += x.mask_bytes * a * s + c * a * s
    elif c < 4:
        kept += c * a * s
    return kept


def _mlp_bytes(gated: bool, activation: str, i: int, c: int, *, keep_product: bool) -> float:
    """Bytes per token of one MLP's intermediates (see the module docstring)."""
    act_inputs = 4 if activation in COMPOSITE_GELUS else 1
    if gated:
        # gate output (activation input), activation output, up output, product (read by down)
        return (act_inputs + 2 + (1 if keep_product else 0)) * i * c
    return (act_inputs + (1 if keep_product else 0)) * i * c


def selective_op_bytes(layer: LayerSpec, *, hidden: int, x: Execution) -> LayerActivations:
    """Bytes per token one layer keeps under torchtitan's ``selective_ac_option = "op"``.

    The layer input (r·h), then the outputs of the odd-numbered matmuls in call order (wq, wv, w1,
    w2 for a Llama layer: a·d, k·d, i, h elements) and of the attention kernel (a·d + fp32
    logsumexp); everything else is recomputed in backward.
    """
    c = x.compute_bytes
    attn = layer.attention
    attn_in, attn_out = _linears(layer, Component.ATTENTION)
    mlp_in, mlp_out = _linears(layer, Component.MLP)
    # call order of a Llama block: wq, wk, wv, wo, then w2(silu(w1(x)) * w3(x)) runs w1, w3, w2
    matmuls = [*attn_in, *attn_out, *mlp_in, *mlp_out]
    saved = sum(t.shape[0] for n, t in enumerate(matmuls) if n % 2 == 0)  # the 1st, 3rd, 5th, ...
    inside = saved * c + attn.num_heads * attn.v_head_dim * c + LSE_BYTES * attn.num_heads
    return LayerActivations(inside=inside, outside=x.stream_bytes * hidden)


def backward_transient(layer: LayerSpec, *, seq_len: int, x: Execution) -> LayerActivations:
    """Bytes per token of the gradients one layer's backward holds beyond its saved tensors.

    The MLP's: the product's gradient and the two gradients of its inputs while the activation's
    input and output and the up output are still alive: 2·i·c net of a gated MLP whose down
    projection kept the product (freed by then), 3·i·c when it kept none (a frozen down projection
    under LoRA); a plain MLP: one i-sized gradient. Eager
    attention's: the gradients of the probabilities and the fp32 scores, less what is freed by then
    ((4 + c)/2·a·s net; measured 4·a·s in fp32 and 2.7·a·s in bf16). The larger of the two sets the layer's backward peak (measured on the CPU within 3%,
    ``tests/test_training_cpu_measured.py``).
    """
    c = x.compute_bytes
    mlp = layer.mlp
    width = mlp.intermediate_size * (mlp.num_experts_per_tok or 1)
    _, down = _linears(layer, Component.EXPERTS if mlp.is_moe and not _linears(layer, Component.MLP)[0] else Component.MLP)
    product_kept = x.lora is None or any(x.lora.adapts(t) for t in down)
    mlp_part = ((2 if product_kept else 3) if mlp.gated else 1) * width * c
    attn = layer.attention
    attn_part = (4 + c) / 2 * attn.num_heads * seq_len if x.eager and attn.kind == "gqa" else 0.0
    return LayerActivations(inside=max(mlp_part, attn_part), outside=0.0)


def embedding_bytes(has_norm: bool, hidden: int, x: Execution) -> float:
    """Bytes per token the embeddings keep: their LayerNorm (BERT) and dropout mask."""
    kept = 0.0
    if has_norm:
        kept += norm_bytes("layer", hidden, x, readers=0, weight_trains=x.lora is None)
    if x.hidden_dropout > 0:
        kept += x.mask_bytes * hidden
    return kept
