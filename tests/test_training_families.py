"""Per-family training terms, each number counted by hand from the transformers 5.24 module code.

The layers are the tiny configs of tests/trace_models.py (real catalog configs shrunk to h 256,
8 query heads, head_dim 32, i 704 or 4h, 4 routed experts of which 2 per token), bf16 (c = r = 2).
Every per-token count below lists the tensors autograd keeps, in bytes; the trace of the same
configs (tests/test_trace_agreement.py) sees the same tensors.
"""

from __future__ import annotations

import pytest
from trace_models import tiny_config

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.activations import Execution, LoraActivations, layer_activations
from memest.estimate.runtime import cuda_block_bytes
from memest.estimate.training import moments
from memest.result import Kind
from memest.sources import load_model, spec_from_config
from memest.sources.config import HFConfig
from memest.spec import Component
from memest.workload import LoraConfig, Method, Parallelism, Precision, TrainingConfig

H100 = get_device("H100-80GB")
MiB = 1 << 20


def _per_token(family: str) -> float:
    spec = spec_from_config(tiny_config(family))
    x = Execution(compute_bytes=2, stream_bytes=2, hidden_dropout=spec.hidden_dropout,
                  attention_dropout=spec.attention_dropout)
    return layer_activations(spec.reference_layer, hidden=spec.hidden_size, seq_len=256, x=x).per_rank(1, False)


# RMSNorm (LlamaRMSNorm) over h = 256 with a trained weight, output read by its linears:
# fp32 copy 4h 1024 + rstd 4 + normalized bf16 2h 512 + output 2h 512
LLAMA_NORM = 1024 + 4 + 512 + 512
# a gated MLP of i = 704: gate, activation output, up, product, 2 B each
GATED_MLP = 4 * 704 * 2


@pytest.mark.parametrize(("family", "expected"), [
    # Gemma's norm multiplies the fp32 normalized input by (1 + w): 4h fp32 instead of 2h: 1024 + 4 + 1024 + 512;
    # attention: q 2 x 8 x 32 = 512, k and v one KV head 64 each, output 512, fp32 logsumexp 4 x 8 = 32
    ("gemma", 2 * (1024 + 4 + 1024 + 512) + (512 + 64 + 64 + 512 + 32) + GATED_MLP),
    # Qwen3's per-head q_norm / k_norm (rms over head_dim, rstd per head): q 4 x 256 + 4 x 8 + 2 x 256 = 1568,
    # k (2 heads) 4 x 64 + 4 x 2 + 2 x 64 = 392; attention q 512, k 128, v 128, output 512, logsumexp 32
    ("qwen3", 2 * LLAMA_NORM + 1568 + 392 + (512 + 128 + 128 + 512 + 32) + GATED_MLP),
    # GPT-2: two 1-byte dropout masks 2 x 256; LayerNorms keep input 512 + mean/rstd 8 + output 512; the fused
    # c_attn output 3 x 512 (Q, K, V are views of it: no rotary), output 512, logsumexp 32; gelu_new (i = 1024)
    # keeps four i-sized intermediates 4 x 2048 and the product 2048
    ("gpt2", 512 + 2 * 1032 + 1536 + 512 + 32 + 4 * 2048 + 2048),
    # Phi: one LayerNorm shared by attention and MLP (1032); partial rotary by torch.cat: q, k new, v, output
    # 4 x 512, logsumexp 32, and the flash output's contiguous copy read by dense 512; gelu_new 4 x 1408 + 1408
    ("phi", 1032 + 4 * 512 + 32 + 512 + 4 * 1408 + 1408),
    # OLMo-2: no pre-norms: q/k/v read the layer input 512; full-width q_norm fp32 1024 + 4 + 1024 and k_norm
    # 128 + 4 + 128; q 512, k 64, v 64, output 512, logsumexp 32; post-attention norm 1024 + 4 + 1024 (its
    # output only added); the MLP reads the residual 512; post-MLP norm 2052
    ("olmo2", 512 + 2052 + 260 + (512 + 64 + 64 + 512 + 32) + 2052 + 512 + GATED_MLP + 2052),
    # Mixtral: norms 2 x 2052 (the router reads the second's output); attention 1184; router softmax fp32
    # 4 x 4 = 16; routing bookkeeping 40 x 2 + 4 = 84; tokens gathered 2 x 512; two routed copies of the gated
    # MLP 2 x 5632; expert outputs kept for the routing weights 2 x 512
    ("mixtral", 2 * LLAMA_NORM + (512 + 64 + 64 + 512 + 32) + 16 + 84 + 1024 + 2 * GATED_MLP + 1024),
])
def test_layer_saved_tensors_per_family(family, expected):
    assert _per_token(family) == expected


def test_eager_only_family_keeps_the_scores_whatever_is_asked():
    # BLOOM has no SDPA path in transformers 5.24 (ModelSpec.sdpa_supported): eager at s = 256 even when sdpa
    # is asked. LayerNorms 2 x 1032; q, K, V copies 3 x 512; fp32 softmax 4 x 8 x 256 = 8192 and its bf16 cast
    # 4096; the output's contiguous copy 512; GeLU (i = 1024) input and product 2 x 2048
    spec = spec_from_config(tiny_config("bloom"))
    assert not spec.sdpa_supported
    w = TrainingConfig(micro_batch_size=2, seq_len=256, precision=Precision.BF16)
    layers = {t.name: t.bytes for t in moments(spec, w, H100)["loss_backward"]}["activations.layers"]
    per_token = 2 * 1032 + 3 * 512 + 8192 + 4096 + 512 + 2 * 2048
    assert per_token == 20_496
    assert layers == 2 * 512 * per_token  # 2 layers x 512 tokens (every tensor a multiple of 512 B)


def test_gpt_oss_clamped_swiglu_per_route():
    # GptOssExperts._apply_gate keeps per routed copy: gate_up 2 x 1408, the clamped gate, the sigmoid, up + 1,
    # the GLU and their product (5 x 1408): 7 x 1408 = 9856 per route, two routes
    spec = spec_from_config(tiny_config("gpt_oss"))
    layer = spec.reference_layer
    x = Execution(compute_bytes=2, stream_bytes=2, eager=True, repeat_kv=True)
    saved = layer_activations(layer, hidden=256, seq_len=256, x=x).tensors
    per_route = sum(t.width for t in saved if t.what.endswith("x topk"))
    assert per_route == 2 * 7 * 1408


def test_gpt_oss_lora_recompute_holds_the_experts_locals():
    # Non-reentrant checkpointing rebuilds an MoE layer when its backward first unpacks a saved tensor: the index
    # by the inverse permutation in grouped_mm_experts_forward (transformers/integrations/moe.py), after the
    # output gradient (r h = 512) and the contiguous gradient of weighted_out.view(tokens, topk, h).sum(1)
    # (topk h c = 1024, bf16 routing weights) exist. Its forward then reaches _apply_gate holding, beyond what
    # autograd keeps, with frozen experts: the post-attention norm output (h c = 512) and the gathered tokens
    # (topk h c = 1024), selected_biases = gate_up_proj_bias[expert_ids] (topk 2i c = 2 x 1408 x 2 = 5632),
    # the clamped up and the gated output (2 x topk i c = 2 x 2816); the expert outputs (topk h c = 1024) are
    # not made yet. The traced peak of tiny gpt-oss LoRA + full recompute holds exactly these among its live
    # tensors (benchmarks/trace_agreement.py --details gpt_oss/lora-recompute lists the largest): index
    # (1024, 1408), clamp x2 and mul x2 (1024, 704), index (1024, 256), clone (512, 2, 256), all bf16.
    spec = spec_from_config(tiny_config("gpt_oss"))
    lora = LoraActivations(targets=frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}), all_linear=False, rank=16)
    x = Execution(compute_bytes=2, stream_bytes=2, eager=True, repeat_kv=True, lora=lora, routing_bytes=2)
    acts = layer_activations(spec.reference_layer, hidden=256, seq_len=256, x=x)
    assert acts.recompute_extra == 512 + 1024 + (512 + 1024 + 5632 + 2 * 2816 - 1024)


def test_gpt_bigcode_mask_buffer_is_weights_not_parameters():
    # GPTBigCodeModel keeps a (n_positions x n_positions) bool tril buffer: 8192^2 B = 64 MiB for OctoCoder
    spec = load_model("bigcode/octocoder")
    assert spec.buffer_bytes == 8192 * 8192 == 64 * MiB
    assert spec.num_params == sum(t.numel * n for t, n in spec.tensors())  # the buffer is no parameter
    est = estimate(spec, TrainingConfig(seq_len=512, parallelism=Parallelism(dp=8, zero_stage=3)), H100)
    assert est.per_device.term("weights.buffers").bytes == 64 * MiB
    assert est.per_device.term("weights.buffers").kind is Kind.WEIGHTS


P = 202_048
"""Parameters of the ``tiny`` fixture (tests/conftest.py): embed 64,000 + 2 x 36,992 + 64 + 64,000."""
BF16_TENSORS = 2 * P + 5 * (512 - 128)
"""Its bf16 parameters, each in a 512-B block (the five 64-element norms take 512 B instead of 128)."""


def test_deepspeed_bf16_zero0_step_copies_gradients_to_fp32(tiny):
    # DeepSpeed 0.19.5, bf16 at ZeRO 0: FP16_Optimizer (deepspeed/runtime/fp16/fused_optimizer.py). Its step
    # builds p.grad.to(fp32) for every parameter (one block each: 4 B x 64 = 256 B norms take 512, every other
    # tensor is a multiple of 512: 4P + 5 x (512 - 256)) and flattens them (4P = 808,192 B -> 808,448) while the
    # bf16 param.grad still exist (BF16_TENSORS); master and FusedAdam m, v are unsharded flat tensors
    # (3 x 808,448)
    w = TrainingConfig(micro_batch_size=2, seq_len=32)
    m = moments(tiny, w, H100)
    step = {t.name: t.bytes for t in m["optimizer_step"]}
    assert step["gradients"] == BF16_TENSORS
    assert step["workspace.fp32_grad_copies"] == 4 * P + 5 * (512 - 256)
    assert step["workspace.fp32_gradients"] == 808_448
    assert step["optimizer_states.master"] + step["optimizer_states.moments"] == 3 * 808_448
    # the engine's zero_grad after the step (engine.py _take_model_step) leaves no gradient to the forward;
    # inside the loss the bf16 logits, their fp32 upcast and the fp32 log-softmax: (2 + 4 + 4) B x 2 x 32 x V 1000
    forward = m["loss_forward"]
    assert sum(t.bytes for t in forward if t.kind is Kind.GRADIENTS) == 0
    assert {t.name: t.bytes for t in forward}["logits"] == 10 * 64 * 1000
    # with dp = 4 nothing is partitioned: the same master and moments
    w4 = TrainingConfig(micro_batch_size=2, seq_len=32, parallelism=Parallelism(dp=4))
    step4 = {t.name: t.bytes for t in moments(tiny, w4, H100)["optimizer_step"]}
    assert step4["optimizer_states.master"] + step4["optimizer_states.moments"] == 3 * 808_448


def test_lora_first_layer_input_needs_no_gradient(tiny):
    # PEFT enables input gradients only under gradient checkpointing: layer 0's input norm (weight frozen,
    # input without gradient) keeps nothing, where layer 1's keeps its fp32 copy 4h = 256 and rstd 4 per token.
    # Per layer of 64 tokens every tensor is a multiple of 512 B but the two norms' rstd (256 B: a 512-B block
    # each, +2 x 256); layer 0 lacks one norm's fp32 copy (64 x 256) and rstd block (512)
    w = TrainingConfig(method=Method.LORA, micro_batch_size=2, seq_len=32, precision=Precision.BF16)
    x = Execution(compute_bytes=2, stream_bytes=2, lora=LoraActivations(
        targets=frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}), all_linear=False, rank=16))
    one = layer_activations(tiny.layers[0], hidden=64, seq_len=32, x=x).per_rank(1, False)
    layers = {t.name: t.bytes for t in moments(tiny, w, H100)["loss_backward"]}["activations.layers"]
    per_layer = 64 * one + 2 * 256
    assert layers == 2 * per_layer - (64 * 256 + 512)


def test_deepspeed_keeps_an_fp32_master_of_fp32_adapters(tiny):
    # LoRA r=16 on q (64 -> 64), k and v (64 -> 32), o (64 -> 64): 16 x (128 + 96 + 96 + 128) = 7168 per layer,
    # 14,336 in all; DeepSpeed's flat fp32 master: 57,344 B = 112 blocks of 512 B
    w = TrainingConfig(method=Method.LORA, seq_len=16, lora=LoraConfig(rank=16))
    step = {t.name: t.bytes for t in moments(tiny, w, H100)["optimizer_step"]}
    assert step["optimizer_states.master"] == 4 * 14_336 == 57_344


def test_vision_tower_gets_no_gradient_in_a_text_step():
    # Gemma 3's SigLIP tower and projector (component other, before the first layer) never run on text: the
    # bf16 param.grad of a plain PyTorch step cover the other parameters only, each in its own block
    spec = spec_from_config(tiny_config("gemma3"))
    w = TrainingConfig(micro_batch_size=1, seq_len=16, precision=Precision.BF16)
    step = moments(spec, w, H100)["optimizer_step"]
    weights = sum(t.bytes for t in step if t.kind is Kind.WEIGHTS)
    grads = sum(t.bytes for t in step if t.kind is Kind.GRADIENTS)
    vision = sum(cuda_block_bytes(2 * t.numel) for t in spec.embedding if t.component is Component.OTHER)
    assert vision > 0
    assert grads == weights - vision


def test_fsdp2_all_gather_stream_pool_is_reserved(tiny):
    # FSDP2 allocates the all-gather outputs on their own stream; its cached blocks (the root unit's, embed +
    # final norm + lm_head = 128,064 params, and a layer's, 36,992) stay reserved: 256,128 B -> 256,512 and
    # 73,984 B -> 74,240
    w = TrainingConfig(seq_len=16, precision=Precision.FSDP2, parallelism=Parallelism(dp=4, zero_stage=3))
    pool = estimate(tiny, w, H100).per_device.term("allocator.all_gather_stream")
    assert pool.kind is Kind.ALLOCATOR
    assert pool.bytes == 256_512 + 74_240


@pytest.mark.parametrize(("nbytes", "block"), [
    (0, 0),
    (1, 512),
    (int(21.5 * MiB), 22 * MiB),            # an FSDP2 shard of Llama-2-7B's MLP at N=8: 0.5 MiB left, unsplit
    (2048 * 11008 * 2, 44 * MiB),           # a (2048, 11008) bf16 activation, 43 MiB
    (21_600_000, 21_600_256),               # 1.4 MiB left in its 22 MiB segment: split off
    (1_500_000, 1_500_160),                 # under 10 MiB: a 512-B multiple of a shared 20 MiB segment
], ids=["empty", "one-byte", "fsdp-shard", "mlp-activation", "split", "mid-size"])
def test_caching_allocator_blocks(nbytes, block):
    assert cuda_block_bytes(nbytes) == block
