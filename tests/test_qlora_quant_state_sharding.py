"""bitsandbytes quant states under FSDP / ZeRO-3: whole on every rank (``qlora_base.unsharded_state_bytes``).

transformers 4.48.1 ``modeling_utils._load_state_dict_into_meta_model`` quantizes each weight on the GPU and, under
FSDP or ZeRO-3, moves only ``value.data`` to the CPU / meta device, keeping ``value.__dict__`` (the ``QuantState``)
on the GPU; FSDP and ZeRO-3 shard parameters only. Hand-derived with Mistral-7B-v0.1 (h 4,096, 8 KV heads of 128,
MLP 14,336, 32 layers) and transformers' NF4 with double quant: one uint8 absmax per 64 weights, one fp32 scale per
256 absmaxes.
"""

from __future__ import annotations

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.training import qlora_base
from memest.sources import load_model
from memest.workload import (
    Framework,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Method,
    Parallelism,
    Precision,
    Recompute,
    TrainingConfig,
)

# per layer: q, o (4,096 x 4,096): 262,144 absmax B + 1,024 x 4 B = 266,240 each; k, v (1,024 x 4,096): 65,536 +
# 256 x 4 = 66,560 each; gate, up, down (14,336 x 4,096): 917,504 + 3,584 x 4 = 931,840 each.
# 2 x 266,240 + 2 x 66,560 + 3 x 931,840 = 3,461,120 B per layer; x 32 = 110,755,840 B
MISTRAL_QUANT_STATES = 110_755_840


def test_mistral_quant_states_by_hand():
    spec = load_model("mistralai/Mistral-7B-v0.1")
    layer = [(tn, 32) for tn in spec.reference_layer.tensors]
    k = spec.num_kv_heads
    assert qlora_base.unsharded_state_bytes(layer, Parallelism(), k, LoraLibrary.PEFT) == MISTRAL_QUANT_STATES
    # torchao's NF4Tensor shards its scalers with its data
    assert qlora_base.unsharded_state_bytes(layer, Parallelism(), k, LoraLibrary.TORCHTUNE) == 0


def _qlora(n: int) -> TrainingConfig:
    t = TrainingConfig(method=Method.QLORA, micro_batch_size=1, seq_len=512, precision=Precision.BF16,
                       recompute=Recompute.FULL, prepare_kbit_training=KbitPrep.NONE,
                       lora=LoraConfig(rank=16, targets="q_proj,k_proj,v_proj,o_proj"))
    if n == 1:
        return t.replace(framework=Framework.PYTORCH)
    return t.replace(framework=Framework.FSDP, parallelism=Parallelism(dp=n, zero_stage=3))


def test_fsdp_shards_all_but_the_quant_states():
    # weights on one GPU W1 = B + A (base B with its quant states Q, adapters A); FULL_SHARD over 2:
    # W2 = (B - Q + A) / 2 + Q, so 2 x W2 - W1 = Q (to a byte of rounding)
    spec = load_model("mistralai/Mistral-7B-v0.1")
    a100 = get_device("A100-80GB")

    def weights(n: int) -> int:
        return next(t.bytes for t in estimate(spec, _qlora(n), a100).per_device.terms if t.name == "weights")

    assert abs(2 * weights(2) - weights(1) - MISTRAL_QUANT_STATES) <= 2
