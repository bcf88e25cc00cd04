"""unsloth's LoRA kernels (``--lora-library unsloth``, the unsloth stack's): what a layer run by LoRA_QKV /
LoRA_W / LoRA_MLP and Fast_RMS_Layernorm keeps for backward (``unsloth/kernels/fast_lora.py``,
``rms_layernorm.py`` at commit c67183f, 2024-11-20; ``unsloth/models/llama.py`` ``patch_peft_model``), the
in-place backward of LoRA_MLP, and unsloth_zoo's checkpointer holding the rebuilt layer's output
(``gradient_checkpointing.py`` at commit 44a919cd)."""

from __future__ import annotations

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.activations import Execution, LoraActivations, backward_transient, layer_activations
from memest.sources import load_model
from memest.workload import (
    AttnImplementation,
    Framework,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Loss,
    Method,
    Optimizer,
    Precision,
    Recompute,
    Stack,
    TrainingConfig,
)
from memest.workload.resolve import resolve

H100 = get_device("H100-80GB")
LLAMA = "meta-llama/Llama-3.2-1B"

# Llama-3.2-1B: h 2048, 32 heads x 64, 8 KV heads, i 8192. Per token, bf16 (c = r = 2 B), what the unsloth layer
# keeps:
#   input norm output (LoRA_QKV's X)      2048 x 2 = 4,096   (the norm's own X is the layer input: no copy)
#   Q (rotated in place), K, V            2048 x 2 + 2 x 512 x 2 = 6,144
#   flash output (LoRA_W's X is a view)   4,096;  logsumexp 32 x 4 = 128
#   residual after attention (norm's X)   4,096;  post-attention norm output (LoRA_MLP's X) 4,096
#   e, g (LoRA_MLP)                       2 x 8192 x 2 = 32,768;  two fp32 rstd 2 x 4 = 8
KEPT = 4_096 + 6_144 + 4_096 + 128 + 4_096 + 4_096 + 32_768 + 8  # = 55,432
# LoRA_MLP.backward: DW = dY @ downW^T (8192 x 2 = 16,384) beside the output gradient (4,096) and the rebuilt
# layer's output the checkpointer holds (4,096); the forward's h = swiglu(e, g) (16,384) is a temporary
BACKWARD = 16_384 + 4_096 + 4_096  # = 24,576


@pytest.fixture(scope="module")
def llama():
    return load_model(LLAMA)


def _execution(**lora) -> Execution:
    adapters = LoraActivations(targets=lora.pop("targets", ()), all_linear=lora.pop("all_linear", True), rank=32,
                               adapter_bytes=4, dropout=lora.pop("dropout", 0.0))
    return Execution(compute_bytes=2, stream_bytes=2, quantized_outputs=True, lora=adapters, unsloth_kernels=True)


def test_an_unsloth_layer_keeps_what_its_kernels_save(llama):
    layer = llama.reference_layer
    acts = layer_activations(layer, hidden=2048, seq_len=4096, x=_execution())
    assert KEPT == 55_432
    assert acts.inside + acts.outside == KEPT
    # the recompute's own temporaries: swiglu's output until the down projection, beside the output gradient
    assert acts.recompute_extra == 16_384 + 4_096
    back = backward_transient(layer, seq_len=4096, x=_execution(), hidden=2048)
    assert back.inside + back.outside == BACKWARD
    # the module graph (PEFT over transformers) keeps more: the norms' fp32 copies, SiLU's output, the product
    generic = layer_activations(layer, hidden=2048, seq_len=4096,
                                x=Execution(compute_bytes=2, stream_bytes=2, quantized_outputs=True,
                                            lora=_execution().lora))
    assert generic.inside + generic.outside > KEPT + 8 * 2048


def test_unsloth_patches_only_a_fully_adapted_layer_without_dropout(llama):
    # patch_peft_model: only with lora_dropout == 0, and a block only when all its projections carry adapters
    layer = llama.reference_layer
    plain = Execution(compute_bytes=2, stream_bytes=2, quantized_outputs=True)
    for lora in ({"dropout": 0.05}, {"all_linear": False, "targets": ("q_proj", "v_proj")}):
        x = _execution(**lora)
        generic = Execution(compute_bytes=plain.compute_bytes, stream_bytes=2, quantized_outputs=True, lora=x.lora)
        assert layer_activations(layer, hidden=2048, seq_len=4096, x=x) == \
            layer_activations(layer, hidden=2048, seq_len=4096, x=generic)


def test_the_unsloth_stack_rebuilds_one_unsloth_layer(llama):
    # b 1 x s 2048 tokens: every kept tensor is a multiple of 512 B and either < 10 MiB or a multiple of 2 MiB
    # (e: 16,384 x 2048 = 32 MiB), so the CUDA blocks add nothing: 55,432 x 2048 = 113,524,736 B rebuilt;
    # the backward holds max(24,576, the recompute's 16,384 temporary + 4,096 output gradient) x 2048 = 50,331,648 B
    t = TrainingConfig(method=Method.QLORA, micro_batch_size=1, seq_len=2048, precision=Precision.BF16,
                       optimizer=Optimizer.ADAMW8BIT, recompute=Recompute.FULL, activation_offloading=True,
                       loss=Loss.FUSED, attn_implementation=AttnImplementation.FLASH_ATTENTION_2,
                       framework=Framework.PYTORCH, lora=LoraConfig(rank=32, targets="all-linear"),
                       prepare_kbit_training=KbitPrep.NONE, lora_library=LoraLibrary.UNSLOTH, stack=Stack.UNSLOTH)
    terms = {x.name: x.bytes for x in estimate(llama, t, H100).ranks[0].terms}
    assert terms["activations.recomputed_layer"] == 113_524_736
    assert terms["activations.backward"] == 50_331_648
    # unsloth's adapters are PEFT's (fp32) and its base transformers' NF4 (double quant): the weights are peft's
    peft = {x.name: x.bytes for x in estimate(llama, t.replace(lora_library=LoraLibrary.PEFT), H100).ranks[0].terms}
    assert terms["weights"] == peft["weights"]
    assert peft["activations.recomputed_layer"] > terms["activations.recomputed_layer"]


def test_the_unsloth_stack_picks_its_kernels_and_the_flag_names_them(llama):
    assert resolve({"finetune": "qlora", "stack": "unsloth"}, llama, H100).lora_library is LoraLibrary.UNSLOTH
    assert resolve({"finetune": "qlora", "stack": "trl"}, llama, H100).lora_library is LoraLibrary.PEFT
    given = resolve({"finetune": "qlora", "stack": "unsloth", "lora_library": "peft"}, llama, H100)
    assert given.lora_library is LoraLibrary.PEFT  # what the user gives wins
    out = run_memest("hf", LLAMA, "--finetune", "qlora", "--lora-library", "unsloth", "--gpu", "H100")
    assert out.returncode == 0, out.stderr
    assert "lora_library unsloth" in " ".join(out.stdout.split())
    t = resolve({"finetune": "qlora", "lora_library": "unsloth"}, llama, H100)
    assert any("unsloth's LoRA kernels" in line for line in estimate(llama, t, H100).assumptions)


def test_a_misspelt_library_is_refused_naming_the_choices():
    out = run_memest("hf", LLAMA, "--finetune", "qlora", "--lora-library", "unslot", "--gpu", "H100")
    assert out.returncode == 2
    assert "unsloth" in out.stderr and "Traceback" not in out.stderr
