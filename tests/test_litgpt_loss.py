"""litgpt's LoRA / QLoRA loss path (:attr:`Loss.LITGPT_CHUNKED`): bytes per logit element derived by hand from
the source (litgpt ``finetune/lora.py`` ``fit()``, ``utils.py`` ``chunked_cross_entropy`` at 00af8b0; lightning
2.4.0 ``fabric/wrappers.py`` / ``plugins/precision/half.py`` ``convert_output`` to fp32) and checked on the CPU
by ``benchmarks/litgpt_loss_path.py`` (its .md)."""

from __future__ import annotations

from memest.estimate.sharding import stages
from memest.estimate.training.activation_terms import activation_terms, activations_input
from memest.estimate.training.table import ACTIVATION_LIFETIMES
from memest.sources import load_model
from memest.workload import Framework, LoraConfig, LoraLibrary, Loss, Method, Precision, TrainingConfig

# Llama-2-7B: V 32,000, h 4,096, its own lm_head
V, H = 32_000, 4_096


def _lifetimes(t: TrainingConfig) -> dict[str, tuple]:
    """Llama-2-7B's activation terms under ``t``, by lifetime (one stage, eager PyTorch)."""
    spec = load_model("meta-llama/Llama-2-7b-hf")
    terms = activation_terms(spec, activations_input(t), Framework.PYTORCH, stages(spec.num_layers, 1)[0])
    return dict(zip(ACTIVATION_LIFETIMES, terms.lifetimes))


def _logits(t: TrainingConfig) -> dict[str, int]:
    return {name: x.bytes for name, lifetime in _lifetimes(t).items()
            for x in lifetime if x.name == "logits" and name in ("logits.forward", "logits.backward")}


def _job(method: Method, b: int) -> TrainingConfig:
    return TrainingConfig(method=method, micro_batch_size=b, seq_len=512, precision=Precision.BF16,
                          framework=Framework.PYTORCH, lora=LoraConfig(rank=8, targets="q_proj,v_proj"),
                          lora_library=LoraLibrary.LITGPT, loss=Loss.LITGPT_CHUNKED)


def test_litgpt_lora_loss_holds_fp32_chunks_and_peaks_in_the_cross_entropy_backward():
    # b 2 x s 512: N = 1,024 x 32,000 = 32,768,000 logit elements, 4 chunks of 128 tokens.
    # forward, at the last chunk's cross_entropy: fit()'s fp32 chunks (convert_output; the bf16 ones freed) 4 B and
    # every chunk's fp32 log-softmax 4 B: 8 x N = 262,144,000; b > 1: reshape copies the shifted last chunk,
    # 4 B x 2 x 127 x 32,000 = 32,512,000 -> 294,656,000 B (the default loss: 10 x N = 327,680,000).
    # backward, frozen bf16 head (nothing dequantized): the cross-entropy's phase, 8 x N + one 128-token chunk's
    # nll and log-softmax gradients 2 x 4 B x 2 x 128 x 32,000 = 65,536,000 -> 327,680,000 B (default: 12 x N).
    # CPU (benchmarks/litgpt_loss_path.md, plain head, b 2, s 512): 9.00 and 10.01 B x b s V (= 294,912,000 and
    # 327,680,000 at this N; the head input's copy apart)
    assert _logits(_job(Method.LORA, 2)) == {"logits.forward": 294_656_000, "logits.backward": 327_680_000}


def test_litgpt_qlora_loss_backward_peaks_at_the_nf4_heads_backward():
    # b 1 x s 512: N = 16,384,000. forward 8 x N = 131,072,000 (b 1: the shifted last chunk's reshape is a view).
    # backward: the head's phase, fp32 chunks 4 B + every chunk's bf16 gradient 2 B = 6 x N = 98,304,000, beside
    # the dequantized NF4 head 32,000 x 4,096 x (2 + 2) = 524,288,000 (622,592,000 together) > the cross-entropy's
    # phase 8 x N + 8 B x 128 x 32,000 = 163,840,000. CPU (benchmarks/litgpt_loss_path.md, NF4 stand-in): 4 V h + 6.26 B
    # x b s V, the 0.26 the head input's copy.
    assert _logits(_job(Method.QLORA, 1)) == {"logits.forward": 131_072_000, "logits.backward": 98_304_000}


def _autocast_bytes(t: TrainingConfig) -> int:
    return sum(x.bytes for x in _lifetimes(t).get("autocast.all", ()))


def test_litgpt_lora_under_bf16_mixed_casts_the_frozen_head_once_per_chunk():
    # bf16-mixed (litgpt's default for training): the fp32 frozen lm_head, 32,000 x 4,096, is cast to bf16 by each
    # of the 512 / 128 = 4 chunks' F.linear (autocast caches no cast of a tensor without requires_grad) and every
    # copy is kept for its chunk's input gradient: 4 x 262,144,000 B where one chunked-less head keeps one, so
    # 3 x 32,000 x 4,096 x 2 = 786,432,000 B more than the default loss's single head forward
    t = _job(Method.LORA, 1).replace(precision=Precision.AMP)
    assert _autocast_bytes(t) - _autocast_bytes(t.replace(loss=Loss.DEFAULT)) == 786_432_000


def test_the_litgpt_stack_runs_its_chunked_loss_for_lora_and_qlora_only():
    # litgpt finetune/lora.py fit() calls model(input_ids, lm_head_chunk_size=128) and chunked_cross_entropy;
    # finetune/full.py (00af8b0) calls model(input_ids) and is not this path
    from memest.devices import get_device
    from memest.workload.resolve import resolve

    spec, gpu = load_model("meta-llama/Llama-2-7b-hf"), get_device("A10G")
    for method in ("lora", "qlora"):
        assert resolve({"finetune": method, "stack": "litgpt"}, spec, gpu).loss is Loss.LITGPT_CHUNKED
    assert resolve({"train": True, "stack": "litgpt"}, spec, gpu).loss is Loss.DEFAULT
    assert resolve({"finetune": "lora", "stack": "litgpt", "loss": "fused"}, spec, gpu).loss is Loss.FUSED
