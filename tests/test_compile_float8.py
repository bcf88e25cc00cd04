"""torch.compile's and torchao float8's saved tensors, FSDP2's float8 all-gather, their settings and readers.

The expected bytes are derived by hand below from the tensors inductor's partitioner saves (torch 2.13.0
``torch/_functorch/partitioners.py``; the listing and measurement in ``benchmarks/compile_findings.md``).
The tiny Llama layer (tests/cpu_measure.py ``tiny_llama_config``, bf16): h 256, i 640, 8 heads, 2 KV heads,
head_dim d 32, so a·d = 256 and k·d = 64; c = r = 2 B.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cpu_measure import tiny_llama_config, write_config
from inprocess import run_memest

from memest.errors import InputError
from memest.estimate.activations import layer_activations
from memest.estimate.sharding import stages
from memest.estimate.training.activation_terms import activation_terms, activations_input, execution
from memest.estimate.training.protocol import states_input
from memest.estimate.training.states import model_states
from memest.sources import load_model
from memest.workload import (
    Float8,
    Framework,
    LoraConfig,
    LoraLibrary,
    Method,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    TrainingConfig,
    files,
)
from memest.workload.validate import validate

ROOT = Path(__file__).resolve().parents[1]
TITAN_405B = ROOT / "benchmarks/data/configs/pytorch/torchtitan/9dec370ad26b/train_configs/llama3_405b.toml"
LLAMA = "meta-llama/Llama-2-7b-hf"


def _spec(tmp_path, **overrides):
    cfg = tiny_llama_config(torch_dtype="bfloat16", **overrides)
    return load_model(str(write_config(tmp_path, cfg)))


def _layer_bytes(spec, **changes) -> float:
    t = TrainingConfig(precision=Precision.BF16, lora=LoraConfig(rank=8, targets="q_proj,v_proj"),
                       lora_library=LoraLibrary.TORCHTUNE).replace(**changes)
    x = execution(spec, activations_input(t), Framework.PYTORCH)
    la = layer_activations(spec.layers[1], hidden=spec.hidden_size, seq_len=128, x=x)
    return la.inside + la.outside


def test_compiled_llama_layer_saves_the_partitioners_cut(tmp_path):
    spec = _spec(tmp_path)
    # eager (transformers 5.24 LlamaDecoderLayer, SDPA): each RMSNorm keeps its fp32 input 4h, rstd 4, the
    # normalized input 2h (its weight trains) and its output 2h for the linears: 2 x (8h + 4) = 4,104; q, k, v
    # after rotary 2 x (256 + 64 + 64) = 768, attention output 512, logsumexp 4 x 8 = 32: 1,312; SwiGLU's gate,
    # SiLU output, up and product 4 x 2i = 5,120: 10,536 B per token (measured: benchmarks/compile_findings.md)
    assert _layer_bytes(spec) == 10_536
    # compiled: each norm keeps its input in bf16 2h (the layer input; the output projection's output for the
    # second) and rstd 4, and its output 2h the weight-gradient matmuls read: 2 x (4h + 4) = 2,056; attention
    # as eager 1,312; the gate, up and product 3 x 2i = 3,840 (SiLU's output recomputed): 7,208 B
    assert _layer_bytes(spec, torch_compile=True) == 7_208


def test_compiled_lora_layer(tmp_path):
    spec = _spec(tmp_path)
    # LoRA on q, v (torchtune bf16 adapters, r 8), frozen norms. Eager: 2 norms x (4h fp32 input + 4) = 2,056;
    # the adapters' shared input (norm output) 2h = 512 and two lora_A outputs 2 x 2 x 8 = 32; attention 1,312;
    # the frozen MLP keeps gate, SiLU output and up 3 x 2i = 3,840: 7,752 B
    assert _layer_bytes(spec, method=Method.LORA) == 7_752
    # compiled: 2 norms x (2h bf16 input + 4) = 1,032; norm output 512 and lora_A outputs 32; attention 1,312;
    # gate and up 2 x 2i = 2,560: 5,448 B
    assert _layer_bytes(spec, method=Method.LORA, torch_compile=True) == 5_448


def test_wider_compiled_layer(tmp_path):
    spec = _spec(tmp_path, hidden_size=512, intermediate_size=1408, num_key_value_heads=4)
    # h 512, i 1408, 8 heads of 64, 4 KV heads: a·d 512, k·d 256. Eager 2 x (8h + 4) = 8,200 + attention
    # 2 x (512 + 256 + 256) + 2 x 512 + 32 = 3,104 + 4 x 2i = 11,264: 22,568; compiled 2 x (4h + 4) = 4,104
    # + 3,104 + 3 x 2i = 8,448: 15,656
    assert (_layer_bytes(spec), _layer_bytes(spec, torch_compile=True)) == (22_568, 15_656)


@pytest.mark.parametrize("recipe", [Float8.TENSORWISE, Float8.ROWWISE])
def test_float8_layer(tmp_path, recipe):
    spec = _spec(tmp_path)
    # eager torchao Float8Linear saves its bf16 input (ctx.save_for_backward(input_hp, weight_hp_t)): as bf16
    assert _layer_bytes(spec, float8=recipe) == 10_536
    # compiled: the backward recasts the linears' inputs from the recomputed bf16 input, so neither norm output
    # nor the product is saved: 2 x (2h + 4) = 1,032; attention 1,312 plus the attention output's float8 cast
    # a·d x 1 B = 256; gate and up 2 x 2i = 2,560: 5,160 B (the partition listed in compile_findings.md)
    assert _layer_bytes(spec, float8=recipe, torch_compile=True) == 5_160


def test_checkpointed_compiled_layers_keep_their_inputs_and_rebuild_the_cut(tmp_path):
    spec = _spec(tmp_path)

    def terms(compiled):
        t = TrainingConfig(micro_batch_size=1, seq_len=1024, precision=Precision.BF16, recompute=Recompute.FULL,
                           torch_compile=compiled)
        out = activation_terms(spec, activations_input(t), Framework.PYTORCH, stages(spec.num_layers, 1)[0])
        return {x.name: x.bytes for lifetime in out.lifetimes for x in lifetime
                if x.name in ("activations.checkpoints", "activations.recomputed_layer")}
    # 1,024 tokens: every tensor a multiple of 512 B, so no block rounding. Checkpoints: 2 layers x 2h x 1,024 =
    # 1,048,576 either way; the rebuilt layer 10,536 x 1,024 = 10,788,864 eager, 7,208 x 1,024 = 7,380,992 compiled
    assert terms(False) == {"activations.checkpoints": 1_048_576, "activations.recomputed_layer": 10_788_864}
    assert terms(True) == {"activations.checkpoints": 1_048_576, "activations.recomputed_layer": 7_380_992}


def test_fsdp2_float8_all_gather_gathers_the_linears_in_float8():
    spec = load_model(LLAMA)
    # Llama-2-7B layer: linears 4 x 4096^2 + 3 x 4096 x 11008 = 202,375,168, norms 2 x 4096 = 8,192. FSDP2
    # (param_dtype bf16) gathers (202,375,168 + 8,192) x 2 = 404,766,720 B per layer; with the float8 all-gather
    # 202,375,168 x 1 + 8,192 x 2 = 202,391,552 B; two layer units while layers run
    def gathered(all_gather):
        t = TrainingConfig(micro_batch_size=1, seq_len=512, precision=Precision.FSDP2, optimizer=Optimizer.ADAMW_FUSED,
                           framework=Framework.FSDP, parallelism=Parallelism(dp=8, zero_stage=3),
                           float8=Float8.TENSORWISE, float8_all_gather=all_gather)
        states = model_states(spec, states_input(t), Framework.FSDP, stages(spec.num_layers, 1)[0])
        return [x.bytes for x in states.lifetimes[1] if x.name == "workspace.gathered_layers"]
    assert gathered(False) == [2 * 404_766_720]
    assert gathered(True) == [2 * 202_391_552]


@pytest.mark.parametrize("args, says", [
    (("--float8", "bogus"), "--float8"),
    (("--train", "--zero-stage", "3", "--gpus", "8", "--float8", "rowwise", "--float8-all-gather"), "tensorwise"),
    (("--train", "--float8", "tensorwise", "--float8-all-gather"), "--zero-stage 3"),
    (("--finetune", "lora", "--float8", "tensorwise"), "--float8"),
])
def test_bad_float8_settings_are_one_line(args, says):
    out = run_memest("hf", LLAMA, *args, "--gpu", "H100-80GB")
    assert out.returncode == 2, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_float8_through_the_python_api_refuses_an_unknown_recipe():
    spec = load_model(LLAMA)
    with pytest.raises(InputError, match="float8"):
        validate(spec, TrainingConfig(float8="fp8-ish"))


def test_torchtitan_reader_reads_compile_and_float8(tmp_path):
    found = files.read([TITAN_405B])  # compile = true, [float8] enable_float8_linear, enable_fsdp_float8_all_gather
    assert (found.values["torch_compile"], found.values["float8"], found.values["float8_all_gather"]) == (
        True, Float8.TENSORWISE, True)
    toml = tmp_path / "job.toml"
    base = ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n[training]\nseq_len = 8192\n'
            '[compile]\nenable = true\n')
    toml.write_text(base + '[float8]\nrecipe_name = "rowwise"\n')
    found = files.read([toml])
    assert (found.values["torch_compile"], found.values["float8"]) == (True, Float8.ROWWISE)
    assert "float8_all_gather" not in found.values
    toml.write_text(base + '[float8]\nrecipe_name = "mxfp8"\n')
    with pytest.raises(InputError, match="recipe_name"):
        files.read([toml])


@pytest.mark.slow
def test_compiled_layers_measured_on_the_cpu():
    """Inductor on the CPU: the saved-for-backward bytes of a compiled tiny Llama stack (2 vs 4 layers, the
    difference per layer and token) against the rule (benchmarks/compile_measure.py; about a minute)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import compile_measure

    for lora, expected in ((False, 7_208), (True, 5_448)):  # test_compiled_llama_layer / test_compiled_lora_layer
        measured = compile_measure.per_token_layer("s", 64, compiled=True, lora=lora, checkpoint=False)
        assert measured == {"net": expected, "packed": expected}
