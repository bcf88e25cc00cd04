"""Config files of the stacks that are not the HF Trainer's (memest/workload/files/: torchtune, torchtitan, vllm,
megatron): torchtune recipes, torchtitan TOMLs, vLLM serve YAMLs and command lines, Megatron-LM launch scripts.
The fixtures are real files from the projects' repositories (tests/data/configs/README.md cites each, with its
commit); each test's expected workload is derived by hand from the keys quoted in its comment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.errors import InputError
from memest.sources import load_model
from memest.workload import (
    Engine,
    Framework,
    LoraLibrary,
    Loss,
    Method,
    Offload,
    Optimizer,
    Precision,
    Recompute,
    Stack,
    files,
    resolve_framework,
)
from memest.workload.resolve import resolve

DATA = Path(__file__).resolve().parent / "data" / "configs"
TUNE = DATA / "torchtune"
TUNE_8B_FULL = str(TUNE / "v0.6.1" / "llama3_1" / "8B_full.yaml")
TUNE_8B_QLORA = str(TUNE / "v0.6.1" / "llama3_1" / "8B_qlora_single_device.yaml")
TUNE_70B_FULL = str(TUNE / "v0.6.1" / "llama3_1" / "70B_full.yaml")
TUNE_8B_SINGLE = str(TUNE / "main" / "llama3_1" / "8B_full_single_device.yaml")
TITAN = DATA / "torchtitan"
TITAN_8B = str(TITAN / "llama3_8b.toml")
TITAN_70B = str(TITAN / "llama3_70b.toml")
TITAN_8B_OLD = str(TITAN / "llama3_8b_2025-02.toml")
VLLM_DOCS = str(DATA / "vllm" / "config.yaml")
VLLM_TEST = str(DATA / "vllm" / "test_config_with_model.yaml")
VLLM_SCRIPT = str(DATA / "vllm" / "run_deepseek.sh")
MEGATRON_175B = str(DATA / "megatron" / "train_gpt3_175b_distributed.sh")
MEGATRON_FP8 = str(DATA / "megatron" / "train_llama3_8b_h100_fp8.sh")
LLAMA31 = "meta-llama/Llama-3.1-8B"
H100 = get_device("H100")
A100 = get_device("A100-80GB")


@pytest.fixture(scope="module")
def llama31():
    return load_model(LLAMA31)


@pytest.fixture(scope="module")
def llama70():
    return load_model("meta-llama/Llama-3.1-70B")


# torchtune


def test_torchtune_full_distributed_recipe(llama31):
    # 8B_full.yaml (v0.6.1): model._component_ torchtune.models.llama3_1.llama3_1_8b -> full training of
    # meta-llama/Llama-3.1-8B; batch_size 2, gradient_accumulation_steps 1; optimizer torch.optim.AdamW with
    # fused: True -> adamw_fused; optimizer_in_bwd False; enable_activation_checkpointing True -> every layer
    # checkpointed whole (full); enable_activation_offloading False; dtype bf16 -> pure bf16; loss
    # CEWithChunkedOutputLoss -> chunked; compile False; tokenizer.max_seq_len null -> seq_len
    # min(2048, max_position_embeddings 131072) = 2048, said in a note. Over 8 devices the torchtune stack shards
    # with FSDP2 fully_shard: ZeRO-3 under FSDP, dp 8
    r = files.read([TUNE_8B_FULL])
    assert r.model == LLAMA31 and r.origins["model"] == "8B_full.yaml:38 model._component_"
    t = resolve({"config": [TUNE_8B_FULL], "gpus": 8}, llama31, H100)
    assert (t.method, t.stack, resolve_framework(t)) == (Method.FULL, Stack.TORCHTUNE, Framework.FSDP)
    assert (t.micro_batch_size, t.grad_accum_steps, t.seq_len) == (2, 1, 2048)
    assert (t.optimizer, t.optimizer_in_bwd, t.recompute, t.activation_offloading) == (
        Optimizer.ADAMW_FUSED, False, Recompute.FULL, False)
    assert (t.precision, t.loss, t.torch_compile) == (Precision.BF16, Loss.CHUNKED, False)
    assert (t.parallelism.zero_stage, t.parallelism.dp) == (3, 8)
    assert any("tokenizer.max_seq_len is null" in n for n in r.notes)
    # custom_sharded_layers ['tok_embeddings', 'output'] (line 76) shards them as FSDP2 units of their own: read,
    # no longer noted as ignored
    assert (t.custom_sharded_layers, r.origins["custom_sharded_layers"]) == (
        "tok_embeddings,output", "8B_full.yaml:76 custom_sharded_layers")
    assert not any("custom_sharded_layers" in n for n in r.notes)


def test_torchtune_qlora_recipe(llama31):
    # 8B_qlora_single_device.yaml (v0.6.1): qlora_llama3_1_8b -> QLoRA; lora_rank 8, lora_dropout 0.0;
    # lora_attn_modules [q_proj, v_proj, output_proj] -> q_proj, v_proj, o_proj, and apply_lora_to_mlp True -> the
    # MLP's w1 / w2 / w3 = gate_proj, down_proj, up_proj; apply_lora_to_output False; batch_size 2,
    # gradient_accumulation_steps 8; AdamW fused; dtype bf16; chunked loss; full checkpointing; the adapters and
    # NF4 base are torchtune's (the stack's lora_library)
    t = resolve({"config": [TUNE_8B_QLORA]}, llama31, A100)
    assert (t.method, t.stack, t.lora_library) == (Method.QLORA, Stack.TORCHTUNE, LoraLibrary.TORCHTUNE)
    assert (t.lora.rank, t.lora.dropout) == (8, 0.0)
    assert t.lora.targets == "q_proj,v_proj,o_proj,gate_proj,down_proj,up_proj"
    assert (t.micro_batch_size, t.grad_accum_steps, t.optimizer, t.precision, t.loss, t.recompute) == (
        2, 8, Optimizer.ADAMW_FUSED, Precision.BF16, Loss.CHUNKED, Recompute.FULL)
    assert files.read([TUNE_8B_QLORA]).origins["lora_rank"] == "8B_qlora_single_device.yaml:26 model.lora_rank"


def test_torchtune_single_device_recipe_at_main(llama31):
    # 8B_full_single_device.yaml (main): optimizer bitsandbytes.optim.PagedAdamW8bit -> paged_adamw8bit;
    # optimizer_in_bwd True; loss LinearCrossEntropyLoss (chunks projected inside the loss, each chunk's fp32
    # log-probabilities kept: as the chunked loss) -> chunked; batch_size 2, dtype bf16, full checkpointing
    t = resolve({"config": [TUNE_8B_SINGLE]}, llama31, A100)
    assert (t.method, t.optimizer, t.optimizer_in_bwd, t.loss) == (Method.FULL, Optimizer.PAGED_ADAMW8BIT, True,
                                                                   Loss.CHUNKED)
    assert (t.micro_batch_size, t.precision, t.recompute, resolve_framework(t)) == (
        2, Precision.BF16, Recompute.FULL, Framework.PYTORCH)


def test_torchtune_70b_cpu_offload(llama70):
    # 70B_full.yaml (v0.6.1): llama3_1_70b -> meta-llama/Llama-3.1-70B; optimizer fused: False -> torch AdamW with
    # foreach kernels (adamw); fsdp_cpu_offload True -> FSDP2 CPUOffloadPolicy: parameters (and so gradients and
    # optimizer states) in host memory; tensor_parallel_dim 1 -> no tensor parallelism; 8 devices -> ZeRO-3
    assert files.read([TUNE_70B_FULL]).model == "meta-llama/Llama-3.1-70B"
    t = resolve({"config": [TUNE_70B_FULL], "gpus": 8}, llama70, A100)
    assert (t.optimizer, t.offload, t.parallelism.tp, t.parallelism.zero_stage) == (Optimizer.ADAMW, Offload.PARAMS,
                                                                                     1, 3)


# torchtitan


def test_torchtitan_llama3_8b(llama31):
    # llama3_8b.toml (238fa9953e4a): [model] name llama3, flavor 8B -> meta-llama/Llama-3.1-8B (its
    # hf_assets_path); [training] local_batch_size 1, seq_len 8192, no mixed_precision_param -> the stack's
    # FSDP2 bf16 over fp32 shards; [parallelism] data_parallel_shard_degree -1 (the ranks left over: all 8 given)
    # -> fully_shard, ZeRO-3; tensor / pipeline / context degrees 1; [activation_checkpoint] selective with
    # selective_ac_option "op" -> selective_op; [optimizer] AdamW, implementation not given (fused by default)
    r = files.read([TITAN_8B])
    assert (r.model, r.origins["model"]) == (LLAMA31, "llama3_8b.toml:19 model.flavor")
    t = resolve({"config": [TITAN_8B], "gpus": 8}, llama31, H100)
    assert (t.method, t.stack, resolve_framework(t)) == (Method.FULL, Stack.TORCHTITAN, Framework.FSDP)
    assert (t.micro_batch_size, t.seq_len, t.precision, t.recompute, t.optimizer) == (
        1, 8192, Precision.FSDP2, Recompute.SELECTIVE_OP, Optimizer.ADAMW_FUSED)
    assert (t.parallelism.zero_stage, t.parallelism.dp, t.parallelism.tp) == (3, 8, 1)
    assert r.origins["seq_len"] == "llama3_8b.toml:33 training.seq_len"
    assert r.origins["recompute"] == "llama3_8b.toml:59 activation_checkpoint.selective_ac_option"


def test_torchtitan_llama3_70b_with_tensor_parallelism(llama70):
    # llama3_70b.toml: flavor 70B -> meta-llama/Llama-3.1-70B; local_batch_size 8, seq_len 8192;
    # tensor_parallel_degree 8; data_parallel_shard_degree -1 -> FSDP over what tp leaves: 64 / 8 = 8 ranks,
    # ZeRO-3 (FSDP + TP, torchtitan's 2-D layout); activation_checkpoint mode full -> full
    t = resolve({"config": [TITAN_70B], "gpus": 64}, llama70, H100)
    assert (t.parallelism.tp, t.parallelism.dp, t.parallelism.zero_stage, resolve_framework(t)) == (
        8, 8, 3, Framework.FSDP)
    assert (t.micro_batch_size, t.seq_len, t.recompute) == (8, 8192, Recompute.FULL)


def test_torchtitan_older_key_names(llama31):
    # train_configs/llama3_8b.toml of February 2025: [training] batch_size 1 (before local_batch_size),
    # data_parallel_shard_degree -1 and tensor_parallel_degree 1 under [training], pipeline / context degrees under
    # [experimental], compile false under [training]: the same job as the newer file
    old = resolve({"config": [TITAN_8B_OLD], "gpus": 8}, llama31, H100)
    new = resolve({"config": [TITAN_8B], "gpus": 8}, llama31, H100)
    assert (old.micro_batch_size, old.seq_len, old.recompute, old.parallelism) == (
        new.micro_batch_size, new.seq_len, new.recompute, new.parallelism)
    assert files.read([TITAN_8B_OLD]).origins["micro_batch_size"] == "llama3_8b_2025-02.toml:29 training.batch_size"


def test_torchtitan_explicit_degrees_and_switches(tmp_path):
    # replicate 2 x shard 4 (HSDP) x tp 2 = 16 devices, FSDP over the 4 shard ranks (dp_shard 4); global_batch_size
    # 64 / (local 2 x dp 8) = 4 micro-batches; dtype bfloat16 -> pure bf16; enable_cpu_offload -> parameters in
    # host memory; early_step_in_backward -> the optimizer in backward; implementation foreach -> adamw;
    # selective_ac_option "1" -> every layer checkpointed (full); compile enable true -> torch_compile
    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\n'
                    'global_batch_size = 64\nseq_len = 4096\ndtype = "bfloat16"\nenable_cpu_offload = true\n'
                    '[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n'
                    'tensor_parallel_degree = 2\n[optimizer]\nname = "AdamW"\nimplementation = "foreach"\n'
                    'early_step_in_backward = true\n[activation_checkpoint]\nmode = "selective"\n'
                    'selective_ac_option = "1"\n[compile]\nenable = true\n')
    r = files.read([path])
    v = r.values
    assert (v["gpus"], v["dp_shard"], v["tp"], v["zero_stage"], v["grad_accum_steps"]) == (16, 4, 2, 3, 4)
    assert (v["precision"], v["offload"], v["optimizer_in_bwd"], v["optimizer"], v["recompute"]) == (
        Precision.BF16, Offload.PARAMS, True, Optimizer.ADAMW, Recompute.FULL)
    assert v["torch_compile"] is True and not any("compile.enable" in n for n in r.notes), r.notes


# vLLM


def test_vllm_yaml_with_dashes_from_the_docs():
    # docs/configuration/serve_args.md: model meta-llama/Llama-3.1-8B-Instruct, host, port, uvicorn-log-level
    # (a vLLM key): serving on vLLM, the model named; nothing else that sizes memory
    r = files.read([VLLM_DOCS])
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.values == {"serve": True, "engine": Engine.VLLM}
    out = run_memest("hf", "--config", VLLM_DOCS, "--gpu", "H100", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["mode"], doc["workload"]["engine"]) == ("serve", "vllm")


def test_vllm_yaml_with_underscores(llama31):
    # tests/config/test_config_with_model.yaml: tensor_parallel_size 2 -> tp 2 over 2 devices; model config-model
    # (a test name: the model given wins, said in a note)
    r = files.read([VLLM_TEST])
    assert (r.model, r.values["tp"], r.values["gpus"]) == ("config-model", 2, 2)
    w = resolve({"config": [VLLM_TEST]}, llama31, H100, model=LLAMA31)
    assert (w.mode, w.engine, w.parallelism.tp) == ("serve", Engine.VLLM, 2)
    assert any("the model given (meta-llama/Llama-3.1-8B) is used, not config-model" in n for n in w.config_notes)


def test_vllm_command_line_in_a_script(llama70):
    # run_deepseek.sh: 'VLLM_USE_V1=1 python3 -m vllm.entrypoints.openai.api_server \' continued over 12 lines:
    # --model /path/... (line 74), --tensor-parallel-size 8 (line 75), --pipeline-parallel-size 2 -> 16 devices,
    # --gpu-memory-utilization 0.92, --dtype auto, --max-num-seqs 40, --max-model-len 16384; the docker and ray
    # lines above are not vLLM's; --enable-chunked-prefill / --enable-prefix-caching size nothing
    r = files.read([VLLM_SCRIPT])
    assert r.model == "/path/to/the/model/in/the/container"
    assert r.origins["tp"] == "run_deepseek.sh:75 tensor-parallel-size"
    w = resolve({"config": [VLLM_SCRIPT]}, llama70, H100)
    assert (w.parallelism.tp, w.parallelism.pp, w.gpu_memory_utilization, w.max_num_seqs, w.max_model_len) == (
        8, 2, 0.92, 40, 16384)
    assert w.dtype == "auto"


def test_vllm_serve_line_with_variables_and_equals(tmp_path):
    # a script that is not YAML (the '[[ ]]' test): MODEL and TP assigned at the top, "$MODEL" quoted, -tp (vLLM's
    # short flag), --max-model-len=8192 (argparse's '='), --kv-cache-dtype fp8, --quantization awq_marlin (the
    # Marlin kernel over AWQ weights: awq), --dtype half (fp16), --enforce-eager alone (True), the output
    # redirected; --cpu-offload-gb 4 is memory-relevant and not modelled: a note naming its line (5)
    path = tmp_path / "serve.sh"
    path.write_text('#!/bin/bash\nMODEL="Qwen/Qwen2.5-7B-Instruct-AWQ"\nTP=2\n[[ -n "$1" ]] && MODEL=$1\n'
                    'vllm serve "$MODEL" -tp $TP --max-model-len=8192 --cpu-offload-gb 4 \\\n'
                    '  --kv-cache-dtype fp8 --quantization awq_marlin --dtype half --enforce-eager \\\n'
                    '  --max-num-batched-tokens 4096 > vllm.log 2>&1 &\n')
    r = files.read([path])
    assert r.model == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    v = r.values
    assert (v["tp"], v["gpus"], v["max_model_len"], v["kv_cache_dtype"], v["quantization"], v["dtype"]) == (
        2, 2, 8192, "fp8", "awq", "fp16")
    assert (v["enforce_eager"], v["max_num_batched_tokens"]) == (True, 4096)
    assert any(n.startswith("serve.sh:5 cpu-offload-gb is '4'") for n in r.notes), r.notes


# Megatron-LM


def test_megatron_gpt3_175b_script(llama70):
    # examples/gpt3/train_gpt3_175b_distributed.sh: arrays over several lines with comments inside
    # (GPT_MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS) spliced into 'torchrun ${DISTRIBUTED_ARGS[@]}
    # pretrain_gpt.py ...': --tensor-model-parallel-size 8 (line 56), --pipeline-model-parallel-size 16,
    # --micro-batch-size 1, --seq-length 2048, --fp16 (line 47) -> fp16 parameters with fp32 main_grad and
    # master (memest fp16); no --use-distributed-optimizer -> ZeRO-0; no recompute flag -> none. torchrun's
    # --nproc_per_node $GPUS_PER_NODE (8) x --nnodes $NUM_NODES (1) = 8 is not a multiple of 8 x 16 = 128: no
    # device count read, said; --global-batch-size 1536 needs the data-parallel degree: said; the architecture
    # flags (--num-layers 96, ...) are named: the MODEL passed is estimated
    r = files.read([MEGATRON_175B])
    v = r.values
    assert r.model is None
    assert (v["tp"], v["pp"], v["micro_batch_size"], v["seq_len"], v["precision"]) == (8, 16, 1, 2048,
                                                                                     Precision.FP16)
    assert "gpus" not in v and "zero_stage" not in v and "recompute" not in v
    assert r.origins["tp"] == "train_gpt3_175b_distributed.sh:56 tensor-model-parallel-size"
    assert r.origins["precision"] == "train_gpt3_175b_distributed.sh:47 fp16"
    assert any("8 x 1 = 8 processes, not a multiple of tp x pp x cp = 128" in n for n in r.notes)
    assert any("--num-layers 96, --hidden-size 12288, --num-attention-heads 96" in n for n in r.notes)
    t = resolve({"config": [MEGATRON_175B], "gpus": 128}, llama70, H100)
    assert (t.stack, resolve_framework(t), t.parallelism.dp, t.parallelism.zero_stage) == (
        Stack.MEGATRON, Framework.MEGATRON, 1, 0)


def test_megatron_llama3_fp8_script():
    # examples/llama/train_llama3_8b_h100_fp8.sh: GPUS_PER_NODE=8 x NUM_NODES=1 (lines 22-23) -> 8 devices;
    # TP_SIZE=1, CP_SIZE=1 -> dp 8; MICRO_BATCH_SIZE=1, GLOBAL_BATCH_SIZE=128 -> 128 / (1 x 8) = 16 micro-batches;
    # SEQ_LENGTH=8192; --bf16 (line 95) -> mixed; --use-distributed-optimizer reaches TRAINING_ARGS through
    # 'TRAINING_ARGS+=("${DDP_ARGS[@]}")' (line 130) -> ZeRO-1; --sequence-parallel at tp 1 is turned off by
    # Megatron-LM, so not read; the fp8 flags are appended inside 'if [[ "$DTYPE" == "fp8" ]]' (line 106): not
    # read, said in a note
    r = files.read([MEGATRON_FP8])
    v = r.values
    assert (v["gpus"], v["tp"], v["cp"], v["micro_batch_size"], v["grad_accum_steps"], v["seq_len"]) == (
        8, 1, 1, 1, 16, 8192)
    assert (v["precision"], v["zero_stage"], "sequence_parallel" in v) == (Precision.MIXED, 1, False)
    assert r.origins["zero_stage"] == "train_llama3_8b_h100_fp8.sh:126 use-distributed-optimizer"
    assert any("$DTYPE_ARGS also set inside an if / case / loop block" in n for n in r.notes), r.notes


def test_megatron_launch_line_with_every_switch(tmp_path):
    # 8 processes x 2 nodes = 16 devices = tp 2 x pp 2 x dp 4; --global-batch-size 64 / (micro 2 x dp 4) = 8
    # micro-batches; --bf16 -> mixed; --use-distributed-optimizer -> ZeRO-1; --recompute-granularity selective;
    # --sequence-parallel
    path = tmp_path / "pretrain.sh"
    path.write_text("torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --tensor-model-parallel-size 2 "
                    "--pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 64 --seq-length 4096 "
                    "--bf16 --use-distributed-optimizer --recompute-granularity selective --sequence-parallel\n")
    v = files.read([path]).values
    assert (v["gpus"], v["grad_accum_steps"], v["precision"], v["zero_stage"], v["recompute"]) == (
        16, 8, Precision.MIXED, 1, Recompute.SELECTIVE)
    assert (v["sequence_parallel"], v["seq_len"], v["micro_batch_size"]) == (True, 4096, 2)


# what every new format shares


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.toml", '[model]\nname = "llama3"\nflavor = \n', "line 3: malformed TOML"),
    ("bad.yaml", "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\ndtype: fp16\n",
     "dtype is 'fp16'; expected bf16 or fp32"),
    ("bad.toml", '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = "2"\n',
     "training.local_batch_size is '2'; expected an integer"),
    ("serve.sh", "vllm serve m --tensor-parallel-size two\n", "tensor-parallel-size is 'two'; expected an integer"),
    ("run.sh", "torchrun pretrain_gpt.py --micro-batch-size 1.5\n", "micro-batch-size is '1.5'; expected an integer"),
], ids=["toml", "torchtune-dtype", "torchtitan-type", "vllm-type", "megatron-type"])
def test_bad_files_are_one_line_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    out = run_memest("hf", LLAMA31, "--config", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], lines


def test_a_script_with_no_known_command_names_the_formats(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("#!/bin/bash\nif [[ -z $X ]]; then\n  python train.py --lr 1e-4\nfi\n")
    with pytest.raises(InputError) as exc:
        files.read([path])
    for words in ("torchtune", "torchtitan", "vLLM", "Megatron-LM", "DeepSpeed", "axolotl"):
        assert words in str(exc.value)


def test_explain_names_the_line_of_a_torchtune_key():
    # 8B_qlora_single_device.yaml line 57 is "batch_size: 2"
    out = run_memest("hf", "--config", TUNE_8B_QLORA, "--gpu", "A100-80GB", "--explain")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "read: micro_batch_size 2 from 8B_qlora_single_device.yaml:57 batch_size" in text


def test_a_serving_file_and_a_training_recipe_are_one_error_naming_both():
    # the vLLM YAML is a serve job, the torchtune recipe a training job: one error naming both files
    out = run_memest("hf", LLAMA31, "--config", VLLM_DOCS, "--config", TUNE_8B_FULL)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and VLLM_DOCS in lines[0] and TUNE_8B_FULL in lines[0], lines
    assert "disagree on the mode" in lines[0], lines


def test_torchtune_compile_with_either_loss(tmp_path):
    # compile: True compiles each layer (training.compile_model) and the loss, under either loss: torch_compile
    base = "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ncompile: True\nloss:\n  _component_: "
    chunked, plain = tmp_path / "chunked.yaml", tmp_path / "plain.yaml"
    chunked.write_text(base + "torchtune.modules.loss.CEWithChunkedOutputLoss\n")
    plain.write_text(base + "torch.nn.CrossEntropyLoss\n")
    c, p = files.read([chunked]), files.read([plain])
    assert c.model == "meta-llama/Llama-3.2-1B" and (c.values["torch_compile"], c.values["loss"]) == (True,
                                                                                                     Loss.CHUNKED)
    assert p.values["torch_compile"] is True and p.values["loss"] is Loss.DEFAULT


def test_a_vllm_command_reads_its_config_file_and_wins_over_it(tmp_path):
    # 'vllm serve --config serve.yaml --max-model-len 32K': the YAML gives the model, tensor-parallel-size 4 and
    # max-model-len 8192; the command line wins where both say (vLLM: command line > config file): max_model_len
    # 32K = 32 x 1024 = 32768 (human_readable_int: uppercase is binary); tp 4 and the model from the YAML
    (tmp_path / "serve.yaml").write_text("model: meta-llama/Llama-3.1-8B-Instruct\ntensor-parallel-size: 4\n"
                                         "max-model-len: 8192\n")
    script = tmp_path / "launch.sh"
    script.write_text("vllm serve --config serve.yaml --max-model-len 32K\n")
    r = files.read([script])
    assert (r.model, r.values["tp"], r.values["gpus"], r.values["max_model_len"]) == (
        "meta-llama/Llama-3.1-8B-Instruct", 4, 4, 32768)
    assert r.origins["max_model_len"] == "launch.sh:1 max-model-len"
    assert r.origins["tp"] == "serve.yaml:2 tensor-parallel-size"


def test_megatron_arguments_in_a_quoted_variable(tmp_path):
    # the older examples' form: GPT_ARGS="..." over several lines (some without a backslash), spliced unquoted
    # into the launch line: --micro-batch-size 4, --seq-length 1024, --fp16; DISTRIBUTED_ARGS gives 8 processes on
    # 1 node and no parallel degree -> 8 devices, dp 8: --global-batch-size 64 / (4 x 8) = 2 micro-batches
    path = tmp_path / "pretrain_gpt.sh"
    path.write_text('#!/bin/bash\nGPUS_PER_NODE=8\nDISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes 1"\n'
                    'GPT_ARGS="\n    --num-layers 24 \\\n    --micro-batch-size 4\n    --global-batch-size 64\n'
                    '    --seq-length 1024 --fp16\n"\n'
                    'torchrun $DISTRIBUTED_ARGS pretrain_gpt.py $GPT_ARGS --data-path $1\n')
    v = files.read([path]).values
    assert (v["gpus"], v["micro_batch_size"], v["grad_accum_steps"], v["seq_len"], v["precision"]) == (
        8, 4, 2, 1024, Precision.FP16)


def test_a_megatron_launch_without_model_says_to_pass_one():
    out = run_memest("hf", "--config", MEGATRON_175B)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "a Megatron-LM launch names none" in out.stderr


# NeMo (memest/workload/files/nemo.py; recipes read at NVIDIA/NeMo 8cfedd7203462cb251a914e700e5605444277561)

NEMO = DATA / "nemo"


def _nemo(tmp_path, line):
    path = tmp_path / "launch.sh"
    path.write_text(line + "\n")
    return files.read([path])


def test_nemo2_factory_with_tensor_parallelism(tmp_path):
    # docs/source/features/parallelisms.rst:168. recipes/llama3_8b.py pretrain_recipe: num_nodes 1 x
    # num_gpus_per_node 8 = 8 devices; trainer(context_parallelism=2, pipeline_parallelism=1); the line's tp 2 ->
    # dp = 8 / (2 x 1 x 2) = 2; MockDataModule(seq_length=8192, global_batch_size=512, micro_batch_size=1) ->
    # 512 / (1 x 2) = 256 micro-batches; plugins=bf16_mixed() -> bf16 params, fp32 main_grad and master (mixed);
    # distributed_fused_adam_with_cosine_annealing: use_distributed_optimizer=True -> ZeRO-1; model Llama3Config8B
    # = meta-llama/Meta-Llama-3-8B (its finetune_recipe's resume_path); sequence_parallelism False -> not set
    r = _nemo(tmp_path, "nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=2")
    v = r.values
    assert r.model == "meta-llama/Meta-Llama-3-8B" and v["stack"] is Stack.NEMO and v["train"] is True
    assert (v["gpus"], v["tp"], v["pp"], v["cp"], v["micro_batch_size"], v["grad_accum_steps"], v["seq_len"]) == (
        8, 2, 1, 2, 1, 256, 8192)
    assert (v["precision"], v["zero_stage"], "sequence_parallel" in v) == (Precision.MIXED, 1, False)
    assert r.origins["tp"] == "launch.sh:1 trainer.strategy.tensor_model_parallel_size"
    assert r.origins["cp"] == "launch.sh:1 --factory llama3_8b"
    t = resolve({"config": [str(tmp_path / "launch.sh")]}, load_model("meta-llama/Meta-Llama-3-8B"), H100)
    assert (t.stack, resolve_framework(t), t.parallelism.dp, t.parallelism.zero_stage) == (
        Stack.NEMO, Framework.MEGATRON, 2, 1)


def test_nemo2_docs_sequence_parallelism_key_is_not_a_strategy_argument(tmp_path):
    # parallelisms.rst:358 writes trainer.strategy.sequence_parallelism=True; MegatronStrategy.__init__
    # (nemo/lightning/pytorch/strategies/megatron_strategy.py) takes sequence_parallel: not read, said
    r = _nemo(tmp_path, "nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=2 "
                        "trainer.strategy.sequence_parallelism=True")
    assert "sequence_parallel" not in r.values
    assert any("sequence_parallelism is no argument of MegatronStrategy" in n for n in r.notes), r.notes
    r = _nemo(tmp_path, "nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=2 "
                        "trainer.strategy.sequence_parallel=True")
    assert r.values["sequence_parallel"] is True


def test_nemo2_batching_line(tmp_path):
    # docs/source/nlp/nemo_megatron/batching.rst:42: micro 4, global 16; llama3_8b: 8 devices, tp 1 pp 1 cp 2 ->
    # dp 4 -> 16 / (4 x 4) = 1 micro-batch per step; trainer.accumulate_grad_batches is not NeMo's accumulation
    r = _nemo(tmp_path, "nemo llm pretrain --factory llama3_8b data.micro_batch_size=4 data.global_batch_size=16 "
                        "trainer.accumulate_grad_batches=1")
    assert (r.values["micro_batch_size"], r.values["grad_accum_steps"], r.values["gpus"]) == (4, 1, 8)
    assert r.origins["grad_accum_steps"] == "launch.sh:1 data.global_batch_size"


def test_nemo2_finetune_factory_is_lora(tmp_path):
    # recipes/llama3_8b.py docstring 'nemo llm finetune --factory llama3_8b'; finetune_recipe(peft_scheme='lora'):
    # LoRA dim 8 on LoRA's default target_modules linear_qkv, linear_proj, linear_fc1, linear_fc2 (every linear of
    # a block), dropout 0.0; use_distributed_optimizer = False -> no ZeRO; default_finetune_recipe: 1 node x 8,
    # tp 1 pp 1 cp 1 -> dp 8; SquadDataModule(seq_length=2048, global_batch_size=128, micro_batch_size=1) ->
    # 128 / (1 x 8) = 16 micro-batches
    for line in ("nemo llm finetune --factory llama3_8b", "nemo llm finetune --factory \"llama3_8b(peft_scheme='lora')\""):
        r = _nemo(tmp_path, line)
        v = r.values
        assert r.model == "meta-llama/Meta-Llama-3-8B"
        assert (v["finetune"], v["lora_rank"], v["lora_targets"], v["lora_dropout"]) == (Method.LORA, 8, "all-linear",
                                                                                          0.0)
        assert (v["gpus"], v["tp"], v["cp"], v["seq_len"], v["grad_accum_steps"], "zero_stage" in v) == (
            8, 1, 1, 2048, 16, False)
    t = resolve({"config": [str(tmp_path / "launch.sh")]}, load_model("meta-llama/Meta-Llama-3-8B"), H100)
    assert (t.method, t.stack, t.parallelism.dp, t.parallelism.zero_stage) == (Method.LORA, Stack.NEMO, 8, 0)


def test_nemo2_full_finetune_and_factory_arguments(tmp_path):
    # finetune_recipe(peft_scheme=None / 'none'): tensor_model_parallel_size 2, distributed optimizer kept ->
    # full training, ZeRO-1; num_nodes=2 -> 16 devices, dp = 16 / 2 = 8; packed_sequence=True -> seq_length 4096,
    # global_batch_size 8 -> 8 / (1 x 8) = 1
    r = _nemo(tmp_path, "nemo llm finetune --factory \"llama3_8b(peft_scheme='none', num_nodes=2, "
                        "packed_sequence=True)\"")
    v = r.values
    assert (v["train"], "finetune" in v, v["tp"], v["zero_stage"], v["gpus"], v["seq_len"], v["grad_accum_steps"]) == (
        True, False, 2, 1, 16, 4096, 1)


def test_nemo2_70b_factory_names_its_interleaving(tmp_path):
    # examples/llm/pretrain/README.md:23 'nemo llm pretrain --factory "llama3_70b(num_nodes=128)"'; llama3_70b.py
    # trainer(4, 4, virtual 5, context 2, sequence_parallelism=True): 128 x 8 = 1024 devices, dp = 1024 / 32 = 32;
    # 512 / (1 x 32) = 16 micro-batches; sequence parallel at tp 4; the virtual pipeline (5) is not modelled: named
    r = _nemo(tmp_path, 'nemo llm pretrain --factory "llama3_70b(num_nodes=128)"')
    v = r.values
    assert r.model == "meta-llama/Meta-Llama-3-70B"
    assert (v["gpus"], v["tp"], v["pp"], v["cp"], v["sequence_parallel"], v["grad_accum_steps"]) == (
        1024, 4, 4, 2, True, 16)
    assert any("virtual_pipeline_model_parallel_size is 5" in n for n in r.notes), r.notes


def test_nemo2_unknown_factory_names_it_and_the_keys_read(tmp_path):
    # parallelisms.rst:289: mixtral_8x7b is no factory memest tabulates: a note naming it; the line's ep 4 is read
    r = _nemo(tmp_path, "nemo llm pretrain --factory mixtral_8x7b trainer.strategy.expert_model_parallel_size=4")
    assert r.model is None and r.values["ep"] == 4 and "tp" not in r.values
    assert any("--factory mixtral_8x7b is not a NeMo recipe memest knows" in n
               and "trainer.strategy.expert_model_parallel_size" in n for n in r.notes), r.notes


def test_nemo1_docs_launch_line():
    # gpt_training.rst (v2.0.0) Option 1: megatron_gpt_pretraining.py with --config-name=megatron_gpt_config;
    # trainer.devices=1 x trainer.num_nodes=1; trainer.precision=16 with the config's model.megatron_amp_O2 True ->
    # fp16 params with fp32 main params (fp16); micro 6, global 192, dp 1 -> 192 / 6 = 32; encoder_seq_length
    # 1024; model.optim.name=fused_adam -> the stack's Adam, no sharding; the architecture keys are named
    r = files.read([NEMO / "gpt_training_option1.sh"])
    v = r.values
    assert (v["stack"], v["gpus"], v["tp"], v["pp"], v["micro_batch_size"], v["grad_accum_steps"], v["seq_len"]) == (
        Stack.NEMO, 1, 1, 1, 6, 32, 1024)
    assert (v["precision"], "zero_stage" in v, "recompute" in v) == (Precision.FP16, False, False)
    assert r.origins["micro_batch_size"] == "gpt_training_option1.sh:14 model.micro_batch_size"
    assert any("model.num_layers 12, model.hidden_size 768, model.num_attention_heads 12" in n for n in r.notes)


def test_nemo1_config_yaml():
    # megatron_gpt_config.yaml: trainer.devices 1, num_nodes 1, precision bf16 with megatron_amp_O2 True -> mixed;
    # micro_batch_size 4, global_batch_size 8 -> 8 / (4 x 1) = 2; encoder_seq_length 512;
    # activations_checkpoint_granularity null -> none given; optim fused_adam
    r = files.read([NEMO / "megatron_gpt_config.yaml"])
    v = r.values
    assert (v["stack"], v["gpus"], v["micro_batch_size"], v["grad_accum_steps"], v["seq_len"], v["precision"]) == (
        Stack.NEMO, 1, 4, 2, 512, Precision.MIXED)
    assert "recompute" not in v and r.origins["seq_len"] == "megatron_gpt_config.yaml:90 model.encoder_seq_length"


def test_nemo1_overrides_without_o2_run_autocast(tmp_path):
    # megatron_gpt_model.py: enable_autocast = not megatron_amp_O2 and autocast_dtype in (fp16, bf16): fp32 params
    # under autocast (amp); tp 2 over trainer.devices 8 -> dp 4; global 64 / (1 x 4) = 16; selective recompute;
    # distributed_fused_adam shards the optimizer states over dp (ZeRO-1)
    r = _nemo(tmp_path, "python examples/nlp/language_modeling/megatron_gpt_pretraining.py "
                        "model.tensor_model_parallel_size=2 model.micro_batch_size=1 model.global_batch_size=64 "
                        "model.encoder_seq_length=4096 trainer.devices=8 trainer.precision=bf16-mixed "
                        "model.megatron_amp_O2=False model.activations_checkpoint_granularity=selective "
                        "model.optim.name=distributed_fused_adam")
    v = r.values
    assert (v["precision"], v["tp"], v["gpus"], v["grad_accum_steps"], v["recompute"], v["zero_stage"]) == (
        Precision.AMP, 2, 8, 16, Recompute.SELECTIVE, 1)


def test_nemo_bad_value_is_one_line(tmp_path):
    path = tmp_path / "launch.sh"
    path.write_text("nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=two\n")
    out = run_memest("hf", "--config", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "trainer.strategy.tensor_model_parallel_size is 'two'; expected an integer" in lines[0]


def test_nemo_launch_estimates_under_the_nemo_stack(tmp_path):
    path = tmp_path / "launch.sh"
    path.write_text("nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=2\n")
    out = run_memest("hf", "--config", str(path), "--gpu", "H100")
    assert out.returncode in (0, 3), out.stderr
    text = " ".join(out.stdout.split())
    assert "meta-llama/Meta-Llama-3-8B" in text and "NeMo 2" in text and "tp 2" in text
