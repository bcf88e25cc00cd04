"""LoRA / QLoRA by library (memest/estimate/training/qlora_base.py, lora.adapter_bytes, the litgpt
mechanisms in activations.py and states.py): each library's NF4 format, which weights it quantizes,
its adapters' dtype, and the stack that picks it. Expected bytes are derived by hand below."""

from __future__ import annotations

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.sharding import stages
from memest.estimate.training.protocol import states_input
from memest.estimate.training.qlora_base import NF4, base_bytes
from memest.estimate.training.states import model_states
from memest.estimate.training.step import moments
from memest.sources import load_model
from memest.workload import (
    Framework,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Loss,
    Method,
    Optimizer,
    Parallelism,
    Precision,
    TrainingConfig,
)
from memest.workload.resolve import resolve

LLAMA = "meta-llama/Llama-2-7b-hf"  # h 4096, i 11008, 32 layers, V 32000, untied lm_head, 32 KV heads
A10G = get_device("A10G")


@pytest.fixture(scope="module")
def llama():
    return load_model(LLAMA)


def _qlora(library: LoraLibrary, **changes) -> TrainingConfig:
    base = TrainingConfig(method=Method.QLORA, micro_batch_size=1, seq_len=512, precision=Precision.BF16,
                          optimizer=Optimizer.ADAMW_FUSED, framework=Framework.PYTORCH,
                          lora=LoraConfig(rank=8, targets="q_proj,v_proj"), prepare_kbit_training=KbitPrep.NONE,
                          lora_library=library)
    return base.replace(**changes)


@pytest.mark.parametrize(("library", "expected"), [
    # 4096 x 4096 = 16,777,216 weights: 8,388,608 B of 4-bit data; 16,777,216 / 64 = 262,144 blocks
    # peft (bitsandbytes double quant): uint8 absmax per block 262,144 + fp32 per 256 absmaxes 1,024 x 4 = 4,096
    (LoraLibrary.PEFT, 8_388_608 + 262_144 + 4_096),
    # litgpt bnb.nf4 (compress_statistics=False): fp32 absmax per block 262,144 x 4 = 1,048,576
    (LoraLibrary.LITGPT, 8_388_608 + 1_048_576),
    # torchtune (torchao NF4Tensor): int8 scaler per block 262,144 + bf16 factor per 256 scalers 1,024 x 2 = 2,048
    (LoraLibrary.TORCHTUNE, 8_388_608 + 262_144 + 2_048),
])
def test_each_library_stores_a_linear_weight_in_its_nf4_format(library, expected):
    assert NF4[library].tensor_bytes((4096, 4096)) == expected


def test_litgpt_quantizes_every_linear_and_the_lm_head(llama):
    # per layer: q, k, v, o 4 x 4096^2 = 67,108,864 + gate, up, down 3 x 11008 x 4096 = 135,266,304
    # = 202,375,168 weights; x 32 layers = 6,476,005,376; bnb.nf4 without double quant: 9/16 B each
    # (0.5 data + 4/64 absmax) = 3,642,753,024 B; lm_head 32000 x 4096 = 131,072,000 x 9/16 = 73,728,000 B;
    # embedding 131,072,000 x 2 B = 262,144,000 B; norms (2 x 32 + 1) x 4096 x 2 B = 532,480 B
    expected = 3_642_753_024 + 73_728_000 + 262_144_000 + 532_480
    got, words = base_bytes(llama.tensors(), Parallelism(), llama.num_kv_heads, LoraLibrary.LITGPT, 2, 2)
    assert got == expected
    assert "lm_head" in words
    # the estimate's weights term adds the bf16 adapters: r 8 on q and v: 2 x 8 x (4096 + 4096) x 32 layers
    # = 4,194,304 elements x 2 B = 8,388,608 B
    est = estimate(llama, _qlora(LoraLibrary.LITGPT), A10G)
    weights = next(t for t in est.per_device.terms if t.name == "weights")
    assert weights.bytes == expected + 8_388_608


def test_peft_keeps_the_lm_head_16_bit_and_fp32_adapters(llama):
    # the same base with double quant (0.5 + 1/64 + 4/16384 B per weight: 6,476,005,376 / 64 = 101,187,584
    # blocks; 101,187,584 / 256 = 395,264 fp32 scales) and a bf16 lm_head 262,144,000 B, adapters fp32 (4 B)
    linear = 3_238_002_688 + 101_187_584 + 395_264 * 4
    expected = linear + 2 * 262_144_000 + 532_480 + 4_194_304 * 4
    est = estimate(llama, _qlora(LoraLibrary.PEFT), A10G)
    assert next(t for t in est.per_device.terms if t.name == "weights").bytes == expected


def test_adapters_take_the_runs_dtype_outside_peft(llama):
    stage = stages(llama.num_layers, 1)[0]
    lora = _qlora(LoraLibrary.TORCHTUNE, method=Method.LORA)
    # 4,194,304 adapter elements (above): torchtune bf16 gradients 8,388,608 B; PEFT fp32 16,777,216 B
    tune = model_states(llama, states_input(lora), Framework.PYTORCH, stage)
    peft = model_states(llama, states_input(lora.replace(lora_library=LoraLibrary.PEFT)), Framework.PYTORCH, stage)
    assert (tune.grads_all.bytes, peft.grads_all.bytes) == (8_388_608, 16_777_216)


def test_litgpt_bitsandbytes_keeps_each_4bit_linears_input(llama):
    # bitsandbytes 0.42 MatMul4Bit saves its input A; per layer and token, beyond what the q / v adapters
    # already keep (the input norm's output, shared at dropout 0): o_proj's input 4096 x 2 B, the MLP's
    # input 4096 x 2 B (one tensor for gate and up), down_proj's input 11008 x 2 B = 38,400 B;
    # x 32 layers x 512 tokens = 629,145,600 B. litgpt's own attention (litgpt/model.py, lora.py at 00af8b0) adds,
    # per layer of 512 tokens: the fused qkv output kept through the V view (MHA) 3 x 4096 x 2 B x 512 = 12 MiB in
    # place of V's 4 MiB, and LoRAQKVLinear.zero_pad's index_copy_ source (the q and v LoRA outputs) 8192 x 2 B x
    # 512 = 8 MiB: 16 MiB x 32 = 536,870,912 B. down_proj's input, 11,272,192 B, is one CUDA block (its 2 MiB-rounded
    # segment leaves 1.25 MiB, which is split off), the others whole MiB
    def layers(library):
        est = estimate(llama, _qlora(library), A10G)
        return sum(t.bytes for t in est.per_device.terms if t.name == "activations.layers")
    assert layers(LoraLibrary.LITGPT) - layers(LoraLibrary.TORCHTUNE) == 629_145_600 + 536_870_912


def test_litgpt_nf4_lm_head_is_dequantized_in_its_forward_and_backward(llama):
    # 131,072,000 lm_head weights x (2 B fp16 from dequantize_4bit + 2 B bf16 cast) = 524,288,000 B, in the lm_head's
    # forward (beside its 512 x 32000 x 2 B = 32,768,000 B of bf16 chunk outputs) and at the loss backward
    by_moment = moments(llama, _qlora(LoraLibrary.LITGPT), A10G)
    for name in ("head_forward", "loss_backward"):
        assert [t.bytes for t in by_moment[name] if t.name == "workspace.dequantized_weight"] == [524_288_000]
    assert [t.bytes for t in by_moment["head_forward"] if t.name == "logits"] == [32_768_000]
    est = estimate(llama, _qlora(LoraLibrary.LITGPT), A10G)
    assert [t.bytes for t in est.per_device.terms if t.name == "workspace.dequantized_weight"] == [524_288_000]
    tune = moments(llama, _qlora(LoraLibrary.TORCHTUNE), A10G)
    assert "head_forward" not in tune  # a 16-bit lm_head: no dequantized weight, no such moment
    assert not [t for t in tune["loss_backward"] if t.name == "workspace.dequantized_weight"]


def test_litgpt_builds_its_own_lm_head_for_a_tied_checkpoint():
    gemma = load_model("google/gemma-2b")  # tied: V 256000 x h 2048 = 524,288,000 lm_head weights
    t = _qlora(LoraLibrary.LITGPT, method=Method.LORA, lora=LoraConfig(rank=8, targets="q_proj"))
    own = estimate(gemma, t, A10G).per_device.terms
    peft = estimate(gemma, t.replace(lora_library=LoraLibrary.PEFT), A10G).per_device.terms
    w = {name: next(x.bytes for x in terms if x.name == "weights") for name, terms in (("own", own), ("peft", peft))}
    # + 524,288,000 x 2 B of lm_head; adapters r 8 on q (2048 -> 2048): 8 x 4096 x 18 layers = 589,824
    # elements, 2 B (litgpt) instead of 4 B (PEFT): - 1,179,648 B
    assert w["own"] - w["peft"] == 1_048_576_000 - 1_179_648


def test_the_stack_picks_the_library_and_litgpt_qlora_runs_bf16_true(llama):
    assert resolve({"finetune": "qlora", "stack": "litgpt"}, llama, A10G).lora_library is LoraLibrary.LITGPT
    assert resolve({"finetune": "qlora", "stack": "litgpt"}, llama, A10G).precision is Precision.BF16
    assert resolve({"finetune": "lora", "stack": "litgpt"}, llama, A10G).precision is Precision.AMP  # bf16-mixed
    assert resolve({"finetune": "lora", "stack": "torchtune"}, llama, A10G).lora_library is LoraLibrary.TORCHTUNE
    assert resolve({"finetune": "lora", "stack": "trl"}, llama, A10G).lora_library is LoraLibrary.PEFT
    given = resolve({"finetune": "lora", "stack": "torchtune", "lora_library": "peft"}, llama, A10G)
    assert given.lora_library is LoraLibrary.PEFT  # what the user gives wins
    out = run_memest("hf", LLAMA, "--finetune", "qlora", "--stack", "litgpt", "--gpu", "A10G", "--seq-len", "512")
    assert out.returncode == 0, out.stderr
    line = " ".join(out.stdout.split())
    assert 'litgpt, precision="bf16-true" (quantize bnb.nf4): bf16 params and states' in line
    assert "lora_library litgpt" in line


def test_fsdp2_gathers_a_qlora_layer_in_nf4(llama):
    # torchao NF4Tensor.fsdp_pre_all_gather sends the quantized tensors. One layer: 202,375,168 linear weights
    # -> 101,187,584 B data + 3,162,112 int8 scalers + bf16 factors (4 x 1,024 + 3 x 2,752) x 2 B = 24,704 B;
    # its two norms 2 x 4096 x 2 B = 16,384 B: 104,390,784 B; two units while layers run: 208,781,568 B
    t = _qlora(LoraLibrary.TORCHTUNE, framework=Framework.FSDP, parallelism=Parallelism(dp=8, zero_stage=3))
    states = model_states(llama, states_input(t), Framework.FSDP, stages(llama.num_layers, 1)[0])
    running = states.lifetimes[1]  # STATE_LIFETIMES[1] = "gathered.running"
    assert [x.bytes for x in running if x.name == "workspace.gathered_layers"] == [208_781_568]


def test_the_compiled_chunked_loss_keeps_16_bit_logits(llama):
    # CEWithChunkedOutputLoss, b 1 x s 512, V 32000, 8 chunks: eager keeps fp32 log-probs
    # 512 x (4 x 32000 + (8 + 2) x 32000 / 8) = 86,016,000 B at the backward, and in the forward the bf16 list,
    # the fp32 log-probs and one chunk's upcast, 512 x 32000 x 6.5 = 106,496,000 B; compiled keeps the bf16 logits
    # and, at its backward, one chunk's gradient (tests/test_chunked_loss_measured.py): 512 x 32000 x 2 x 9 / 8 =
    # 36,864,000 B (forward: 32,768,000 B)
    from memest.estimate.training.activation_terms import activation_terms, activations_input

    def logits(compiled):
        t = _qlora(LoraLibrary.TORCHTUNE, loss=Loss.CHUNKED, torch_compile=compiled)
        terms = activation_terms(llama, activations_input(t), Framework.PYTORCH, stages(llama.num_layers, 1)[0])
        return {x.bytes for lifetime in terms.lifetimes for x in lifetime if x.name == "logits"}
    assert (logits(False), logits(True)) == ({86_016_000, 106_496_000}, {36_864_000, 32_768_000})


def test_torch_compile_runs_with_any_loss():
    # the compiled layers are modelled whatever the loss (tests/test_compile_float8.py); the job line says it
    for stack in ("hf-trainer", "torchtune"):
        ok = run_memest("hf", LLAMA, "--finetune", "lora", "--stack", stack, "--torch-compile", "--gpu", "A10G")
        assert ok.returncode == 0, ok.stderr
        assert "torch_compile True" in " ".join(ok.stdout.split())


def test_zero3_gathers_a_qlora_layer_in_nf4_and_trl_leaves_a_sharded_model_unprepared(llama):
    # bnb_4bit_quant_storage packs the NF4 data in 16-bit Params4bit that ZeRO-3 gathers as stored: one layer
    # in PEFT's format (double quant): 202,375,168 x 0.5 = 101,187,584 B + uint8 absmax 3,162,112 B + fp32
    # scales (4 x 1,024 + 3 x 2,752) x 4 B = 49,408 B + norms 16,384 B = 104,415,488 B; current + prefetched
    t = _qlora(LoraLibrary.PEFT, framework=Framework.DEEPSPEED, precision=Precision.MIXED,
               parallelism=Parallelism(dp=2, zero_stage=3))
    states = model_states(llama, states_input(t), Framework.DEEPSPEED, stages(llama.num_layers, 1)[0])
    gathered = [x.bytes for lifetime in states.lifetimes for x in lifetime if x.name == "workspace.gathered_params"]
    assert set(gathered) == {2 * 104_415_488}
    # trl SFTTrainer._prepare_peft_model skips prepare_model_for_kbit_training when is_sharded_qlora
    sharded = resolve({"finetune": "qlora", "stack": "trl", "gpus": 2, "fsdp": "full_shard"}, llama, A10G)
    assert sharded.prepare_kbit_training is KbitPrep.NONE
    assert resolve({"finetune": "qlora", "stack": "trl", "gpus": 2}, llama, A10G).prepare_kbit_training is KbitPrep.TRL


def test_litgpt_runs_a_composite_gelu_as_one_op():
    # phi-2 (gelu_new, i 10240, 32 layers): transformers' NewGELUActivation keeps 4 x i x 2 B per token,
    # litgpt's gelu(approximate="tanh") its input, i x 2 B: 3 x 10240 x 2 = 61,440 B less per token and layer;
    # x 31 layers (layer 0's MLP, parallel to its attention, reads the embedding's output, which needs no
    # gradient: it keeps nothing) x 512 tokens = 975,175,680 B (torchtune: the same bf16 adapters, transformers').
    # litgpt's own attention (litgpt/model.py, lora.py at 00af8b0) in all 32 layers (the q adapter makes layer 0's
    # active): the fused qkv output kept through the V view, 3 x 2560 x 2 B in place of V's 2560 x 2 B (+10,240),
    # zero_pad's index_copy_ source, the q LoRA output 2560 x 2 B (+5,120), and no residual dropout (transformers'
    # phi-2 resid_pdrop 0.1: two 1 B masks, -5,120): +10,240 B x 32 x 512 = 167,772,160 B fewer saved
    phi = load_model("microsoft/phi-2")
    t = _qlora(LoraLibrary.LITGPT, method=Method.LORA, lora=LoraConfig(rank=8, targets="q_proj"))

    def layers(library):
        est = estimate(phi, t.replace(lora_library=library), A10G)
        return sum(x.bytes for x in est.per_device.terms if x.name == "activations.layers")
    assert layers(LoraLibrary.TORCHTUNE) - layers(LoraLibrary.LITGPT) == 975_175_680 - 167_772_160


def test_litgpt_runs_its_own_attention(llama):
    # litgpt 0.4 (litgpt/model.py, lora.py at 00af8b0; its saved tensors also counted on the CPU with a MatMul4Bit
    # stand-in: 54.6 B x h per token on a GPU), Llama-2-7B, LoRA r 32 on q and v, dropout 0.05, bf16. Per token:
    #   input RMSNorm: its fp32 input 16,384 + rstd 4; its output (MatMul4Bit's A) 8,192
    #   LoRAQKVLinear: one dropout for q and v: its output 8,192 + mask 4,096; lora_A outputs 2 x 32 x 2 = 128;
    #     zero_pad's index_copy_ source, the q and v LoRA outputs (4096 + 4096) x 2 = 16,384
    #   the fused qkv output kept through the V view (MHA) 3 x 4096 x 2 = 24,576; q, k after rotary 2 x 8,192;
    #   the attention output 8,192 + logsumexp 32 x 4 = 128; its reshaped copy (proj's A) 8,192
    #   post-attention RMSNorm 16,384 + 4 + its output 8,192; the MLP 4 x 11008 x 2 = 88,064
    # = 223,496 B (transformers + PEFT-style dropouts per q / v, V alone, no index_copy_: 203,016 B)
    from memest.estimate.activations import layer_activations
    from memest.estimate.training.activation_terms import execution

    t = _qlora(LoraLibrary.LITGPT, lora=LoraConfig(rank=32, targets="q_proj,v_proj", dropout=0.05))
    acts = layer_activations(llama.reference_layer, hidden=4096, seq_len=512, x=execution(llama, t, Framework.PYTORCH))
    assert acts.inside + acts.outside == 223_496


def test_litgpt_bitsandbytes_042_inputs_outlive_the_backward(llama):
    # bitsandbytes 0.42 MatMul4Bit keeps its input as ctx.tensors, which autograd does not free after the node's
    # backward; litgpt's fit() keeps `logits` and `loss` (so the graph) until the next micro-batch's loss replaces
    # them. Llama-2-7B, 512 tokens, per layer: q/k/v's input (the input norm output) 4096 x 2 B x 512 = 4 MiB, o_proj's
    # 4 MiB, the MLP's (one tensor for gate and up) 4 MiB, down_proj's 11008 x 2 B x 512 = 11,272,192 B (one CUDA
    # block): 23,855,104 B x 32 = 763,363,328 B; less the first layer's q/k/v input, which needs no gradient
    # (ctx.tensors = (None, None)): - 4,194,304; plus the NF4 lm_head's input 4096 x 2 B x 512 = 4,194,304 B
    by_moment = moments(llama, _qlora(LoraLibrary.LITGPT), A10G)

    def named(moment):
        return [t.bytes for t in by_moment[moment] if t.name == "activations.previous_microbatch"]
    for moment in ("layer_forward", "head_forward", "loss_forward"):
        assert named(moment) == [763_363_328]
    for moment in ("loss_backward", "first_layer_backward", "last_layer_backward", "optimizer_step"):
        assert named(moment) == []  # fit() rebinds `loss` before the backward: the previous graph is freed
    assert estimate(llama, _qlora(LoraLibrary.LITGPT), A10G).extra["peak_moment"] == "head_forward"
    # PEFT's bitsandbytes keeps no input (ctx.tensors = (None, B)): nothing outlives its backward
    peft = moments(llama, _qlora(LoraLibrary.PEFT), A10G)
    assert not [t for terms in peft.values() for t in terms if t.name == "activations.previous_microbatch"]
