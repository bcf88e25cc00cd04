"""One rank's activation terms at the moments of the step: the layers' saved tensors
(:mod:`memest.estimate.activations`), the head's, the logits, the autocast copies of the weights and
eager attention's masks.

Activation offloading (torchtune ``enable_activation_offloading``, trl's port of it, unsloth's gradient checkpointing; full
recompute only) keeps the layer checkpoints in host RAM: torchtune 0.6 ``OffloadActivations`` packs each
saved tensor of at least 1024 B made under it into a pinned host copy (``pack_tensor``), and non-reentrant
checkpointing saves a layer's input through ``_NoopSaveInputs.save_for_backward`` outside its own hooks, so
the checkpoints are what it moves; unsloth's ``Unsloth_Offloaded_Gradient_Checkpointer`` copies each layer's
input to host itself. On the device remain the checkpoints in flight
(:func:`memest.workload.offloaded_checkpoints_on_device`: torchtune's forward stash, unsloth's one brought back),
and through the loss those the stash still holds after the final norm's saved tensors
(:func:`memest.workload.offloaded_checkpoints_at_loss`);
the others are :attr:`ActivationTerms.offloaded` host bytes. The head's saved tensors and the loss stay on the
device (torchtune's ``NoOpManager`` around the output projection; the loss runs outside the context).

The activations do not depend on the optimizer, offload or the ZeRO sharding: they are remembered
per the workload fields they read (:class:`ActivationsInput`, :mod:`memest.memo`).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import NamedTuple

from memest import lora_targets
from memest.estimate.activations import (
    Execution,
    LoraActivations,
    backward_transient,
    embedding_bytes,
    layer_activations,
    norm_bytes,
    selective_op_bytes,
)
from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.serving.hf.prefill import DEFAULT_CODE, FORWARD_CODE
from memest.estimate.sharding import Stage, shard_numel
from memest.estimate.training.lora import adapter_bytes, lora_adapters
from memest.estimate.training.qlora_base import quantizes_lm_head
from memest.estimate.training.recipes import RECIPES, kbit_weight_bytes
from memest.estimate.training.states import _dequantized_head
from memest.memo import remembered
from memest.result import Kind, Term
from memest.spec import Component, LayerSpec, ModelSpec, TensorSpec
from memest.workload import (
    AttnImplementation,
    Float8,
    Framework,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Loss,
    Method,
    Parallelism,
    Precision,
    Recompute,
    TrainingConfig,
    offloaded_checkpoints_at_loss,
    offloaded_checkpoints_on_device,
)

LOSS_CHUNKS = 8
"""torchtune ``CEWithChunkedOutputLoss.num_output_chunks``."""

LITGPT_HEAD_CHUNK = 128
"""litgpt's ``fit()``: ``model(input_ids, lm_head_chunk_size=128)`` (:attr:`Loss.LITGPT_CHUNKED`)."""


_BYTES = operator.attrgetter("bytes")


class ActivationParallelism(NamedTuple):
    """The parallel degrees the activations read: the ZeRO stage and its sharding group are not among them."""

    tp: int
    pp: int
    dp: int  # read only to place routed experts under expert parallelism (sharding.shard_numel): 1 without it
    cp: int
    ep: int
    sequence_parallel: bool


class ActivationsInput(NamedTuple):
    """The fields of a TrainingConfig the activations read (:func:`activation_terms`), named as there:
    the optimizer, offload and the ZeRO stage are not among them."""

    method: Method
    precision: Precision
    micro_batch_size: int
    seq_len: int
    target_len: int | None
    grad_accum_steps: int
    recompute: Recompute
    attn_implementation: AttnImplementation
    loss: Loss
    lora: LoraConfig | None  # None under full training (no adapters)
    prepare_kbit_training: KbitPrep
    lora_library: LoraLibrary
    torch_compile: bool
    float8: str  # Float8 value
    parallelism: ActivationParallelism
    checkpoints_on_device: int = 0  # activation offloading: the layers' checkpoints left on the device (0: off)
    checkpoints_at_loss: int = 0  # activation offloading: those still on the device through the loss
    half_dtype: str = "bf16"  # fp16 autocast: trl casts no QLoRA embeddings to bf16 (recipes.kbit_weight_bytes)


def activations_input(t: TrainingConfig) -> ActivationsInput:
    """The activations' view of ``t``."""
    par = t.parallelism
    return ActivationsInput(t.method, t.precision, t.micro_batch_size, t.seq_len, t.target_len, t.grad_accum_steps,
                            t.recompute, t.attn_implementation, t.loss, t.lora if t.method is not Method.FULL else None,
                            t.prepare_kbit_training, t.lora_library, t.torch_compile, Float8(t.float8).value,
                            ActivationParallelism(par.tp, par.pp, par.dp if par.ep > 1 else 1, par.cp, par.ep,
                                                  par.sequence_parallel),
                            *((offloaded_checkpoints_on_device(t), offloaded_checkpoints_at_loss(t))
                              if t.recompute is Recompute.FULL else (0, 0)), t.half_dtype)


def execution(spec: ModelSpec, t: TrainingConfig, fw: Framework) -> Execution:
    """How the forward runs under ``t`` (bytes of the compute and residual dtypes, kernels, adapters)."""
    recipe = RECIPES[t.precision]
    c = recipe.compute
    quantized = t.method is Method.QLORA
    if quantized:
        # fp32 norm weights make RMSNorm's ``weight * x.to(input_dtype)`` fp32, and Linear4bit returns its
        # input's dtype: the residual stream is fp32 once the norms are (KbitPrep); trl runs the HF Trainer's
        # torch.autocast(bf16), PEFT's preparation alone no autocast, an unprepared bf16 model needs none
        r = c if t.prepare_kbit_training is KbitPrep.NONE else 4
        autocast = t.prepare_kbit_training is KbitPrep.TRL
    elif t.precision is Precision.AMP:
        r, autocast = 4, True
    else:
        r, autocast = c, False
    lora = None
    if t.method is not Method.FULL:
        lora = LoraActivations(targets=tuple(lora_targets.peft_target_modules(spec, t.lora.targets)),
                               all_linear=t.lora.targets == lora_targets.ALL_LINEAR, rank=t.lora.rank,
                               adapter_bytes=adapter_bytes(t.lora_library, t.precision),
                               dropout=t.lora.dropout, megatron=t.lora_library is LoraLibrary.MEGATRON)
    litgpt = t.method is not Method.FULL and t.lora_library is LoraLibrary.LITGPT  # litgpt's own model code
    # a family without an SDPA path in transformers runs eager attention whatever is asked (ModelSpec.sdpa_supported)
    eager = t.attn_implementation == AttnImplementation.EAGER or not spec.sdpa_supported
    # the family's routing-weight dtype, as the serving prefill reads it (hf_prefill.FORWARD_CODE)
    routing = 4 if FORWARD_CODE.get(spec.model_type, DEFAULT_CODE).routing_fp32 else c
    return Execution(compute_bytes=c, stream_bytes=r, autocast=autocast, eager=eager, repeat_kv=eager,
                     routing_bytes=routing, quantized_outputs=quantized,
                     saves_4bit_inputs=quantized and t.lora_library is LoraLibrary.LITGPT,
                     litgpt_attention=litgpt,
                     fused_gelu=t.method is not Method.FULL and t.lora_library is LoraLibrary.LITGPT,
                     unsloth_kernels=t.method is not Method.FULL and t.lora_library is LoraLibrary.UNSLOTH,
                     fused_norms=fw is Framework.MEGATRON, lora=lora,
                     # litgpt's GPT has no residual or attention dropout (litgpt/config.py: no such field)
                     hidden_dropout=0.0 if litgpt else spec.hidden_dropout,
                     attention_dropout=0.0 if litgpt else spec.attention_dropout, compiled=t.torch_compile,
                     float8=Float8(t.float8).value if t.method is Method.FULL else Float8.NONE.value)


class ActivationTerms(NamedTuple):
    """One rank's activation terms, by lifetime.

    Attributes:
        lifetimes: The terms of each of :data:`.table.ACTIVATION_LIFETIMES`, in that order (see
            :func:`_by_lifetime`).
        sizes: Their bytes, lifetime by lifetime.
        offloaded: Host bytes of the activation checkpoints offloaded (0 without activation offloading).
    """

    lifetimes: tuple[tuple[Term, ...], ...]
    sizes: tuple[int, ...]
    offloaded: int = 0


def _by_lifetime(layers: _LayerTerms, head: Term | None, embedding: Term | None, logits: Term | None,
                 logits_forward: Term | None, autocast_weights: Term | None, autocast_layer: Term | None,
                 masks: Term | None, previous: Term | None = None, logits_head: Term | None = None) -> ActivationTerms:
    """The activation terms by lifetime. ``head``: the embeddings', final norm's and lm_head input's
    activations; ``embedding``: the embeddings' part of them (what exists before the final norm);
    ``logits`` at the loss backward, ``logits_forward`` inside the forward's loss; ``autocast_weights``:
    torch.autocast's 16-bit weight copies kept for backward, ``autocast_layer`` one layer's (what is
    left at the last layer's backward); ``masks``: eager attention's materialized causal masks (during
    the forward, and through the backward under recompute: the checkpoints keep them); ``previous``: what the
    previous micro-batch's graph still holds (:func:`_previous_microbatch`); ``logits_head``: the lm_head's
    outputs at its last matmul, where an NF4 lm_head is dequantized for it (:func:`_head_terms`)."""
    none = ()
    kept_masks = (masks,) if masks else none
    lifetimes = (  # in ACTIVATION_LIFETIMES order
        (layers.stored,),                                                        # activations.stored
        (layers.stored_at_loss,),                                                # activations.stored.loss
        (embedding,) if embedding else none,                                     # activations.embedding
        (head,) if head else none,                                               # activations.head
        (layers.layer_forward,) if layers.layer_forward else none,               # activations.layer_forward
        (layers.rebuilt,) if layers.rebuilt else none,                           # activations.rebuilt
        (layers.transient,),                                                     # activations.backward
        (layers.first_layer,),                                                   # activations.first_layer
        (layers.first_transient,),                                               # activations.first_layer_backward
        (layers.other_microbatches,) if layers.other_microbatches else none,     # activations.other_microbatches
        (autocast_weights,) if autocast_weights else none,                       # autocast.all
        (autocast_layer,) if autocast_layer else none,                           # autocast.layer
        kept_masks,                                                              # masks
        kept_masks if layers.rebuilt else none,                                  # masks.rebuilt
        (logits_forward,) if logits_forward else none,                           # logits.forward
        (logits,) if logits else none,                                           # logits.backward
        (previous,) if previous else none,                                       # activations.previous_microbatch
        (logits_head,) if logits_head else none,                                 # logits.head_forward
    )
    return ActivationTerms(lifetimes, tuple(sum(map(_BYTES, terms)) for terms in lifetimes))


def _seq_for(layer: LayerSpec, t: TrainingConfig) -> int:
    if layer.stack == "decoder" and t.target_len is not None:
        return t.target_len
    return t.seq_len


@remembered(maxsize=1 << 14)
def activation_terms(spec: ModelSpec, t: ActivationsInput, fw: Framework, stage: Stage) -> ActivationTerms:
    """One rank's activation terms (remembered)."""
    par = t.parallelism
    x = execution(spec, t, fw)
    # pipeline: the 1F1B schedule keeps the micro-batches the later stages have not back-propagated yet
    in_flight = min(par.pp - stage.index, t.grad_accum_steps) if par.pp > 1 else 1
    kinds = spec.layer_kinds(stage.start, stage.stop)
    layers = _layer_terms(spec, t, x, stage, in_flight)
    head, embedding, logits, logits_forward, logits_head, head_held = _head_terms(spec, t, fw, x, stage, in_flight)
    cast_all, cast_layer = _autocast_terms(spec, t, x, stage) if x.autocast else (None, None)
    terms = _by_lifetime(layers.terms, head, embedding, logits, logits_forward, cast_all, cast_layer,
                         _eager_masks(kinds, x, t, par), _previous_microbatch(layers.terms.held + head_held),
                         logits_head)
    return terms._replace(offloaded=layers.offloaded)


class _LayerTerms(NamedTuple):
    """What the stage's layers add to the activation terms."""

    stored: Term  # every layer's saved tensors (or checkpoints) of all in-flight micro-batches
    stored_at_loss: Term  # what of them is on the device through the loss (``stored`` but under offloading)
    rebuilt: Term | None  # one layer rebuilt under recompute (during its backward)
    transient: Term  # one layer's backward gradients (the layer the first_layer_backward moment is in)
    first_layer: Term  # what the stage's first layer keeps (rebuilt under recompute), for last_layer_backward
    first_transient: Term  # that layer's backward gradients
    other_microbatches: Term | None  # pipeline: the in-flight micro-batches not being back-propagated
    layer_forward: Term | None  # a layer's forward beyond the stored activations (recompute, eager softmax)
    held: int = 0  # of ``stored``, the bytes autograd nodes hold past their backward (Saved.graph_held)


class _Layers(NamedTuple):
    terms: _LayerTerms
    offloaded: int  # host bytes of the offloaded checkpoints


def _layer_terms(spec: ModelSpec, t: ActivationsInput, x: Execution, stage: Stage, in_flight: int) -> _Layers:
    """What the stage's layers keep, rebuild and hold in their backward and forward, and the checkpoints'
    host bytes under activation offloading."""
    par = t.parallelism
    tp, sp = par.tp, par.sequence_parallel
    b = t.micro_batch_size
    h = spec.hidden_size
    selective = t.recompute is Recompute.SELECTIVE
    stored = 0.0
    largest_kept = 0  # the largest layer checkpoint (activation offloading keeps a few on the device)
    rebuilt = transient = 0.0  # the layer whose rebuilt tensors and backward together are the largest
    first = first_rebuilt = first_back = last_back = 0.0
    forward = 0.0
    held = 0  # the graph-held inputs (Saved.graph_held) of one micro-batch, without recompute
    kinds = spec.layer_kinds(stage.start, stage.stop)
    first_layer, last_layer = spec.layers[stage.start], spec.layers[stage.stop - 1]
    # under LoRA the first layer's input needs no gradient (layer_activations, input_grad)
    frozen_input = stage.first and x.lora is not None
    # trl's QLoRA casts the embeddings back to bf16 while the norms keep the stream fp32 (kbit_weight_bytes)
    input_bytes = kbit_weight_bytes(t)[0] if t.method is Method.QLORA else x.stream_bytes
    for layer, count in kinds:
        s = _seq_for(layer, t) // par.cp
        tokens = b * s
        eager_len = s * par.cp if x.eager else s
        full = layer_activations(layer, hidden=h, seq_len=eager_len, x=x, selective=selective)
        per_layer = full.block_bytes(tokens, tp, sp)
        back = backward_transient(layer, seq_len=s * par.cp, x=x, hidden=h).block_bytes(tokens, tp, sp)
        if t.recompute is Recompute.FULL:
            kept = cuda_block_bytes(math.ceil(x.stream_bytes * h / (tp if sp else 1) * tokens))
        elif t.recompute is Recompute.SELECTIVE_OP:
            kept = selective_op_bytes(layer, hidden=h, x=x).block_bytes(tokens, tp, sp)
        else:
            kept = per_layer
        stored += kept * count
        largest_kept = max(largest_kept, kept)
        if t.recompute is Recompute.NONE:
            held += full.block_bytes(tokens, tp, sp, graph_held=True) * count
        if layer is first_layer:
            first = kept
            if t.recompute is Recompute.FULL and stage.first and input_bytes != x.stream_bytes:
                # the first layer's input is the embeddings' output, at their dtype
                first = cuda_block_bytes(math.ceil(input_bytes * h / (tp if sp else 1) * tokens))
                stored += first - kept
            if frozen_input and t.recompute in (Recompute.NONE, Recompute.SELECTIVE):
                frozen = layer_activations(layer, hidden=h, seq_len=eager_len, x=x, selective=selective,
                                           input_grad=False)
                first = frozen.block_bytes(tokens, tp, sp)
                stored += first - kept
                if t.recompute is Recompute.NONE:
                    held += (frozen.block_bytes(tokens, tp, sp, graph_held=True)
                             - full.block_bytes(tokens, tp, sp, graph_held=True))
        extra = full.forward_extra * tokens / (tp if sp else 1)
        if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
            # the recomputation's own temporaries, before the layer's backward proper
            back = max(back, full.recompute_extra * tokens / (tp if sp else 1))
            if per_layer + back > rebuilt + transient:
                rebuilt, transient = per_layer, back
            # a checkpointed layer's forward drops what it would save; its largest block is alive at once
            forward = max(forward, (full.forward_working + x.stream_bytes * h) * tokens / (tp if sp else 1))
        elif extra:  # eager attention's softmax in the stage's last layer, its later tensors not made yet
            forward = max(forward, extra - full.after_scores * tokens / (tp if sp else 1))
        if layer is first_layer:
            first_rebuilt, first_back = per_layer, back
        if layer is last_layer:
            last_back = back
    if t.recompute not in (Recompute.FULL, Recompute.SELECTIVE_OP):
        transient = last_back  # the backward starts with the stage's last layer
    micro = "" if in_flight == 1 else f" x {in_flight} in flight"
    offloaded = 0
    kept_on_device = min(t.checkpoints_on_device, stage.stop - stage.start)
    if t.checkpoints_on_device:
        on_device = kept_on_device * largest_kept * in_flight
        offloaded = math.ceil(stored * in_flight) - on_device
        stored_term = Term("activations.checkpoints", Kind.ACTIVATIONS, on_device,
                           f"{kept_on_device} x b x s x h x {x.stream_bytes} B (the layer inputs in flight; "
                           f"activation offloading keeps the others in host RAM){micro}")
        at_loss = min(t.checkpoints_at_loss, kept_on_device)
        loss_term = Term("activations.checkpoints", Kind.ACTIVATIONS, at_loss * largest_kept * in_flight,
                         f"{at_loss} x b x s x h x {x.stream_bytes} B (the layer inputs the offloading stash still "
                         f"holds after the final norm's saved tensors){micro}")
    elif t.recompute is Recompute.FULL:
        first_note = (f"; the first layer's at {input_bytes} B, the embeddings' dtype"
                      if stage.first and input_bytes != x.stream_bytes else "")
        stored_term = Term("activations.checkpoints", Kind.ACTIVATIONS, math.ceil(stored * in_flight),
                           f"L_stage x b x s x h x {x.stream_bytes} B (layer inputs{first_note}){micro}")
    elif t.recompute is Recompute.SELECTIVE_OP:
        stored_term = Term("activations.checkpoints", Kind.ACTIVATIONS, math.ceil(stored * in_flight),
                           f"L_stage x b x s x (layer input + every other matmul output + attention output){micro}")
    else:
        stored_term = Term("activations.layers", Kind.ACTIVATIONS, math.ceil(stored * in_flight),
                           f"sum over layers of saved bytes/token x b x s{micro}")
    rebuilt_term = Term("activations.recomputed_layer", Kind.ACTIVATIONS, math.ceil(rebuilt),
                        "one layer's saved tensors, rebuilt in backward") if rebuilt else None
    back_formula = "one layer's backward gradients: output gradient + max(MLP, post-norm, eager scores) x b x s"
    transient_term = Term("activations.backward", Kind.ACTIVATIONS, math.ceil(transient), back_formula)
    first_back_term = Term("activations.backward", Kind.ACTIVATIONS, math.ceil(first_back), back_formula)
    if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
        first_term = Term("activations.recomputed_layer", Kind.ACTIVATIONS, math.ceil(first_rebuilt),
                          "the stage's first layer's saved tensors, rebuilt in backward")
    else:
        first_term = Term("activations.layers", Kind.ACTIVATIONS, math.ceil(first), "the stage's first layer's saved tensors")
    others = Term("activations.other_microbatches", Kind.ACTIVATIONS, math.ceil(stored * (in_flight - 1)),
                  f"{in_flight - 1} other in-flight micro-batches") if in_flight > 1 else None

    forward_term = Term("activations.layer_forward", Kind.ACTIVATIONS, math.ceil(forward),
                        "one layer's forward: its tensors (discarded under recompute) + eager attention's masked "
                        "scores and their fp32 copy at the softmax") if forward > 0 else None
    return _Layers(_LayerTerms(stored_term, loss_term if t.checkpoints_on_device else stored_term, rebuilt_term,
                               transient_term, first_term, first_back_term, others, forward_term, held),
                   max(0, offloaded))


def _head_terms(spec: ModelSpec, t: ActivationsInput, fw: Framework, x: Execution, stage: Stage,
                in_flight: int) -> tuple[Term | None, Term | None, Term | None, Term | None, Term | None, int]:
    """(the head's activations, the embeddings' part of them, the logits at the loss backward, inside the
    forward's loss, at the lm_head's forward where it is NF4 (litgpt's QLoRA: the c-byte outputs of its
    chunks, ``GPT.forward``'s ``[self.lm_head(x_i) for x_i in x.split(lm_head_chunk_size, dim=1)]``,
    litgpt/model.py at 00af8b0, the last being written beside the dequantized weight), and the bytes of the
    lm_head's input its bitsandbytes 0.42 ``MatMul4Bit`` holds (:attr:`Execution.saves_4bit_inputs`))."""
    par = t.parallelism
    tp, sp = par.tp, par.sequence_parallel
    b = t.micro_batch_size
    h = spec.hidden_size
    head_bytes = emb_bytes = 0.0
    head_parts: list[str] = []
    tokens_first = b * t.seq_len // par.cp
    if stage.first:
        has_norm = any(tn.component is Component.NORM for tn in spec.embedding)
        emb = embedding_bytes(has_norm, h, x) / (tp if sp else 1) * tokens_first
        if emb:
            head_bytes += emb
            emb_bytes = emb
            head_parts.append("embedding norm/dropout")
    logits_term = logits_fwd = logits_head = None
    head_held = 0
    if stage.last:
        lm = spec.task in ("causal_lm", "seq2seq", "masked_lm")
        out_len = t.target_len if spec.task == "seq2seq" and t.target_len is not None else t.seq_len
        tokens_out = b * out_len // par.cp
        if any(tn.component is Component.NORM for tn in spec.head):
            head_trains = x.lora is None and lm
            # torchtune and torchtitan compile the layers one by one: the final norm runs eager
            eager = dataclasses.replace(x, compiled=False)
            # litgpt's NF4 lm_head keeps its input like a trained one (bitsandbytes 0.42 MatMul4Bit)
            nf4_head = lm and x.saves_4bit_inputs and quantizes_lm_head(t.lora_library)
            readers = 1 if head_trains or nf4_head else 0
            kept = norm_bytes(spec.reference_layer.norm, h, eager, readers=readers, weight_trains=x.lora is None)
            if nf4_head and t.recompute is Recompute.NONE:
                head_held = math.ceil((kept - norm_bytes(spec.reference_layer.norm, h, eager, readers=0,
                                                         weight_trains=x.lora is None)) * tokens_out)
            if _dtensor_gathers_head_input(t, fw):
                # the norm's own tensors on the s/tp shard, the lm_head's input all-gathered (b x s x h)
                own = norm_bytes(spec.reference_layer.norm, h, eager, readers=0, weight_trains=x.lora is None)
                head_bytes += own / tp * tokens_out + (kept - own) * tokens_out
                head_parts.append("final norm (s/tp) and lm_head input all-gathered (s)")
            else:
                head_bytes += kept / (tp if sp else 1) * tokens_out
                head_parts.append("final norm and lm_head input")
        if lm:
            dequantized = sum(tn.bytes for tn in _dequantized_head(spec, stage, t, RECIPES[t.precision].compute))
            logits_term = _logits(spec, t, fw, x, tokens_out, dequantized)
            logits_fwd = _logits_forward(spec, t, fw, x, tokens_out) or logits_term
            if t.method is Method.QLORA and quantizes_lm_head(t.lora_library):
                v = math.ceil(spec.vocab_size / par.tp)
                c = _logits_bytes(t, x)
                logits_head = Term("logits", Kind.LOGITS, tokens_out * v * c,
                                   f"b x s x V/t x {c} B (the lm_head's outputs, at its last chunk's matmul)")
    head_term = Term("activations.head", Kind.ACTIVATIONS, math.ceil(head_bytes * in_flight),
                     " + ".join(head_parts) + " x b x s") if head_bytes else None
    embedding_term = Term("activations.head", Kind.ACTIVATIONS, math.ceil(emb_bytes * in_flight),
                          "embedding norm/dropout x b x s") if emb_bytes else None
    return head_term, embedding_term, logits_term, logits_fwd, logits_head, head_held


def _previous_microbatch(held: int) -> Term | None:
    """What the previous micro-batch's graph still holds through the next micro-batch's forward and loss:
    the ``held`` bytes of its inputs that bitsandbytes 0.42 ``MatMul4Bit`` keeps as ``ctx.tensors``
    (:attr:`memest.estimate.activations.Saved.graph_held`; None when there are none).

    Sources: bitsandbytes 0.42.0 ``autograd/_functions.py`` ``MatMul4Bit.forward`` stores ``ctx.tensors =
    (A, B)``, an attribute of ``ctx`` rather than ``save_for_backward`` (which torch documents as needed "to
    prevent incorrect gradients and memory leaks", ``FunctionCtx.save_for_backward``): autograd frees a
    node's saved variables after its backward, not its ``ctx``'s attributes, which live as long as the graph.
    litgpt's ``fit()`` (``litgpt/finetune/lora.py`` at 00af8b0) binds ``logits = model(...)`` and ``loss =
    chunked_cross_entropy(...)`` and keeps both through ``fabric.backward`` and the optimizer step, so the
    graph, reachable from their ``grad_fn``, lives until the next micro-batch's loss replaces ``loss``:
    through that micro-batch's whole forward, lm_head and loss. Counted on the CPU with litgpt's own
    model code at 00af8b0 and a MatMul4Bit stand-in storing ``ctx.tensors`` as 0.42 does (torch 2.13;
    ``benchmarks/litgpt_fit_retained.py``): after each backward, and at the next forward's peak, exactly
    the layers' 4-bit inputs and the lm_head's stay beyond a ``save_for_backward`` stand-in's bytes.
    bitsandbytes 0.43.2 keeps ``(None, B)`` (commit 9e75374, #1270). Under recompute a checkpointed
    layer's ``MatMul4Bit`` would hold its input through the forward too: not modelled (litgpt 0.4's
    ``finetune/lora.py`` does not checkpoint)."""
    if not held:
        return None
    return Term("activations.previous_microbatch", Kind.ACTIVATIONS, held,
                "the previous micro-batch's 4-bit linear inputs x b x s (bitsandbytes 0.42 MatMul4Bit ctx.tensors, "
                "alive until litgpt's fit() rebinds loss)")


def _autocast_terms(spec: ModelSpec, t: ActivationsInput, x: Execution, stage: Stage) -> tuple[Term, Term]:
    """torch.autocast's 16-bit weight copies kept for backward: (all of them, one layer's)."""
    par = t.parallelism
    kinds = spec.layer_kinds(stage.start, stage.stop)

    def cast_bytes(items: list[tuple[TensorSpec, int]]) -> int:
        return sum(shard_numel(tn, par, spec.num_kv_heads) * cnt for tn, cnt in items) * x.compute_bytes

    head = [(tn, 1) for tn in spec.head if tn.component is Component.LM_HEAD and len(tn.shape) == 2] if stage.last else []
    if stage.last and not head and spec.tie_word_embeddings and spec.task in ("causal_lm", "seq2seq", "masked_lm"):
        # a tied lm_head is the embedding matrix: the head's linear casts that fp32 parameter (its own copy, kept
        # for backward), where the embedding lookup casts nothing (aten/src/ATen/autocast_mode.cpp lists no
        # embedding); the traced Llama-3.2-1B step holds 16 x 7 layer copies + this one (memest hf --trace)
        head = [(tn, 1) for tn in spec.embedding if tn.component is Component.EMBEDDING and len(tn.shape) == 2
                and tn.shape[0] >= spec.vocab_size][:1]
    if t.loss == Loss.LITGPT_CHUNKED and x.lora is not None:
        # litgpt's fit() runs the frozen lm_head once per 128-token chunk: autocast caches a cast only for a leaf
        # that requires grad (aten/src/ATen/autocast_mode.cpp cached_cast: arg.requires_grad() && arg.is_leaf()),
        # so each chunk's F.linear casts the fp32 weight anew and keeps that copy for its input's gradient
        head = [(tn, math.ceil(t.seq_len / LITGPT_HEAD_CHUNK)) for tn, _ in head]
    if t.method is Method.QLORA:
        # the NF4 weights are dequantized inside MatMul4Bit (workspace.dequantized_weight), a 16-bit lm_head
        # needs no cast: autocast casts the fp32 adapters (and an fp32 lm_head)
        if kbit_weight_bytes(t)[0] == x.compute_bytes:
            head = []
        adapters = lora_adapters(spec, stage, t.lora, par.tp)
        one = max((sum(local for tn, local, _ in adapters if id(tn) in {id(u) for u in layer.tensors})
                   for layer, _ in kinds), default=0) * x.compute_bytes
        lm_head = " and the fp32 lm_head's" if head else ""
        if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
            total, what = one + cast_bytes(head), f"the rebuilt layer's adapters'{lm_head}"
        else:
            total = sum(local * cnt for _, local, cnt in adapters) * x.compute_bytes + cast_bytes(head)
            what = f"every adapter's{lm_head}"
    else:
        one = max(cast_bytes([(tn, 1) for tn in layer.tensors if tn.is_linear_weight]) for layer, _ in kinds)
        if t.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
            total, what = one + cast_bytes(head), "the rebuilt layer's and lm_head's"
        else:
            layers = [(tn, cnt) for layer, cnt in kinds for tn in layer.tensors if tn.is_linear_weight]
            total, what = cast_bytes(layers + head), "every linear weight's"
    cast_all = Term("workspace.autocast_weights", Kind.WORKSPACE, total,
                    f"{what} {x.compute_bytes}-byte copies (torch.autocast casts, kept for backward)")
    cast_layer = Term("workspace.autocast_weights", Kind.WORKSPACE, one, "one layer's autocast weight casts")
    return cast_all, cast_layer


def _eager_masks(kinds: tuple[tuple[LayerSpec, int], ...], x: Execution, t: TrainingConfig,
                 par: Parallelism) -> Term | None:
    """transformers' eager attention reads a materialized (b, 1, s, s) additive mask in the compute
    dtype, one per kind of attention (full, sliding window): ``masking_utils.create_causal_mask`` /
    ``create_sliding_window_causal_mask`` in the model's forward."""
    windows = {layer.attention.sliding_window for layer, _ in kinds
               if layer.attention.kind == "gqa" and x.eager}
    if not windows:
        return None
    s = t.seq_len // par.cp
    nbytes = len(windows) * cuda_block_bytes(t.micro_batch_size * s * t.seq_len * x.compute_bytes)
    return Term("activations.attention_masks", Kind.ACTIVATIONS, nbytes,
                f"{len(windows)} x b x s x s x {x.compute_bytes} B (eager attention's causal masks)")


def _logits_bytes(t: TrainingConfig, x: Execution) -> int:
    """Bytes of a logit: the compute dtype, or an fp32 lm_head's fp32 without autocast (QLoRA prepared by
    PEFT alone: its fp32 final norm output times its fp32 weight)."""
    if t.method is Method.QLORA and not x.autocast:
        return kbit_weight_bytes(t)[0]
    return x.compute_bytes


def _logits(spec: ModelSpec, t: TrainingConfig, fw: Framework, x: Execution, tokens: int,
            head_dequantized: int = 0) -> Term:
    """The logits at the start of their backward, on one rank (vocabulary split over tp).
    ``head_dequantized``: the bytes of an NF4 lm_head dequantized for its backward, in the same moment
    (:func:`_litgpt_logits_backward`)."""
    v = math.ceil(spec.vocab_size / t.parallelism.tp)
    c = _logits_bytes(t, x)
    if t.loss == Loss.LITGPT_CHUNKED:
        return _litgpt_logits_backward(t, tokens, v, c, head_dequantized)
    if t.loss == Loss.FUSED:
        per, formula = (2 * c + 8) * spec.hidden_size, f"b x s x h x (2 x {c} + 8) B (one chunk of b x s x h / V tokens' logits, fused CE)"
    elif t.loss == Loss.CHUNKED and t.torch_compile:
        return _compiled_chunked_logits(spec, x, tokens, v, c)
    elif t.loss == Loss.CHUNKED:
        # torchtune CEWithChunkedOutputLoss, eager: cross_entropy(chunk.float()) keeps each chunk's fp32 log-softmax
        per = 4 * v + (8 + c) * v / LOSS_CHUNKS
        formula = f"b x s x V/t x (4 B fp32 log-probs + (8 + {c}) B / {LOSS_CHUNKS} for one chunk's gradients)"
    elif fw is Framework.MEGATRON:
        per, formula = (4 + 2 * c) * v, f"b x s x V/t x (4 B fp32 softmax + 2 x {c} B logits and gradient)"
    elif _dtensor_loss_parallel(t, fw):
        # torch/distributed/tensor/parallel/loss.py _nll_loss_and_log_softmax_backward (read at a later main
        # than the 2024-12-23 nightly torchtitan 9dec370 ran, assumed unchanged there; eager: torchtitan
        # compiles the blocks, not the loss): the saved fp32 log-probs x, grad_input = zeros_like(x),
        # torch.exp(x) and their sum alive at once, then (grad_input + exp(x)) * grad_output in exp's place
        per, formula = 16 * v, "b x s x V/t x 16 B (DTensor loss_parallel backward: fp32 log-probs, zeros, exp, their sum)"
    elif _loss_at_logits_dtype(spec, x):
        per, formula = 3 * c * v, f"b x s x V/t x 3 x {c} B (log-probs, nll grad, log-softmax grad at the logits dtype)"
    else:
        per, formula = 12 * v, "b x s x V/t x 12 B (fp32 log-probs, nll grad, log-softmax grad)"
    return Term("logits", Kind.LOGITS, math.ceil(tokens * per), formula)


def _litgpt_last_chunk(t: ActivationsInput | TrainingConfig) -> int:
    """Tokens of litgpt's last lm_head chunk (``x.split(128, dim=1)``)."""
    return t.seq_len - LITGPT_HEAD_CHUNK * ((t.seq_len - 1) // LITGPT_HEAD_CHUNK)


def _litgpt_logits_forward(t: ActivationsInput | TrainingConfig, tokens: int, v: int) -> Term:
    """litgpt's loss forward (:attr:`Loss.LITGPT_CHUNKED`) at its last chunk's ``cross_entropy``, on one rank.

    Sources: litgpt ``finetune/lora.py`` ``fit()`` and ``utils.py`` ``chunked_cross_entropy`` at 00af8b0
    (lit-gpt 8641822 the same), lightning 2.4.0 ``fabric/wrappers.py`` ``_FabricModule.forward``:
    ``convert_output`` runs after the forward's dtype context, ``_convert_fp_tensor`` makes each c-byte chunk
    fp32 (``torch.get_default_dtype()``) and the c-byte chunks are freed with the model's list (``ToCopyBackward``
    saves nothing; the lm_head does not save its output). ``fit()``'s ``logits`` then holds the fp32 chunks
    (4 B), every chunk's ``cross_entropy`` saves its fp32 ``log_softmax`` (4 B): 8 B x b x s x V. With b > 1
    ``logits[-1][..., :-1, :]`` is not contiguous and ``reshape(-1, V)`` copies it (fp32, the last chunk less one
    position), alive through that chunk's cross_entropy. Measured on the CPU (benchmarks/litgpt_loss_path.py,
    b 1, s 512, V 32000, h 4096): 8.25 B x b s V = these 8 B + the head input's copy there (2 h / V = 0.26 B)."""
    b = t.micro_batch_size
    copy = 4 * b * (_litgpt_last_chunk(t) - 1) * v if b > 1 else 0
    formula = "b x s x V/t x 8 B (litgpt: the fp32 chunks fit() holds after Fabric's convert_output, their fp32 log-softmax)"
    if copy:
        formula += " + b x (last chunk - 1) x V/t x 4 B (reshape's copy of the shifted last chunk)"
    return Term("logits", Kind.LOGITS, tokens * 8 * v + copy, formula)


def _litgpt_logits_backward(t: ActivationsInput | TrainingConfig, tokens: int, v: int, c: int,
                            head_dequantized: int) -> Term:
    """litgpt's loss backward (:attr:`Loss.LITGPT_CHUNKED`), on one rank: the larger of its two phases.

    The autograd engine runs the ready node of the highest sequence number first; ``chunked_cross_entropy``
    made chunk k's ``log_softmax`` and ``nll_loss`` after chunk k - 1's, the reshapes before them, the fp32
    casts (``ToCopyBackward``, Fabric's ``convert_output``) before those and the lm_head's chunks first. So
    (sources as :func:`_litgpt_logits_forward`; torch ``LogSoftmaxBackward`` saves its result, freed after
    the node runs; ``NllLossBackward`` writes a zeroed fp32 gradient of the chunk's shape):

    1. every chunk's cross-entropy backward first: the fp32 chunks ``fit()``'s ``logits`` holds (4 B), the
       saved log-softmax of the chunks not yet run and the fp32 gradients of those run (4 B together), and
       at one 128-token chunk its nll gradient and its log-softmax gradient beside its saved result:
       8 B x b x s x V + 2 x 4 B x b x 128 x V;
    2. then every chunk's fp32 gradient cast to c bytes (``ToCopyBackward``), then the lm_head chunks' backward:
       at the first, the fp32 chunks (4 B) and every chunk's c-byte gradient, beside the NF4 lm_head
       dequantized for its matmul (``head_dequantized``, bitsandbytes 0.42 ``MatMul4Bit.backward``):
       (4 + c) B x b x s x V.

    The moment's other terms include ``head_dequantized``: the term is phase 2's logits, or phase 1's less the
    dequantized head where that is larger. Measured on the CPU (benchmarks/litgpt_loss_path.py, b 1, s 512,
    V 32000, h 4096, c 2): 4 V h + 6.26 B x b s V, phase 2 (4 + 2 B) + the head input's copy (0.26 B)."""
    b = t.micro_batch_size
    ce = tokens * 8 * v + 8 * b * min(LITGPT_HEAD_CHUNK, t.seq_len) * v
    head = tokens * (4 + c) * v
    if head + head_dequantized >= ce:
        return Term("logits", Kind.LOGITS, head,
                    f"b x s x V/t x (4 + {c}) B (litgpt, at the lm_head's backward: fit()'s fp32 chunks, every "
                    f"chunk's {c}-byte gradient)")
    return Term("logits", Kind.LOGITS, ce - head_dequantized,
                "b x s x V/t x 8 B + b x 128 x V/t x 8 B (litgpt, in the cross-entropy's backward: fit()'s fp32 "
                "chunks, the log-softmax saved or its gradient, one chunk's nll and log-softmax gradients)"
                + (" less the dequantized lm_head counted beside" if head_dequantized else ""))


def _dtensor_loss_parallel(t: ActivationsInput | TrainingConfig, fw: Framework) -> bool:
    """True when the vocabulary-sharded cross-entropy is DTensor's ``loss_parallel()``: FSDP2 with tp > 1
    (torchtitan 9dec370 ``ParallelDims.loss_parallel_enabled``: tp > 1 unless ``training.disable_loss_parallel``;
    ``parallelize_llama.apply_tp`` gives the lm_head ``ColwiseParallel(output_layouts=Shard(-1),
    use_local_output=False)`` and ``train.py`` runs ``cross_entropy(pred.flatten(0, 1).float(), labels)``
    under the context). Megatron's vocab-parallel cross-entropy is its own (:func:`_logits`)."""
    return fw is Framework.FSDP and t.parallelism.tp > 1


def _dtensor_gathers_head_input(t: ActivationsInput | TrainingConfig, fw: Framework) -> bool:
    """True when the lm_head keeps its all-gathered (b x s x h) input: DTensor's
    ``ColwiseParallel(input_layouts=Shard(1))`` redistributes the sequence-sharded final norm output to
    ``Replicate()`` in its input hook, and ``F.linear`` saves that full tensor for the weight's gradient
    (torch/distributed/tensor/parallel/style.py ``ColwiseParallel._prepare_input_fn``; torchtitan 9dec370
    ``apply_tp``'s ``"output"`` plan). Megatron's ``ColumnParallelLinear`` under sequence parallel keeps the
    s/tp shard and gathers it again in backward."""
    return fw is Framework.FSDP and t.parallelism.tp > 1 and t.parallelism.sequence_parallel


def _compiled_chunked_logits(spec: ModelSpec, x: Execution, tokens: int, v: int, c: int) -> Term:
    """torchtune ``CEWithChunkedOutputLoss`` with ``compute_cross_entropy`` compiled
    (``training.compile_loss``), at the start of its backward, on one rank.

    Source (torchtune commit 1814feb17, ``torchtune/modules/loss/ce_chunked_output_loss.py``,
    ``torchtune/training/_compile.py`` ``compile_loss``, ``recipes/lora_finetune_single_device.py``
    ``_loss_step``): the model returns ``num_output_chunks`` (K) chunks of c-byte logits, ``model.output``
    applied to each chunk of the hidden state; the recipe drops its list (``del logits``) once the loss is
    computed. Measured on CPU (tests/test_chunked_loss_measured.py, torch 2.13, inductor):

    - each compiled chunk saves its c-byte input logits for backward (inductor's partition recomputes the
      upcast and the softmax; the forward kernels keep one fp32 value per row, no fp32 chunk);
    - each compiled backward writes one c-byte chunk gradient (one fused kernel, no fp32 buffer);
    - the autograd engine runs every compiled chunk's backward before any output projection's backward
      (its ready queue takes the highest sequence number first): at the k-th, the K - k + 1 chunks not yet
      run keep their logits and the k run so far their gradients: K + 1 chunks, ``b x s x V/t x c x (1 + 1/K)``;
    - where the output projection's V/t x h weight trains (a full fine-tune; tied or not), the projections'
      backward then runs chunk by chunk, each freeing its chunk's gradient: at the second, K - 2 chunk
      gradients, the first projection's weight gradient, the second's, and their sum (autograd's
      ``InputBuffer::accumulate`` adds the two transposed gradients out of place; later ones in place):
      ``b x s x V/t x c x (K - 2)/K + 3 x V/t x h x g`` (g: the parameters' bytes, ``Execution.stream_bytes``;
      torch's ``matmul`` folds the chunk into one ``mm`` when the weight needs a gradient,
      ``aten/src/ATen/native/LinearAlgebra.cpp`` ``should_fold``). The larger of the two.
    """
    k = LOSS_CHUNKS
    ce = math.ceil(tokens * v * c * (k + 1) / k)
    formula = f"b x s x V/t x {c} B x (1 + 1/{k}) ({k} chunks' logits kept by the compiled loss, one chunk's gradient)"
    if x.lora is None:
        g = x.stream_bytes
        projection = math.ceil(tokens * v * c * (k - 2) / k) + 3 * v * spec.hidden_size * g
        if projection > ce:
            return Term("logits", Kind.LOGITS, projection,
                        f"b x s x V/t x {c} B x {k - 2}/{k} + 3 x V/t x h x {g} B (the output projections' backward: "
                        f"{k - 2} chunks' gradients, two of the trained weight's gradients and their sum)")
    return Term("logits", Kind.LOGITS, ce, formula)


def _loss_at_logits_dtype(spec: ModelSpec, x: Execution) -> bool:
    """True when the loss runs on the logits as they are, without ``ForCausalLMLoss``'s fp32 upcast:
    a masked LM's ``CrossEntropyLoss()(prediction_scores.view(-1, V), labels.view(-1))``
    (``transformers/models/bert/modeling_bert.py`` ``BertForMaskedLM``) outside autocast, which
    would run cross_entropy in fp32 (benchmarks/trace_findings.md §13)."""
    return spec.task == "masked_lm" and not x.autocast


def _logits_forward(spec: ModelSpec, t: TrainingConfig, fw: Framework, x: Execution, tokens: int) -> Term | None:
    """The logits inside the forward's loss, on one rank, where they differ from the backward's.

    transformers ``ForCausalLMLoss`` (``loss/loss_utils.py``): the c-byte logits, ``logits.float()``
    (none when c = 4) and ``cross_entropy``'s fp32 log-softmax are alive at once; before 4.49
    (:attr:`Loss.SHIFT_COPY`) also the upcast's shifted fp32 copy. torchtune
    ``CEWithChunkedOutputLoss`` (:func:`_compiled_chunked_logits`): every chunk's logits, with the eager loss
    also every chunk's fp32 log-softmax and one chunk's upcast. None for the other losses (their backward
    term is used).
    """
    v = math.ceil(spec.vocab_size / t.parallelism.tp)
    c = _logits_bytes(t, x)
    if t.loss == Loss.LITGPT_CHUNKED:
        return _litgpt_logits_forward(t, tokens, v)
    if t.loss == Loss.CHUNKED and t.torch_compile:
        return Term("logits", Kind.LOGITS, tokens * v * c,
                    f"b x s x V/t x {c} B (every chunk's logits: the recipe's list, saved by the compiled loss)")
    if t.loss == Loss.CHUNKED:
        # eager CEWithChunkedOutputLoss at its last chunk: the recipe's list of every chunk's c-byte logits, every
        # chunk's saved fp32 log-softmax and the last chunk's fp32 upcast (measured: _compiled_chunked_logits)
        per = c + 4 + (4 / LOSS_CHUNKS if c < 4 else 0)
        return Term("logits", Kind.LOGITS, math.ceil(tokens * per * v),
                    f"b x s x V/t x ({c} B logits + 4 B fp32 log-probs + one chunk's fp32 upcast)")
    if t.loss not in (Loss.DEFAULT, Loss.SHIFT_COPY) or fw is Framework.MEGATRON:
        return None
    if _loss_at_logits_dtype(spec, x):
        return Term("logits", Kind.LOGITS, tokens * 2 * c * v, f"b x s x V/t x 2 x {c} B (logits, log-softmax)")
    if _dtensor_loss_parallel(t, fw):
        # loss.py _log_softmax (the decomposition, all-reduces inserted): the logits, their fp32 upcast x,
        # shifted = x - x_max and torch.exp(shifted) (then result = shifted - logsumexp in exp's place)
        per = c + (4 if c < 4 else 0) + 8
        return Term("logits", Kind.LOGITS, tokens * per * v,
                    f"b x s x V/t x {per} B (logits, their fp32 upcast, DTensor loss_parallel's shifted and exp)")
    per = c + (4 if c < 4 else 0) + 4
    if t.loss == Loss.SHIFT_COPY:
        # transformers 4.48.1 ForCausalLMLoss: logits.float(), then logits[..., :-1, :].contiguous() (one
        # position fewer per sequence, counted whole) while the caller's logits and the upcast are still referenced
        return Term("logits", Kind.LOGITS, tokens * (per + 4) * v,
                    f"b x s x V/t x {per + 4} B (logits, their fp32 upcast, its shifted fp32 copy, fp32 log-softmax)")
    return Term("logits", Kind.LOGITS, tokens * per * v,
                f"b x s x V/t x {per} B (logits, their fp32 upcast, fp32 log-softmax)")
