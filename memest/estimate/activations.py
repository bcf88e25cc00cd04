"""Activation memory of training: the tensors autograd keeps for backward, listed one by one.

A layer's saved tensors are a list of :class:`Saved` entries (bytes per token each), built from the
layer's facts (:class:`~memest.spec.LayerSpec`) and how the forward runs (:class:`Execution`, with
LoRA adapters :class:`LoraActivations`), following the transformers 5.24 module code; recompute
(``full``, ``selective``, ``selective_op``) picks what stays. The lists are remembered
(:mod:`memest.memo`). Symbols, the per-block counts and their sources: DESIGN.md, "Training:
activations".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from memest import lora_targets
from memest.estimate.runtime import cuda_block_bytes
from memest.memo import remembered
from memest.spec import Component, LayerSpec, Split, TensorSpec

COMPOSITE_GELUS = frozenset({"gelu_new", "gelu_fast", "quick_gelu", "gelu_accurate"})
"""Activations transformers implements as Python expressions (``activations.py``): autograd keeps
four i-sized intermediates of each (input, tanh output, and two products) instead of one input."""

LSE_BYTES = 4
"""The flash kernels' logsumexp: one fp32 per head and token."""

ROUTE_BYTES = 4 * 8 + 2 * 4
"""MoE bookkeeping per token and routed expert (transformers 5.24 ``grouped_mm`` experts): int64 top-k
indices, sort permutation, ``perm // topk`` and inverse permutation; fp32 routing weights and their
gathered copy."""


COMPILED_RULES = """What inductor's partitioner saves between a compiled layer's forward and backward.

torch 2.13.0 ``torch/_functorch/partitioners.py`` ``min_cut_rematerialization_partition`` saves a minimum cut of
the joint graph, by bytes, under ``should_ban_recomputation``: a matmul or attention kernel is never recomputed
(not in the recomputable allowlist), nor is a value a non-fusible op of the backward reads
(``is_materialized_backwards``: the inputs of the weight-gradient matmuls), nor a reduction 4x smaller than
its input (``ban_recompute_reductions``: a norm's rstd). Pointwise chains are recomputed from the cheapest
saved values. For a pre-norm Llama layer (RMSNorm with its fp32 upcast, rotary, SDPA / flash attention,
SwiGLU) that is, per token:

- each RMSNorm: its input in the residual stream's dtype (r·h: the layer's input; for the second norm the
  output projection's output, from which the residual is re-added) and its fp32 rstd (4 B), instead of
  eager's fp32 upcast (4·h) and normalized input (r·h); its output (c·h) only when a matmul reads it in
  backward (a trained linear or an adapter);
- the attention block as eager's flash path: q and k after rotary, v, the kernel's output and logsumexp;
- a gated MLP: the gate and up projections' outputs (c·i each) and, when the down projection trains or
  carries an adapter, its input (c·i): the activation's output (SiLU(gate)) is recomputed;
  a composite GELU keeps only its input.

Measured on the CPU (``benchmarks/compile_measure.py``, ``benchmarks/compile_findings.md``): a
bf16 layer with h 256, i 640, 8 heads, 2 KV heads keeps 10,536 B per token eager and 7,208 B compiled in
full training, 7,752 and 5,448 B under LoRA (q, v adapters), as this rule gives. Under activation
checkpointing each layer keeps its input and its rebuild in backward is the compiled layer's saved set.
Eager attention's s x s tensors and the backward's gradients are taken as eager's."""


FLOAT8_RULES = """What torchao float8 training saves (torchao 0.18.0 ``torchao/float8/float8_linear.py``).

``matmul_with_hp_or_float8_args.forward`` saves the high-precision input and weight
(``ctx.save_for_backward(input_hp, weight_hp_t)``) and its backward casts them to float8 again (for the
grad-weight matmul, along the other axis under rowwise): eager float8 saves what a bf16 linear saves. Under
torch.compile the backward's casts are graph ops reading the high-precision input through fusible ops (abs,
amax, scale, clamp, convert), so that input is no longer materialized in backward
(:data:`COMPILED_RULES`) and is recomputed where it is a pointwise function of saved tensors: the norms'
outputs (from the saved residual and rstd) and the down projection's input (from the gate and up outputs)
are not saved at all. The attention output, an attention kernel's output, is saved for that kernel's
backward and its float8 cast for the output projection's grad-weight matmul (1 B per element) beside it.
The partition of a bf16 Llama layer (h 256, i 640, 8 heads, 2 KV heads) listed by
``benchmarks/compile_measure.py --list-partition`` keeps exactly that under both recipes, plus per-tensor
(tensorwise) or per-column (rowwise) amax scalars, no per-token bytes; eager, the layer measured 10,536 B
per token under both, as bf16 (``benchmarks/compile_findings.md``). Dynamic scaling keeps no amax
history (torchao removed delayed scaling)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraActivations:
    """What LoRA adapters add to a layer's saved tensors.

    Attributes:
        targets: PEFT ``target_modules`` (:func:`memest.lora_targets.peft_target_modules`: ``q_proj``,
            ``attn.c_proj``); a linear carries an adapter when PEFT matches its module against them.
        all_linear: True for PEFT ``all-linear``: every projection of the layer.
        rank: r.
        adapter_bytes: Bytes per element of the adapters' inputs (PEFT casts to fp32: 4).
        dropout: ``lora_dropout`` (0 keeps no mask).
        megatron: NeMo's ``ParallelLinearAdapter`` on Megatron-core linears (:func:`_megatron_adapters`), not
            PEFT's ``lora_A`` / ``lora_B``.
    """

    targets: tuple[str, ...]
    all_linear: bool
    rank: int
    adapter_bytes: int = 4
    dropout: float = 0.0
    megatron: bool = False

    def adapts(self, tensor: TensorSpec) -> bool:
        """True when this linear weight carries an adapter."""
        if not tensor.is_linear_weight or len(tensor.shape) != 2:
            return False
        if self.all_linear:
            return True
        return lora_targets.peft_matches(tensor.module, self.targets)


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """How the forward runs, as far as its saved tensors go.

    Attributes:
        compute_bytes: c, bytes of matmul outputs.
        stream_bytes: r, bytes of the residual stream and norms (the parameters' dtype).
        autocast: torch.autocast over higher-precision parameters: each linear casts its input.
        eager: Eager attention (the s x s scores are stored): asked for, or the only path transformers
            has for the family (``ModelSpec.sdpa_supported``).
        repeat_kv: K and V are repeated to num_heads before the attention kernel saves them.
        fused_norms: Norms save only their input and statistics (Megatron / Transformer Engine).
        lora: Adapters on a frozen base, or None when every weight trains.
        hidden_dropout: Residual-branch dropout probability.
        attention_dropout: Attention-probability dropout probability.
        mask_bytes: m, bytes of one dropout-mask element.
        routing_bytes: Bytes of an MoE routing weight, and so of the weighted expert outputs and their
            gradients (4 where the router returns fp32 weights: Mixtral, DeepSeek; else c).
        quantized_outputs: The dense MLP's linears are bitsandbytes ``Linear4bit`` (QLoRA), which cast
            their input to the compute dtype and their output back to the input's dtype
            (``bitsandbytes/nn/modules.py`` ``Linear4bit.forward``, 0.43): the MLP's intermediates
            and their gradients take the residual stream's dtype r (fp32 when the norms' weights are
            fp32, :class:`memest.workload.KbitPrep`). Their ``MatMul4Bit`` keeps only the quantized
            weight for backward (``bitsandbytes/autograd/_functions.py``), never the input.
        saves_4bit_inputs: bitsandbytes 0.42's ``MatMul4Bit.forward`` sets ``ctx.tensors = (A, B)``
            (tag 0.42.0, commit 4870580, ``autograd/_functions.py``; 0.43.2 keeps ``(None, B)``, commit
            9e75374, #1270 "fix QLoRA mem bug: delete useless buffered activation"): every 4-bit linear
            keeps its input for backward whenever it needs a gradient, as a trained linear would. An
            attribute of ``ctx``, not a ``save_for_backward`` variable, it outlives the node's backward
            (:attr:`Saved.graph_held`). litgpt pins ``bitsandbytes==0.42.0`` (``pyproject.toml``, commit
            00af8b0).
        fused_gelu: The model code is litgpt's: its ``GptNeoxMLP`` / ``GemmaMLP`` call
            ``torch.nn.functional.gelu(x, approximate=config.gelu_approximate)`` (``litgpt/model.py``,
            commit 00af8b0; phi-2's config sets ``gelu_approximate="tanh"``), one op where transformers'
            ``NewGELUActivation`` composes five.
        litgpt_attention: litgpt's ``CausalSelfAttention`` and ``LoRAQKVLinear`` (``litgpt/model.py``,
            ``litgpt/lora.py`` at commit 00af8b0), whatever the checkpoint's layout: one fused ``attn``
            linear; under MHA Q, K, V are views of its output (``qkv.view(...).permute(...).split``, a
            ``reshape`` that merges a size-1 dim) and the V view kept by the attention keeps the whole
            output; under GQA / MQA K and V are ``expand``-ed to n_head and copied by ``reshape``; one LoRA
            dropout for the fused linear (``F.linear(self.lora_dropout(x), self.lora_A)``); with some of
            q, k, v adapted, ``zero_pad``'s ``index_copy_`` keeps its source (the adapted outputs); a gated
            MLP is two linears (``LLaMAMLP`` ``fc_1``, ``fc_2``), each adapter with its own dropout, where the
            checkpoint fuses ``gate_up_proj``; no residual or attention dropout.
        unsloth_kernels: unsloth patched the decoder layers with its own autograd functions (its
            ``get_peft_model`` with ``lora_dropout=0``): a layer every linear of which carries an adapter
            keeps only what they save (:func:`_unsloth_layer`).
        compiled: The layers run under torch.compile (inductor; :data:`COMPILED_RULES`).
        float8: torchao float8 training of the trained linears: ``none``, ``tensorwise`` or ``rowwise``
            (:data:`FLOAT8_RULES`).
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
    routing_bytes: int = 2
    quantized_outputs: bool = False
    saves_4bit_inputs: bool = False
    fused_gelu: bool = False
    litgpt_attention: bool = False
    unsloth_kernels: bool = False
    compiled: bool = False
    float8: str = "none"

    @property
    def float8_compiled(self) -> bool:
        """The trained linears are torchao float8 linears under torch.compile: their backward recasts its
        inputs from the recomputed high-precision input (:data:`FLOAT8_RULES`)."""
        return self.compiled and self.float8 != "none" and self.lora is None

    def activation(self, name: str) -> str:
        """The MLP activation as the model code runs it: a composite GELU (``gelu_new`` ...) is one
        ``gelu(approximate="tanh")`` op, keeping only its input, under :attr:`fused_gelu`."""
        return "gelu" if self.fused_gelu and name in COMPOSITE_GELUS else name

    @property
    def mlp_bytes(self) -> int:
        """Bytes of a dense MLP's intermediates: r behind bitsandbytes 4-bit linears, else c."""
        return self.stream_bytes if self.quantized_outputs else self.compute_bytes


@dataclass(frozen=True, slots=True)
class Saved:
    """One tensor autograd keeps for backward, per token.

    Attributes:
        what: What it is (``"q after rotary"``).
        width: Bytes per token (per sequence position of each sequence), on one unsplit rank.
        inside: True inside a tensor-parallel region (divided by tp), else divided by tp only with
            sequence parallelism.
        block: ``attention`` or ``mlp`` for the tensors those blocks make, else empty.
        kept: False for a forward temporary autograd does not keep (counted in a checkpointed
            forward's working set only).
        graph_held: Held as an attribute of its autograd node's ``ctx`` (bitsandbytes 0.42
            ``MatMul4Bit``'s ``ctx.tensors``), not as a ``save_for_backward`` variable: the engine's
            ``release_variables`` after the node's backward frees only saved variables, so the
            tensor lives as long as the graph does (the training loop's references to the loss and
            logits: :func:`memest.estimate.training.activation_terms._previous_microbatch`).
    """

    what: str
    width: float
    inside: bool = True
    block: str = ""
    kept: bool = True
    graph_held: bool = False


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """What one layer keeps, per token, split by how tensor parallelism divides it.

    Attributes:
        inside: Bytes inside tensor-parallel regions (divided by tp).
        outside: Bytes outside them (divided by tp only with sequence parallelism).
        tensors: The saved tensors they add up from.
        forward_extra: Eager attention: bytes per token alive at the forward's softmax that autograd
            does not keep (the masked scores it reads, in the compute dtype, and their fp32 copy:
            ``softmax(x, dtype=float32)`` converts first for bf16, ``aten/src/ATen/native/SoftMax.cpp``).
        after_scores: Eager attention: saved bytes per token the layer makes after that softmax
            (its cast included).
        forward_working: Bytes per token a checkpointed forward of the layer (whose saved tensors are
            dropped) holds at its peak: the larger block's tensors (the MLP's intermediates, or the
            attention's up to its softmax with the eager extras), beside the layer's input.
        recompute_extra: Bytes per token the recomputation of the layer in backward holds beyond
            what it rebuilds (its forward temporaries: the eager extras at the softmax, before the
            rest of the layer is rebuilt; gpt-oss's per-route biases).
    """

    inside: float
    outside: float
    tensors: tuple[Saved, ...] = field(default=(), compare=False)
    forward_extra: float = 0.0
    after_scores: float = 0.0
    forward_working: float = 0.0
    recompute_extra: float = 0.0

    def per_rank(self, tp: int, sequence_parallel: bool) -> float:
        """Bytes per token on one TP rank."""
        return self.inside / tp + (self.outside / tp if sequence_parallel else self.outside)

    def block_bytes(self, tokens: int, tp: int, sequence_parallel: bool, *, graph_held: bool = False) -> int:
        """Bytes on one TP rank for ``tokens`` tokens as the CUDA caching allocator counts them: each
        tensor in its own block (:func:`memest.estimate.runtime.cuda_block_bytes`); with ``graph_held``
        only those an autograd node holds past its backward (:attr:`Saved.graph_held`)."""
        total = 0
        for t in self.tensors:
            if graph_held and not t.graph_held:
                continue
            div = tp if t.inside or sequence_parallel else 1
            total += cuda_block_bytes(math.ceil(t.width * tokens / div))
        return total


def _total(tensors: Iterable[Saved], forward_extra: float = 0.0, recompute_grads: float = 0.0) -> LayerActivations:
    everything = tuple(t for t in tensors if t.width)
    temporaries = sum(t.width for t in everything if not t.kept)
    # the temporaries are alive before the kept tensors listed after the last of them are made
    last = max((n for n, t in enumerate(everything) if not t.kept), default=len(everything))
    not_yet = sum(t.width for t in everything[last + 1:] if t.kept)
    tensors = tuple(t for t in everything if t.kept)
    inside = sum(t.width for t in tensors if t.inside)
    outside = sum(t.width for t in tensors if not t.inside)
    # the forward's softmax: the first of the scores' tensors (its cast and dropout come after)
    scores = [n for n, t in enumerate(tensors) if t.what.startswith(SCORES)]
    after = sum(t.width for t in tensors[scores[0] + 1:]) if scores and forward_extra else 0.0
    # a checkpointed forward holds the attention's tensors through the softmax's cast (in locals)
    attention = sum(t.width for t in (tensors[:scores[-1] + 1] if scores else tensors) if t.block == "attention")
    mlp = sum(t.width for t in tensors if t.block == "mlp") + temporaries
    return LayerActivations(inside=inside, outside=outside, tensors=tensors, forward_extra=forward_extra,
                            after_scores=after, forward_working=max(attention + forward_extra, mlp),
                            recompute_extra=recompute_grads + max(forward_extra - after, temporaries - not_yet, 0.0))


# ---- norms and the tensors linears read ----


def _norm(kind: str, width: int, x: Execution, *, weight_trains: bool, rows: int = 1, what: str = "norm",
          inside: bool = False, keep_input: bool = True) -> list[Saved]:
    """What one norm over ``width`` features keeps besides its output (see the module docstring).

    Args:
        kind: ``rms``, ``rms_fp32`` or ``layer``.
        width: Features normalized per token (all ``rows`` together).
        x: The execution.
        weight_trains: The norm's weight trains (it then keeps the normalized input).
        rows: Normalized rows per token (heads, for a per-head QK-norm): one statistic each.
        what: Its name.
        inside: Inside a tensor-parallel region.
        keep_input: False for a LayerNorm whose input another norm already keeps.
    """
    r = x.stream_bytes
    if x.compiled and not x.fused_norms and kind != "layer":  # COMPILED_RULES: the fp32 copies are recomputed
        return [*([Saved(f"{what} input", r * width, inside)] if keep_input else []),
                Saved(f"{what} rstd", 4 * rows, inside)]
    if x.fused_norms or kind == "layer":
        stats = 8 if kind == "layer" else 4
        return [*([Saved(f"{what} input", r * width, inside)] if keep_input else []),
                Saved(f"{what} mean/rstd", stats * rows, inside)]
    out = [Saved(f"{what} fp32 input", 4 * width, inside), Saved(f"{what} rstd", 4 * rows, inside)]
    if weight_trains:
        out.append(Saved(f"{what} normalized", (4 if kind == "rms_fp32" else r) * width, inside))
    return out


def _read(what: str, width: int, readers: list[TensorSpec], x: Execution, *, trains: bool = True,
          inside: bool = False, itemsize: int | None = None, needs_grad: bool = True,
          held: bool = False) -> list[Saved]:
    """What the linears ``readers`` keep of a ``width``-wide input (the module docstring's rule).

    Args:
        what: The input's name.
        width: Its features per token.
        readers: The linear weights that read it.
        x: The execution.
        trains: False when none of the readers' weights trains (besides LoRA adapters).
        inside: The input is inside a tensor-parallel region.
        itemsize: Bytes of its elements; None = r (a norm's output, the residual stream).
        needs_grad: False when the input needs no gradient (a block before any adapter).
        held: The input is kept already by the op that made it (the attention kernel's output).
    """
    if not readers:
        return []
    lora = x.lora
    size = x.stream_bytes if itemsize is None else itemsize
    cast = x.autocast and size != x.compute_bytes  # autocast casts an fp32 input for every linear
    if lora is None:
        if not trains:
            return []
        if x.float8_compiled and itemsize is None:  # FLOAT8_RULES: a norm's output, recomputed and recast
            return []
        if cast and x.compiled:  # inductor makes the autocast copy once for all its readers
            return [Saved(f"{what} (autocast copy)", x.compute_bytes * width, inside)]
        if cast:
            return [Saved(f"{what} ({t.module} autocast copy)", x.compute_bytes * width, inside) for t in readers]
        return [Saved(what, size * width, inside)]
    if lora.megatron:
        return _megatron_adapters(what, width, readers, x, inside, size, held)
    out: list[Saved] = []
    joined: list[TensorSpec] = []  # adapted readers whose input copy another reader's adapter already made
    if x.litgpt_attention:  # one LoRAQKVLinear for q, k, v: one dropout, one copy of its input
        joined = [t for t in readers if t.component is Component.ATTENTION and t.split in (Split.COL, Split.KV)
                  and lora.adapts(t)][1:]
        # its gated MLP is two LoRALinears (LLaMAMLP fc_1, fc_2) where the checkpoint fuses gate_up (Phi-3)
        readers += [t for t in readers if t.component is Component.MLP and t.module.endswith("gate_up_proj")
                    and lora.adapts(t)]
    if x.saves_4bit_inputs and needs_grad:
        # bitsandbytes 0.42 MatMul4Bit keeps its (compute-dtype) input: one tensor for all readers
        c = x.compute_bytes
        out.append(Saved(what, size * width, inside, graph_held=True) if size == c
                   else Saved(f"{what} (Linear4bit compute-dtype copy)", c * width, inside, graph_held=True))
    shared = not cast and size == (x.compute_bytes if x.autocast else lora.adapter_bytes) and lora.dropout == 0
    for t in readers:
        if not lora.adapts(t):
            continue
        if t in joined:  # its lora_A rows are the joined adapter's: only their output (r per projection)
            pass
        elif shared:
            if not any(s.what == what for s in out):
                out.append(Saved(what, size * width, inside))
        elif x.autocast:  # lora_A(dropout(x)): autocast's copy of (dropout's output of) the input
            out.append(Saved(f"{what} ({t.module} lora_A autocast copy)", x.compute_bytes * width, inside))
        else:
            out.append(Saved(f"{what} ({t.module} adapter-dtype copy)", lora.adapter_bytes * width, inside))
        if lora.dropout > 0 and not shared and t not in joined:
            out.append(Saved(f"{what} ({t.module} lora dropout mask)", x.mask_bytes * width, inside))
        # lora_B keeps A's output: at the compute dtype under autocast, else the adapters'
        out.append(Saved(f"{t.module} lora_A output", (x.compute_bytes if x.autocast else lora.adapter_bytes) * lora.rank,
                         inside))
    return out


def _megatron_adapters(what: str, width: int, readers: list[TensorSpec], x: Execution, inside: bool,
                       size: int, held: bool) -> list[Saved]:
    """What NeMo's LoRA keeps of a ``width``-wide input read by ``readers`` (NeMo 8cfedd72
    ``nemo/collections/llm/peft/lora.py`` ``LoRALinear.forward``: ``adapter(layernorm_output)`` beside the frozen
    base linear; ``peft/utils.py`` ``ParallelLinearAdapter.forward``: ``dropout`` (position ``pre``), ``linear_in``,
    identity activation, ``linear_out``, scale).

    One adapter per Megatron linear: the readers of one input in one block are one fused linear (``linear_qkv``
    for q, k, v; ``linear_fc1`` for gate and up), the others ``linear_proj`` and ``linear_fc2`` (``LoRA``'s
    default ``target_modules``).

    - The input, once: the tensor Megatron's linear reads (``layernorm_output`` of the fused
      ``TELayerNormColumnParallelLinear``, or the row-parallel linear's split input), which the adapter's
      ``linear_in`` keeps for its weight gradient, as a trained linear keeps it (the frozen base needs none);
      nothing more when the op that made it keeps it already (``held``: the attention kernel's output).
      With ``dropout`` > 0 each adapter keeps its dropout's output and mask.
    - Per adapter, ``linear_out``'s input: ``linear_in``'s r-wide output, whole on every rank (a column-parallel
      ``linear_in`` has ``gather_output=True``; a row-parallel one all-reduces), at the compute dtype (the adapters
      are cast to the model's bf16).

    Sequence parallelism (``gather_from_sequence_parallel_region`` before a column-parallel ``linear_in``) is not
    modelled apart: the gathered input is counted split like the rest.
    """
    lora = x.lora
    assert lora is not None
    linears = sorted({t.component.value for t in readers if lora.adapts(t)})  # one Megatron linear per block
    if not linears:
        return []
    c = x.compute_bytes
    out: list[Saved] = []
    if lora.dropout > 0:
        for name in linears:
            out += [Saved(f"{what} ({name} adapter dropout output)", c * width, inside),
                    Saved(f"{what} ({name} adapter dropout mask)", x.mask_bytes * width, inside)]
    elif not held:
        out.append(Saved(what, size * width, inside))
    out += [Saved(f"{what} ({name} adapter linear_in output)", c * lora.rank, False) for name in linears]
    return out


def _linears(layer: LayerSpec, component: Component, prefix: str = "") -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(input projections, output projections) of one block: column/KV-split vs row-split linears
    (2-D weights and 3-D expert stacks)."""
    weights = [t for t in layer.tensors if t.component is component and t.is_linear_weight and t.name.startswith(prefix)]
    ins = [t for t in weights if t.split in (Split.COL, Split.KV, Split.VOCAB)]
    outs = [t for t in weights if t.split is Split.ROW]
    return ins, outs


def _routers(layer: LayerSpec) -> list[TensorSpec]:
    return [t for t in layer.tensors if t.component is Component.ROUTER and len(t.shape) == 2
            and t.name.endswith("weight") and t.shape[0] == layer.mlp.num_experts]


# ---- attention ----


def _attention(layer: LayerSpec, x: Execution, seq_len: int, selective: bool, input_readers: list[TensorSpec],
               input_what: str, input_width: int, active: bool = True, input_grad: bool = True) -> list[Saved]:
    """The attention block's saved tensors, its input as its projections keep it included; when
    nothing in it needs a gradient (``active`` False) only the adapters' inputs. ``input_grad``: the
    block's input needs a gradient (bitsandbytes 0.42 ``MatMul4Bit`` keeps it only then:
    ``if any(ctx.needs_input_grad[:2])``, :attr:`Execution.saves_4bit_inputs`)."""
    attn = layer.attention
    c = x.compute_bytes
    trains = x.lora is None
    attn_in, attn_out = _linears(layer, Component.ATTENTION)
    if not active:
        return (_read(input_what, input_width, input_readers, x, needs_grad=False)
                + _read("attention output", attn.num_heads * attn.v_head_dim, attn_out, x, trains=False, inside=True,
                        held=True,
                        itemsize=c, needs_grad=False))
    if attn.kind == "mla":
        # the compressing projections read the block's input; q_b / kv_b read their latents' norms
        by_name = {t.module.rsplit(".", 1)[-1]: t for t in layer.tensors
                   if t.component is Component.ATTENTION and t.is_linear_weight}
        readers = [by_name[n] for n in ("q_proj", "q_a_proj", "kv_a_proj_with_mqa") if n in by_name]
        return _read(input_what, input_width, readers if input_readers else [], x) + _mla(layer, x, by_name, attn_out)
    if attn.kind == "mamba":
        # seed: the mixer's in_proj output (2 x d_inner = 4h), conv and SSM inputs; not yet traced
        return _read(input_what, input_width, input_readers, x) + [Saved("mamba mixer", 6 * input_width * c)]
    if attn.kind != "gqa":
        return _read(input_what, input_width, input_readers, x)
    a, k, d, dv = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.v_head_dim
    adapted = [t for t in attn_in if x.lora is not None and x.lora.adapts(t)]
    out = _read(input_what, input_width, input_readers, x, needs_grad=input_grad)
    if x.litgpt_attention and adapted and len(adapted) < len(attn_in):
        out.append(Saved("zero_pad's index_copy_ source (the adapted q / k / v LoRA outputs)",
                         sum(t.shape[0] for t in adapted) * c))
    blocks = 2 if attn.cross_attention else 1
    for norm_name, heads in (("q_norm", a), ("k_norm", k)):
        if attn.qk_norm != "none":
            out += _norm(layer.norm, heads * d, x, weight_trains=trains, rows=heads if attn.qk_norm == "head" else 1,
                         what=norm_name, inside=True)
    out_readers = attn_out
    if x.eager:
        for _ in range(blocks):
            out += [Saved("q (scores matmul copy)", a * d * c), Saved("K at num_heads", a * d * c),
                    Saved("V at num_heads", a * dv * c)]
            if not selective:
                out += _eager_scores(attn, seq_len, x)
            out += _read("attention output (contiguous copy)", a * dv, out_readers, x, inside=True, itemsize=c)
        return out
    kv = a if x.repeat_kv or (x.litgpt_attention and k != a) else k
    # litgpt: the V view keeps the fused output under MHA; expanded K, V are copies under GQA / MQA
    fused = k == a if x.litgpt_attention else len(attn_in) == 1
    for _ in range(blocks):
        if fused and attn.rope == "none" and attn.qk_norm == "none":
            out.append(Saved("fused QKV output (Q, K, V are views)", (a * d + kv * d + kv * dv) * c))
        else:
            if fused:
                out.append(Saved("fused QKV output (alive through the V view)", (a * d + 2 * k * d) * c))
            out += [Saved("q after rotary / QK-norm", a * d * c), Saved("k after rotary / QK-norm", kv * d * c)]
            if not fused:
                out.append(Saved("v", kv * dv * c))
        out += [Saved("attention output", a * dv * c), Saved("logsumexp (fp32)", LSE_BYTES * a)]
        flash = d == dv and c < 4
        if attn.rope == "concat" and flash:
            out += _read("attention output (contiguous copy)", a * dv, out_readers, x, inside=True, itemsize=c)
        else:  # the output projection reads the kernel's output as a view (kept above) or adapts it
            out += _read("attention output", a * dv, out_readers, x, trains=False, inside=True, itemsize=c, held=True)
            if x.float8_compiled and out_readers:  # beside the kernel's output its backward reads
                out.append(Saved("attention output (float8 cast)", a * dv, True))
    return out


SCORES = "scores: "
"""The name prefix of eager attention's s x s tensors."""


def _eager_scores(attn, s: int, x: Execution) -> list[Saved]:
    """Eager attention's s x s tensors per token: the softmax (and its copies), soft-capping, dropout."""
    a, c = attn.num_heads, x.compute_bytes
    if attn.sinks:  # GptOss eager_attention_forward: softmax in the scores' dtype over s + 1 columns
        return [Saved(SCORES + "softmax with sinks", c * a * (s + 1)), Saved(SCORES + "max indices (int64)", 8 * a)]
    out = [Saved(SCORES + "softmax (fp32)", 4 * a * s)]
    if attn.logit_softcapping:
        out.append(Saved(SCORES + "soft-capping tanh", c * a * s))
    if x.attention_dropout > 0:
        out += [Saved(SCORES + "attention dropout mask", x.mask_bytes * a * s),
                Saved(SCORES + "attention dropout output", c * a * s)]
    elif c < 4:
        out.append(Saved(SCORES + "softmax cast to the compute dtype", c * a * s))
    return out


def _eager_forward_extra(attn, s: int, x: Execution) -> float:
    """Bytes per token eager attention holds at its forward softmax beyond what it saves: the masked
    scores (c·a·s) and, below fp32, the fp32 copy the softmax converts them to (4·a·s); BLOOM's
    ``BloomAttention.forward`` also keeps the raw ALiBi scores (c·a·s) and the fused QKV output in
    locals (``attention_scores``, ``fused_qkv``)."""
    c, a = x.compute_bytes, attn.num_heads
    extra = (c + (4 if c < 4 else 0)) * a * (s + (1 if attn.sinks else 0))
    if attn.alibi:
        extra += c * a * s + (a * attn.head_dim + 2 * attn.num_kv_heads * attn.head_dim) * c
    return extra


def _mla(layer: LayerSpec, x: Execution, by_name: dict[str, TensorSpec], attn_out: list[TensorSpec]) -> list[Saved]:
    """DeepSeek multi-head latent attention (transformers ``DeepseekV3Attention``), efficient kernel;
    ``by_name``: the attention's linear weights by module name."""
    attn = layer.attention
    a, d, dv, c = attn.num_heads, attn.head_dim, attn.v_head_dim, x.compute_bytes
    trains = x.lora is None
    out: list[Saved] = []
    if attn.q_lora_rank:
        q = attn.q_lora_rank
        out += _norm(layer.norm, q, x, weight_trains=trains, what="q_a_layernorm")
        out += _read("q_a_layernorm output", q, [t for n, t in by_name.items() if n == "q_b_proj"], x)
    rank = attn.kv_lora_rank
    out += _norm(layer.norm, rank, x, weight_trains=trains, what="kv_a_layernorm")
    out += _read("kv_a_layernorm output", rank, [t for n, t in by_name.items() if n == "kv_b_proj"], x)
    nope = d - attn.qk_rope_head_dim
    out += [Saved("kv_b output (alive through the V view)", a * (nope + dv) * c),
            Saved("q (cat of q_nope, q_pe)", a * d * c), Saved("k (k_nope, k_pe)", a * d * c),
            Saved("attention output", a * dv * c), Saved("logsumexp (fp32)", LSE_BYTES * a)]
    out += _read("attention output", a * dv, attn_out, x, trains=False, inside=True, itemsize=c, held=True)
    return out


# ---- MLP ----


def _intermediates(activation: str, gated: bool, i: int, c: int, *, keep_product: bool,
                   compiled: bool = False) -> list[Saved]:
    """Bytes per token of one MLP's intermediates (see the module docstring; ``compiled``: :data:`COMPILED_RULES`)."""
    product = [Saved("MLP product (down input)", i * c)] if keep_product else []
    if compiled and activation not in ("swiglu_limit", "relu"):  # the activation's output is recomputed
        return [Saved("activation input", i * c), *([Saved("up output", i * c)] if gated else []), *product]
    if activation == "swiglu_limit":
        # GptOssExperts._apply_gate holds the clamped up and the gated output in locals until it returns:
        # forward temporaries when autograd does not keep them
        locals_ = [Saved("clamped up (a local of the gate)", i * c, kept=False)]
        if not keep_product:
            locals_.append(Saved("gated output (until the down projection)", i * c, kept=False))
        return [Saved("gate_up output", 2 * i * c), Saved("clamped gate", i * c), Saved("sigmoid", i * c),
                Saved("up + 1", i * c), Saved("glu", i * c), *product, *locals_]
    if activation == "relu":  # relu keeps its output, which is also what the down projection reads
        kept = [Saved("relu output", i * c)]
        return [*kept, Saved("up output", i * c), *product] if gated else kept
    act = ([Saved("composite GELU intermediates", 4 * i * c)] if activation in COMPOSITE_GELUS
           else [Saved("activation input", i * c)])
    if gated:
        return [*act, Saved("activation output", i * c), Saved("up output", i * c), *product]
    return [*act, *product]


def _mlp(layer: LayerSpec, x: Execution, input_readers: list[TensorSpec], input_what: str,
         input_width: int, active: bool = True) -> list[Saved]:
    """The MLP block's saved tensors, its input as its projections (and router) keep it included; when
    nothing in it needs a gradient (``active`` False) only the adapters' inputs."""
    mlp = layer.mlp
    c = x.compute_bytes
    m = x.mlp_bytes  # the dense (and shared) MLP's intermediates: behind bitsandbytes 4-bit linears, r
    trains = x.lora is None
    _, dense_out = _linears(layer, Component.MLP)
    out: list[Saved] = []
    if not active:
        width = mlp.shared_intermediate_size if mlp.is_moe else mlp.intermediate_size
        return (_read(input_what, input_width, input_readers, x, needs_grad=False)
                + _read("MLP product", width, dense_out, x, trains=False, inside=True, itemsize=m, needs_grad=False))
    if not mlp.is_moe:
        out += _read(input_what, input_width, input_readers, x)
        out += _intermediates(x.activation(mlp.activation), mlp.gated, mlp.intermediate_size, m,
                              keep_product=trains and not x.float8_compiled, compiled=x.compiled)
        out += _read("MLP product", mlp.intermediate_size, dense_out, x, trains=False, inside=True, itemsize=m)
        return out
    routers = _routers(layer)
    topk, e = mlp.num_experts_per_tok, mlp.num_experts
    out += _read(input_what, input_width, [*input_readers, *routers], x)
    if not trains:  # frozen experts keep neither, but the experts' forward holds both in locals
        out += [Saved(f"{input_what} (a local through the experts)", input_width * c, kept=False),
                Saved("tokens gathered for their experts (a local)", topk * input_width * c, kept=False)]
    out += [Saved("router softmax (fp32)", 4 * e, False), Saved("routing bookkeeping", ROUTE_BYTES * topk + 4, False)]
    if trains:
        out.append(Saved("tokens gathered for their experts", topk * input_width * c))
    for s in _intermediates(x.activation(mlp.activation), mlp.gated, mlp.intermediate_size, c,
                            keep_product=trains, compiled=x.compiled):
        out.append(Saved(f"{s.what} x topk", topk * s.width, kept=s.kept))
    if any(t.name.endswith("gate_up_proj_bias") for t in layer.tensors):
        # grouped_mm_experts_forward's selected_biases = bias[expert_ids]: a local until the down projection
        out.append(Saved("gate_up bias gathered per route", topk * 2 * mlp.intermediate_size * c, kept=False))
    out.append(Saved("expert outputs (weighted by the routing weights)", topk * input_width * c))
    if mlp.num_shared_experts and mlp.shared_intermediate_size:
        out += _intermediates(x.activation(mlp.activation), mlp.gated, mlp.shared_intermediate_size, m,
                              keep_product=trains, compiled=x.compiled)
        out += _read("shared experts' product", mlp.shared_intermediate_size, dense_out, x, trains=False,
                     inside=True, itemsize=m)
    return out


# ---- one layer ----


def layer_activations(layer: LayerSpec, *, hidden: int, seq_len: int, x: Execution,
                      selective: bool = False, input_grad: bool = True) -> LayerActivations:
    """Bytes per token one layer keeps for backward, without recompute (remembered per arguments).

    Args:
        layer: The layer.
        hidden: h, the model width.
        seq_len: s, the tokens each token attends to (eager attention stores s scores per head; the
            other kernels keep nothing per s, so it is not read without eager attention).
        x: The execution.
        selective: Megatron selective recompute: the eager s x s tensors are recomputed.
        input_grad: The layer's input needs a gradient (False for the first layer under LoRA).
    """
    return _layer_activations(layer, hidden, seq_len if x.eager else 0, x, selective, input_grad)


@remembered(maxsize=1 << 14)
def _layer_activations(layer: LayerSpec, hidden: int, seq_len: int, x: Execution, selective: bool,
                       input_grad: bool) -> LayerActivations:
    eager = x.eager
    extra = _eager_forward_extra(layer.attention, seq_len, x) if eager and layer.attention.kind == "gqa" else 0.0
    # non-reentrant checkpointing rebuilds the layer when its backward first unpacks a saved tensor: the
    # output gradient is alive, and in an MoE layer the gradient of the routes' sum, made contiguous
    # (``weighted_out.view(tokens, topk, h).sum(1)``; the index by the inverse permutation unpacks first)
    grads = x.stream_bytes * hidden
    if layer.mlp.is_moe:
        grads += layer.mlp.num_experts_per_tok * hidden * x.routing_bytes
    return _total(_layer(layer, hidden, seq_len, x, selective, input_grad), extra, grads)


def _layer(layer: LayerSpec, h: int, seq_len: int, x: Execution, selective: bool, input_grad: bool) -> list[Saved]:
    """The layer's saved tensors in the order its forward makes them.

    A block keeps its internals only when something in it needs a gradient: its input does, or one of
    its input projections carries an adapter. Under LoRA the first layer's input does not (PEFT calls
    ``enable_input_require_grads`` only on a model whose gradient checkpointing is already on), so
    its input norm keeps nothing and a block without adapters reading it keeps nothing either.
    """
    trains = x.lora is None
    lora = x.lora
    if _unsloth_patched(layer, x):
        return _unsloth_layer(layer, h, x)
    out: list[Saved] = []
    if x.hidden_dropout > 0:
        out += [Saved("attention dropout mask", x.mask_bytes * h, False), Saved("MLP dropout mask", x.mask_bytes * h, False)]
    attn_in, attn_out = _linears(layer, Component.ATTENTION)
    mlp_in, mlp_out = _linears(layer, Component.MLP)  # the dense MLP's, or an MoE layer's shared experts' (plus its router)

    def adapted(weights: list[TensorSpec]) -> bool:
        return lora is not None and any(lora.adapts(t) for t in weights)

    def norm(what: str, grad: bool, **kw: object) -> list[Saved]:
        return _norm(layer.norm, h, x, weight_trains=trains, what=what, **kw) if grad or trains else []

    grad = input_grad or trains
    attn_active = grad or adapted(attn_in)
    after_attn = grad or adapted(attn_in) or adapted(attn_out)  # the residual after attention needs a gradient
    if layer.norm_position == "post":  # the blocks read the residual stream; their outputs are normed
        out += _tag("attention", _attention(layer, x, seq_len, selective, attn_in, "layer input", h, attn_active))
        out += norm("post-attention norm", after_attn)
        mlp_active = after_attn or adapted(mlp_in)
        out += _tag("mlp", _mlp(layer, x, mlp_in, "residual after attention", h, mlp_active))
        out += norm("post-MLP norm", mlp_active or adapted(mlp_out))
        return out

    if layer.parallel_residual:
        out += norm("input norm", grad)
        mlp_active = grad or adapted(mlp_in)
        if layer.parallel_norms == 2:
            out += norm("MLP input norm", grad, keep_input=False)
            out += _tag("attention", _attention(layer, x, seq_len, selective, attn_in, "input norm output", h, attn_active))
            out += _tag("mlp", _mlp(layer, x, mlp_in, "MLP input norm output", h, mlp_active))
        else:  # one norm output, read by both blocks: kept once unless under autocast or LoRA
            out += _read("input norm output", h, [*attn_in, *mlp_in], x, needs_grad=grad)
            out += _tag("attention", _attention(layer, x, seq_len, selective, [], "", h, attn_active))
            out += _tag("mlp", _mlp(layer, x, [], "", h, mlp_active))
        return out

    out += norm("input norm", grad)
    out += _tag("attention", _attention(layer, x, seq_len, selective, attn_in, "input norm output", h, attn_active,
                                        input_grad=grad))
    if layer.attention.cross_attention:
        out += norm("cross-attention norm", after_attn)
        out += _read("cross-attention norm output", h, attn_in[:1], x)
    mlp_active = after_attn or adapted(mlp_in)
    if layer.norm_position == "sandwich":
        out += norm("post-attention norm", after_attn)
        out += norm("pre-MLP norm", after_attn)
        out += _tag("mlp", _mlp(layer, x, mlp_in, "pre-MLP norm output", h, mlp_active))
        out += norm("post-MLP norm", mlp_active or adapted(mlp_out))
        return out
    out += norm("post-attention norm", after_attn)
    out += _tag("mlp", _mlp(layer, x, mlp_in, "post-attention norm output", h, mlp_active))
    return out


def _unsloth_patched(layer: LayerSpec, x: Execution) -> bool:
    """True when unsloth runs this layer with its own autograd functions: unsloth's ``patch_peft_model``
    (``unsloth/models/llama.py``, commit c67183f, 2024-11-20) patches a layer's MLP with ``LoRA_MLP`` and its
    attention with ``LoRA_QKV`` / ``LoRA_W`` only where ``lora_dropout == 0``, no base linear has a bias and
    every projection of the block carries an adapter; memest takes the fast path for a pre-norm RMSNorm layer
    with a dense gated MLP and plain GQA attention all of whose linears are adapted, and the module graph
    otherwise (an upper bound for a partly patched layer)."""
    lora = x.lora
    if not x.unsloth_kernels or lora is None or lora.dropout > 0:
        return False
    attn, mlp = layer.attention, layer.mlp
    if (layer.norm_position != "pre" or layer.parallel_residual or layer.norm == "layer" or attn.kind != "gqa"
            or attn.qk_norm != "none" or attn.cross_attention or mlp.is_moe or not mlp.gated):
        return False
    linears = [t for t in layer.tensors if t.component in (Component.ATTENTION, Component.MLP) and t.is_linear_weight]
    biased = any(t.name.endswith("bias") for t in layer.tensors if t.component in (Component.ATTENTION, Component.MLP))
    return bool(linears) and not biased and all(lora.adapts(t) for t in linears)


def _unsloth_layer(layer: LayerSpec, h: int, x: Execution) -> list[Saved]:
    """What a layer run by unsloth's kernels keeps for backward, per token (``unsloth/kernels`` at commit
    c67183f, 2024-11-20):

    - ``Fast_RMS_Layernorm`` (``rms_layernorm.py``) ``ctx.save_for_backward(X, W, r)``: its input itself (the
      layer input, the checkpoint brought back, and the residual after attention) and an fp32 rstd per row;
    - ``LoRA_QKV`` (``fast_lora.py``) ``save_for_backward(X, QA, QB, KA, KB, VA, VB)``: the input norm's output
      once, the adapters' casts made inside the function; its Q, K, V outputs, which ``fast_rope_embedding``
      rotates in place and ``flash_attn_func`` keeps with its output and logsumexp (grouped K, V unrepeated);
    - ``LoRA_W`` (the o_proj) ``save_for_backward(A, B, X)``: X is ``A.reshape(bsz, q_len, n_heads*head_dim)``
      of the kernel's output, a view (``models/llama.py`` ``LlamaAttention_fast_forward``);
    - ``LoRA_MLP`` ``save_for_backward(..., X, e, g)``: the post-attention norm's output, the gate and up
      outputs; the activation's output ``h`` is a temporary until the down projection.
    """
    attn, mlp = layer.attention, layer.mlp
    c = x.compute_bytes
    a, k, d, dv, i = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.v_head_dim, mlp.intermediate_size
    r = x.stream_bytes
    attention = [Saved("input norm rstd (fp32)", 4, False), Saved("input norm output (LoRA_QKV's X)", r * h, False),
                 Saved("q after in-place rotary", a * d * c), Saved("k after in-place rotary", k * d * c),
                 Saved("v", k * dv * c), Saved("attention output (LoRA_W's X is a view)", a * dv * c),
                 Saved("logsumexp (fp32)", LSE_BYTES * a)]
    mlp_saved = [Saved("residual after attention (the post-attention norm's X)", r * h, False),
                 Saved("post-attention norm rstd (fp32)", 4, False),
                 Saved("post-attention norm output (LoRA_MLP's X)", r * h, False),
                 Saved("gate output e", i * c), Saved("up output g", i * c),
                 Saved("activation output h (until the down projection)", i * c, kept=False)]
    return _tag("attention", attention) + _tag("mlp", mlp_saved)


def _tag(block: str, tensors: list[Saved]) -> list[Saved]:
    return [dataclasses.replace(t, block=block) for t in tensors]


def norm_bytes(kind: str, h: int, x: Execution, *, readers: int, weight_trains: bool) -> float:
    """Bytes per token one norm keeps, its output included when ``readers`` linears keep it.

    Args:
        kind: ``rms``, ``rms_fp32`` or ``layer``.
        h: Features normalized.
        x: The execution.
        readers: Linears that read the output and keep it for backward.
        weight_trains: The norm's own weight trains (it then keeps the normalized input).
    """
    kept = sum(t.width for t in _norm(kind, h, x, weight_trains=weight_trains))
    if readers:
        kept += readers * x.compute_bytes * h if x.autocast else x.stream_bytes * h
    return kept


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
    return _total([Saved("every other matmul output", saved * c),
                   Saved("attention output and logsumexp", attn.num_heads * attn.v_head_dim * c + LSE_BYTES * attn.num_heads),
                   Saved("layer input", x.stream_bytes * hidden, False)])


NORM_BACKWARD_COPIES = 5
"""fp32 h-wide temporaries an RMSNorm's backward (autograd over its decomposed forward: the cast, pow,
mean, rsqrt and products) holds at its peak, by which time the normalized input it saved for the
weight's gradient is freed: traced in the post-norms of OLMo-2 (LoRA: 5 x 4h) and Gemma 3 (full
fine-tune: 5 x 4h with the 4h normalized input freed)."""


def backward_transient(layer: LayerSpec, *, seq_len: int, x: Execution, hidden: int = 0) -> LayerActivations:
    """Bytes per token one layer's backward holds beyond its saved tensors, at its peak.

    The gradient of the layer's output (r·h, alive through the layer's backward) plus the largest of:

    - the MLP's, which runs first: the product's gradient and the two gradients of its inputs while
      the activation's input and output and the up output are still alive: 2·i·c net of a gated MLP
      whose down projection kept the product (freed by then), 3·i·c when it kept none (a frozen down
      projection under LoRA); a plain MLP one i-sized gradient, two for a composite GELU, one more
      when the product was not kept; topk x for routed experts, less the expert outputs (topk·h·c,
      freed by then), or, when larger, four h-wide tensors per route before the experts' backward
      (the gradients of the weighted and of the expert outputs and of the gathered inputs, and the
      re-gathered inputs: 4·topk·h at the routing weights' dtype, fp32 for Mixtral and DeepSeek), less
      the shared experts' tensors (they run after the routed experts, so their backward is done);
    - a post-norm's (OLMo-2, Gemma 2/3: it runs before the MLP's, with everything alive):
      :data:`NORM_BACKWARD_COPIES` fp32 copies of h, less its normalized input (freed by then);
    - eager attention's: the gradients of the probabilities and the fp32 scores, less what is
      freed by then ((4 + c)/2·a·s net; measured 4·a·s in fp32 and 2.7·a·s in bf16).

    Measured on the CPU within 3% (``tests/test_training_cpu_measured.py``) and against the traced
    rebuilt layer of every family (``tests/test_trace_agreement.py``).
    """
    c = x.compute_bytes
    mlp = layer.mlp
    if _unsloth_patched(layer, x):
        # LoRA_MLP.backward: DW = matmul_lora(dY, downW.t(), ...) is the one new i-wide tensor; the SwiGLU /
        # GEGLU backward writes h, df, de into DW, e, g in place and dX goes into X (``out = X``, inplace=True).
        # unsloth's checkpointer (unsloth_zoo ``gradient_checkpointing.py``, commit 44a919cd,
        # ``Unsloth_Offloaded_Gradient_Checkpointer.backward``) holds the rebuilt layer's ``output`` through
        # ``torch.autograd.backward(output, dY)``: r·h more (its only path: unsloth's stack always checkpoints)
        return _total((Saved("output gradient", x.stream_bytes * hidden, False),
                       Saved("the rebuilt layer's output (held by unsloth's checkpointer)", x.stream_bytes * hidden,
                             False),
                       Saved("backward gradients (LoRA_MLP's DW)", mlp.intermediate_size * c)))
    width = mlp.intermediate_size * (mlp.num_experts_per_tok or 1)
    product_kept = x.lora is None
    if mlp.gated:
        grads = 2 if product_kept else 3
    else:
        grads = (2 if x.activation(mlp.activation) in COMPOSITE_GELUS else 1) + (0 if product_kept else 1)
    mlp_part = grads * width * (c if mlp.is_moe else x.mlp_bytes)
    if mlp.is_moe:
        # the expert outputs kept for the routing weights' gradient are freed before the experts' backward;
        # before that, the gradients of the weighted outputs, of the expert outputs and of the gathered
        # inputs, beside the re-gathered inputs, are h-wide per route
        routed = mlp.num_experts_per_tok * hidden
        mlp_part = max(mlp_part - routed * c, routed * (3 * x.routing_bytes + c))
        if mlp.num_shared_experts:  # the shared experts run after the routed ones: their backward is done
            mlp_part -= sum(t.width for t in _intermediates(x.activation(mlp.activation), mlp.gated, mlp.shared_intermediate_size, x.mlp_bytes,
                                                            keep_product=product_kept, compiled=x.compiled) if t.kept)
    norm_part = 0.0
    if layer.norm_position in ("post", "sandwich") and layer.norm != "layer":
        normalized = (4 if layer.norm == "rms_fp32" else x.stream_bytes) * hidden if x.lora is None else 0
        norm_part = NORM_BACKWARD_COPIES * 4 * hidden - normalized
    attn = layer.attention
    eager = x.eager
    attn_part = (4 + c) / 2 * attn.num_heads * seq_len if eager and attn.kind == "gqa" else 0.0
    tensors = (Saved("output gradient", x.stream_bytes * hidden, False),
               Saved("backward gradients", max(mlp_part, norm_part, attn_part)))
    return _total(tensors)


def embedding_bytes(has_norm: bool, hidden: int, x: Execution) -> float:
    """Bytes per token the embeddings keep: their LayerNorm (BERT, BLOOM) and dropout mask."""
    kept = 0.0
    if has_norm:
        kept += sum(t.width for t in _norm("layer", hidden, x, weight_trains=x.lora is None))
    if x.hidden_dropout > 0:
        kept += x.mask_bytes * hidden
    return kept
