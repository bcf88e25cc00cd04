"""Every training case of the published cases (kinds ``KINDS``), mapped onto memest's inputs.

Each case is translated into memest's inputs in :func:`build_cases`: the published settings, and
what memest assumes where the source is silent (said in ``note``). The figure compared is the one
of the published metric: peak allocated (``torch.cuda.max_memory_allocated``, torchtune's "peak
active"), peak reserved (torchtitan's ``memory``), or device used (nvidia-smi / NVML). The
expected values are the published ones, converted to bytes only.

Each case is also mapped through its stack (:func:`stack_rows`, :mod:`memest.validation.stack_mapping`):
the stack's defaults, the settings the source states and the config files memest reads, as a user of that
stack would give them; the report shows both mappings side by side and every setting where they differ.

``benchmarks/training_cases.py`` writes the report ``benchmarks/training_cases.md`` (:func:`markdown`
plus its hand-written analysis); ``tests/test_validation_training.py`` checks every row of both mappings
against its tolerance, with the reasons of :mod:`memest.validation.gaps`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field

from memest.devices import GB, Device, GiB, MiB, get_device
from memest.estimate import estimate
from memest.result import Estimate, RankEstimate
from memest.sources import load_config, load_model, spec_from_config
from memest.sources.config import HFConfig
from memest.spec import ModelSpec
from memest.validation import stack_mapping
from memest.validation.cases import cases_by_id
from memest.validation.gaps import GOAL, KNOWN_GAPS, STACK_GAPS
from memest.workload import (
    AttnImplementation,
    Float8,
    Framework,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Loss,
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    Stack,
    TrainingConfig,
)

KINDS = ("train_full", "train_multi_gpu", "lora", "qlora")

HIGH_TOLERANCE = 0.10
"""Allowed |error| of a high-confidence case whose figure is tensor bytes (allocated / active)."""
DEVICE_TOLERANCE = 0.15
"""Allowed |error| of a figure that includes allocator slack (reserved, nvidia-smi): the slack is
a fixed share of the peak in memest, and varied 11-30% across the fms-acceleration runs."""
MEDIUM_TOLERANCE = 0.25
"""Allowed |error| of a medium-confidence case (settings inferred; a sanity check, not a target)."""


@dataclass(frozen=True)
class Case:
    """How one published case maps onto memest.

    Attributes:
        id: The case id in cases.json.
        spec: The model (catalog reference, or a catalog config with its class changed).
        workload: memest's workload for the published settings.
        device: Catalog device of the run.
        metric: ``allocated``, ``reserved`` or ``device_used``.
        measured_bytes: The published figure, in bytes.
        note: What memest assumes beyond the published settings.
        tolerance: Allowed relative error.
    """

    id: str
    spec: ModelSpec
    workload: TrainingConfig
    device: Device
    metric: str
    measured_bytes: int
    note: str
    tolerance: float
    figure: str = ""
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """One comparison: the case, memest's figure of the same metric, the peak moment."""

    case: Case
    predicted_bytes: int
    estimate: Estimate

    @property
    def error(self) -> float:
        """predicted / measured - 1 (negative: memest under-predicts)."""
        return self.predicted_bytes / self.case.measured_bytes - 1


def _bert_for_sequence_classification() -> ModelSpec:
    """bert-large-uncased (catalog config.json) built as BertForSequenceClassification, 2 labels."""
    from memest.sources.catalog import CATALOG_DIR

    raw = json.loads((CATALOG_DIR / "google-bert" / "bert-large-uncased" / "config.json").read_text())
    raw["architectures"] = ["BertForSequenceClassification"]
    return spec_from_config(HFConfig(raw, name="google-bert/bert-large-uncased", source="catalog"))


def build_cases() -> list[Case]:
    """The mapping of every training case (see the module docstring)."""
    pub = cases_by_id()
    v100, a100, h100_96 = get_device("V100-16GB"), get_device("A100-80GB"), get_device("H100-96GB")
    bert = _bert_for_sequence_classification()
    out: list[Case] = []

    # HF Trainer, Jan 2022 (torch 1.x: model.zero_grad() keeps gradients; BERT eager attention).
    hf_note = ("HF Trainer on torch 1.x: zero_grad keeps gradients (set_to_none=False); eager BERT "
               "attention; adamw_hf's per-tensor loop modelled as a fused step (its temporaries are one tensor)")
    bert_base = TrainingConfig(micro_batch_size=4, seq_len=512, precision=Precision.FP32, optimizer=Optimizer.ADAMW_FUSED,
                               attn_implementation=AttnImplementation.EAGER, framework=Framework.PYTORCH,
                               set_grads_to_none=False)
    for cid, w in (
        ("hf_bert_large_vanilla_bs4", bert_base),
        ("hf_bert_large_bs1_ga4", bert_base.replace(micro_batch_size=1, grad_accum_steps=4)),
        ("hf_bert_large_bs1_ga4_gc", bert_base.replace(micro_batch_size=1, grad_accum_steps=4, recompute=Recompute.FULL)),
        ("hf_bert_large_bs4_fp16", bert_base.replace(precision=Precision.AMP)),
        ("hf_bert_large_bs4_adafactor", bert_base.replace(optimizer=Optimizer.ADAFACTOR)),
    ):
        out.append(Case(cid, bert, w, v100, "device_used", pub[cid]["measured"]["gpu_memory_occupied_MiB"] * MiB,
                        hf_note, DEVICE_TOLERANCE, "NVML used (MiB)"))

    t0 = load_model("bigscience/T0_3B")
    peft_note = ("inputs padded to the longest tweet: seq_len 64, targets 4 tokens (assumed); torch 1.13: "
                 "zero_grad keeps gradients; single-tensor AdamW modelled as fused; T5 eager attention")
    t0_full = TrainingConfig(micro_batch_size=8, seq_len=64, target_len=4, precision=Precision.FP32,
                             optimizer=Optimizer.ADAMW_FUSED, attn_implementation=AttnImplementation.EAGER,
                             framework=Framework.PYTORCH, set_grads_to_none=False)
    out.append(Case("peft_t0_3b_full_ft_a100", t0, t0_full, a100, "allocated",
                    round(pub["peft_t0_3b_full_ft_a100"]["measured"]["peak_gpu_GB"] * GB), peft_note,
                    MEDIUM_TOLERANCE, "peak allocated (GB)"))
    out.append(Case("peft_t0_3b_lora_a100", t0,
                    t0_full.replace(method=Method.LORA, lora=LoraConfig(rank=8, targets="q,v", dropout=0.1)), a100,
                    "allocated", round(pub["peft_t0_3b_lora_a100"]["measured"]["peak_gpu_GB"] * GB), peft_note,
                    MEDIUM_TOLERANCE, "peak allocated (GB)"))
    out += _peft_readme_rows(pub, t0_full.replace(method=Method.LORA), peft_note, a100)

    out.append(Case(
        "torchtune_llama32_3b_full_packed_a100", load_model("meta-llama/Llama-3.2-3B-Instruct"),
        TrainingConfig(micro_batch_size=2, seq_len=4096, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED,
                       framework=Framework.PYTORCH),
        a100, "allocated", round(pub["torchtune_llama32_3b_full_packed_a100"]["measured"]["peak_memory_active_GiB"] * GiB),
        "torchtune full_finetune_single_device: bf16 params and AdamW(fused=True) states; torchtune's attention "
        "repeats K/V to num_heads (memest keeps them at num_kv_heads: ~1.7 GiB less)", HIGH_TOLERANCE,
        "peak active (GiB)"))

    out += _fms_acceleration(pub, a100)
    out.append(Case(
        "torchtune_llama31_8b_lora_4090", load_model("meta-llama/Llama-3.1-8B-Instruct"),
        TrainingConfig(method=Method.LORA, micro_batch_size=2, seq_len=2048, precision=Precision.BF16,
                       optimizer=Optimizer.ADAMW_FUSED, recompute=Recompute.FULL, loss=Loss.CHUNKED,
                       lora=LoraConfig(rank=8, targets="q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
                       framework=Framework.PYTORCH, lora_library=LoraLibrary.TORCHTUNE, torch_compile=True),
        get_device("RTX-4090"), "allocated",
        round(pub["torchtune_llama31_8b_lora_4090"]["measured"]["peak_memory_per_gpu_GiB"] * GiB),
        "torchtune lora_finetune_single_device: activation checkpointing, CEWithChunkedOutputLoss (assumed from the "
        "config), torch.compile of the layers and the chunked cross-entropy (bf16 logits kept)", MEDIUM_TOLERANCE, "peak memory (GiB)"))
    out.append(Case(
        "litgpt_llama3_8b_lora_a10g", load_model("meta-llama/Meta-Llama-3-8B"),
        TrainingConfig(method=Method.LORA, micro_batch_size=1, seq_len=512, grad_accum_steps=8, precision=Precision.BF16,
                       optimizer=Optimizer.ADAMW_FUSED, lora=LoraConfig(rank=32, targets="q_proj,v_proj", dropout=0.05),
                       framework=Framework.PYTORCH, lora_library=LoraLibrary.LITGPT, loss=Loss.LITGPT_CHUNKED),
        get_device("A10G"), "allocated", round(pub["litgpt_llama3_8b_lora_a10g"]["measured"]["peak_memory_GB"] * GB),
        "litgpt bf16-true (bf16 adapters and AdamW states); sequences padded to the longest in the batch: 512 "
        "assumed (max_seq_length)",
        HIGH_TOLERANCE, "peak allocated (GB)"))

    h100 = get_device("H100-80GB")
    out.append(Case(
        "unsloth_llama31_8b_qlora_max_context", load_model("meta-llama/Llama-3.1-8B-Instruct"),
        TrainingConfig(method=Method.QLORA, micro_batch_size=1,
                       seq_len=pub["unsloth_llama31_8b_qlora_max_context"]["measured"]["hf_fa2_max_context_tokens"],
                       precision=Precision.BF16, optimizer=Optimizer.ADAMW8BIT, recompute=Recompute.FULL,
                       attn_implementation=AttnImplementation.FLASH_ATTENTION_2, framework=Framework.PYTORCH,
                       lora=LoraConfig(rank=32, targets="all-linear"), prepare_kbit_training=KbitPrep.TRL),
        h100, "device_used", h100.memory_bytes,
        "the HF + FA2 column: the longest context that fits 80 GB (28,454 tokens) should need the whole device; "
        "its script is not published: trl's SFTTrainer with bf16 assumed (--prepare-kbit-training trl); "
        "unsloth's own column is its own row (..._unsloth)", MEDIUM_TOLERANCE,
        "capacity at HF+FA2's max context"))

    titan = TrainingConfig(micro_batch_size=2, seq_len=8192, precision=Precision.FSDP2, optimizer=Optimizer.ADAMW,
                           recompute=Recompute.SELECTIVE_OP,
                           parallelism=Parallelism(dp=8, zero_stage=3))
    out.append(Case(
        "torchtitan_llama31_8b_fsdp8_h100", load_model("meta-llama/Llama-3.1-8B"), titan, h100_96, "reserved",
        round(pub["torchtitan_llama31_8b_fsdp8_h100"]["measured"]["peak_reserved_GiB"] * GiB),
        "torchtitan FSDP2 (bf16 params, fp32 reduce), selective op AC, foreach AdamW", DEVICE_TOLERANCE,
        "peak reserved (GiB)"))
    out.append(Case(
        "torchtitan_llama31_8b_fsdp128_h100", load_model("meta-llama/Llama-3.1-8B"),
        titan.replace(parallelism=Parallelism(dp=128, zero_stage=3)), h100_96, "reserved",
        round(pub["torchtitan_llama31_8b_fsdp128_h100"]["measured"]["peak_reserved_GiB"] * GiB),
        "as the 8-GPU row, FSDP2 over 128 GPUs on 16 hosts", DEVICE_TOLERANCE, "peak reserved (GiB)"))
    out.append(Case(
        "torchtitan_llama31_70b_fsdp32_tp8", load_model("meta-llama/Llama-3.1-70B"),
        titan.replace(micro_batch_size=16, recompute=Recompute.FULL, torch_compile=True, float8=Float8.TENSORWISE,
                      parallelism=Parallelism(dp=32, tp=8, zero_stage=3, sequence_parallel=True)),
        h100_96, "reserved", round(pub["torchtitan_llama31_70b_fsdp32_tp8"]["measured"]["peak_reserved_GiB"] * GiB),
        "FSDP 32 x TP 8 with sequence parallel and loss parallel; full AC; torch.compile, float8 tensorwise (its "
        "FSDP float8 all-gather not stated: off)",
        DEVICE_TOLERANCE, "peak reserved (GiB)"))

    llama7b = load_model("meta-llama/Llama-2-7b-hf")
    ds_note = ("LLaMA-7B as Llama-2-7b-hf (same shapes); DeepSpeed bf16 + FusedAdam assumed; figures read as GB = 1e9 "
               "(ZeRO-3's steady 14.8 matches 2P/N + 12P/N + bucket + grad partition in GB, not GiB)")
    for cid, zero, b, ga, rec in (("ds_gist_llama7b_zero2_bs1_nockpt", 2, 1, 8, Recompute.NONE),
                                  ("ds_gist_llama7b_zero2_bs1_ckpt", 2, 1, 8, Recompute.FULL),
                                  ("ds_gist_llama7b_zero3_bs2_nockpt", 3, 2, 4, Recompute.NONE),
                                  ("ds_gist_llama7b_zero3_bs2_ckpt", 3, 2, 4, Recompute.FULL)):
        w = TrainingConfig(micro_batch_size=b, seq_len=4096, grad_accum_steps=ga, precision=Precision.MIXED,
                           recompute=rec, parallelism=Parallelism(dp=8, zero_stage=zero), framework=Framework.DEEPSPEED)
        out.append(Case(cid, llama7b, w, get_device("A800-80GB"), "allocated",
                        round(pub[cid]["measured"]["max_memory_allocated_GB"] * GB), ds_note, MEDIUM_TOLERANCE,
                        "max_memory_allocated (GB)"))
    # the same table's other rows (all with HF gradient checkpointing; the ZeRO++ row is not modelled)
    for cid, zero, b, ga, offload in (("ds_gist_llama7b_zero2_bs1_ckpt_offload_optimizer", 2, 1, 8, Offload.OPTIMIZER),
                                      ("ds_gist_llama7b_zero2_bs4_ckpt", 2, 4, 2, Offload.NONE),
                                      ("ds_gist_llama7b_zero3_bs2_ckpt_offload_optimizer", 3, 2, 4, Offload.OPTIMIZER),
                                      ("ds_gist_llama7b_zero3_bs4_ckpt_offload_optimizer_param", 3, 4, 2, Offload.PARAMS),
                                      ("ds_gist_llama7b_zero3_bs8_ckpt", 3, 8, 1, Offload.NONE),
                                      ("ds_gist_llama7b_zero3_bs8_ga2_ckpt", 3, 8, 2, Offload.NONE)):
        w = TrainingConfig(micro_batch_size=b, seq_len=4096, grad_accum_steps=ga, precision=Precision.MIXED,
                           recompute=Recompute.FULL, offload=offload, parallelism=Parallelism(dp=8, zero_stage=zero),
                           framework=Framework.DEEPSPEED)
        out.append(Case(cid, llama7b, w, get_device("A800-80GB"), "allocated",
                        round(pub[cid]["measured"]["max_memory_allocated_GB"] * GB),
                        ds_note + ("; offload device cpu" if offload is not Offload.NONE else ""), MEDIUM_TOLERANCE,
                        "max_memory_allocated (GB)"))
    out += _litgpt_config_hub(pub)
    out += _litgpt_full(pub)
    out += _litgpt_resource_table(pub)

    # torchtune README "Memory and training speed" (commit 30b8519e8): batch 2 packed to 2048, compile on
    tune = TrainingConfig(micro_batch_size=2, seq_len=2048, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED,
                          recompute=Recompute.FULL, loss=Loss.CHUNKED, lora_library=LoraLibrary.TORCHTUNE,
                          prepare_kbit_training=KbitPrep.NONE, framework=Framework.PYTORCH, torch_compile=True)
    tune_note = ("torchtune 0.3 recipe config; bf16 adapters; CEWithChunkedOutputLoss under torch.compile (the "
                 "compiled loss keeps the chunks' bf16 logits; the compiled layers save inductor's partition)")
    cid = "torchtune_llama31_8b_qlora_4090"
    out.append(Case(cid, load_model("meta-llama/Llama-3.1-8B-Instruct"),
                    tune.replace(method=Method.QLORA, lora=LoraConfig(rank=8, targets="q_proj,k_proj,v_proj,o_proj,"
                                                                                     "gate_proj,up_proj,down_proj")),
                    get_device("RTX-4090"), "allocated", round(pub[cid]["measured"]["peak_memory_per_gpu_GiB"] * GiB),
                    tune_note + "; torchao NF4 base, output projection bf16", MEDIUM_TOLERANCE, "peak memory (GiB)"))
    cid = "torchtune_llama31_70b_lora_8xa100"
    out.append(Case(cid, load_model("meta-llama/Llama-3.1-70B"),
                    tune.replace(method=Method.LORA, lora=LoraConfig(rank=16, targets="q_proj,k_proj,v_proj"),
                                 framework=Framework.FSDP, parallelism=Parallelism(dp=8, zero_stage=3)),
                    a100, "allocated", round(pub[cid]["measured"]["peak_memory_per_gpu_GiB"] * GiB),
                    tune_note + "; FSDP2 over 8 (layers and the root); Llama-3.1-70B-Instruct as Llama-3.1-70B "
                    "(same shapes)", MEDIUM_TOLERANCE, "peak memory (GiB)"))

    cid = "peft_llama2_70b_lora_ds_zero3_8gpu"
    out.append(Case(cid, load_model("meta-llama/Llama-2-70b-hf"),
                    TrainingConfig(method=Method.LORA, micro_batch_size=8, seq_len=2048, grad_accum_steps=4,
                                   precision=Precision.MIXED, optimizer=Optimizer.ADAMW, recompute=Recompute.FULL,
                                   attn_implementation=AttnImplementation.FLASH_ATTENTION_2, framework=Framework.DEEPSPEED,
                                   parallelism=Parallelism(dp=8, zero_stage=3),
                                   lora=LoraConfig(rank=8, targets="all-linear", dropout=0.1)),
                    a100, "device_used", round(pub[cid]["measured"]["gpu_memory_used_GiB"] * GiB),
                    "PEFT docs: trl SFTTrainer on accelerate DeepSpeed ZeRO-3, bf16, packed 2048-token sequences, "
                    "gradient checkpointing, flash-attention 2; the 80 GB GPU type is not stated (A100 assumed)",
                    MEDIUM_TOLERANCE, "GPU memory used (GiB)"))
    cid = "peft_llama2_70b_qlora_ds_zero3_2gpu"
    out.append(Case(cid, load_model("meta-llama/Llama-2-70b-hf"),
                    out[-1].workload.replace(method=Method.QLORA, micro_batch_size=2, grad_accum_steps=2,
                                             parallelism=Parallelism(dp=2, zero_stage=3),
                                             prepare_kbit_training=KbitPrep.NONE),
                    get_device("A100-40GB"), "device_used", round(pub[cid]["measured"]["gpu_memory_used_GiB"] * GiB),
                    "as the LoRA row on 2 GPUs, NF4 base (double quant) stored in bf16 Params4bit that ZeRO-3 "
                    "partitions and gathers packed; trl prepares no sharded QLoRA model (is_sharded_qlora: "
                    "--prepare-kbit-training none); the quant states, which ZeRO-3 does not partition, are counted "
                    "as sharded; 40 GB A100 assumed", MEDIUM_TOLERANCE, "GPU memory used (GiB)"))
    out += _added_cases(pub)
    return out


def _peft_readme_rows(pub: dict[str, dict], lora: TrainingConfig, note: str, a100: Device) -> list[Case]:
    """The peft README table's other rows (commit 73d7224b5, Dec 2022): mt0-xxl and bloomz-7b1 LoRA in plain
    PyTorch, and the three 'PEFT-LoRA DeepSpeed with CPU Offloading' runs: the README's accelerate config
    (ZeRO-3, offload_optimizer and offload_param cpu, mixed_precision 'no': fp32 weights, fp32 gradients) on one
    GPU; accelerate 0.15 writes no bucket keys into the DeepSpeed config it builds from that YAML, so DeepSpeed's
    defaults apply (reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7, persistence threshold 1e5)."""
    ds = {"framework": Framework.DEEPSPEED, "offload": Offload.PARAMS, "parallelism": Parallelism(dp=1, zero_stage=3)}
    ds_note = ("; accelerate DeepSpeed ZeRO-3 on one GPU, parameters and optimizer offloaded to the CPU, fp32 (DeepSpeed "
               "with PR #2653: no gradients for the frozen base), DeepSpeed's bucket defaults")
    seq2seq = lora.replace(lora=LoraConfig(rank=8, targets="q,v", dropout=0.1))
    clm = lora.replace(lora=LoraConfig(rank=8, targets="query_key_value", dropout=0.1), target_len=None)
    clm_note = ("every example left-padded to max_length 64 (the clm example's preprocess_function); torch 1.13: "
                "zero_grad keeps gradients; single-tensor AdamW modelled as fused; bloom's eager ALiBi attention")
    t0, mt0, bloomz = (load_model(m) for m in ("bigscience/T0_3B", "bigscience/mt0-xxl", "bigscience/bloomz-7b1"))
    out = []
    for cid, spec, w, why in (
            ("peft_t0_3b_lora_ds_zero3_offload_a100", t0, seq2seq.replace(**ds), note + ds_note),
            ("peft_mt0_xxl_lora_a100", mt0, seq2seq, note + "; the seq2seq example with bigscience/mt0-xxl (assumed)"),
            ("peft_mt0_xxl_lora_ds_zero3_offload_a100", mt0, seq2seq.replace(**ds),
             note + "; the seq2seq example with bigscience/mt0-xxl (assumed)" + ds_note),
            ("peft_bloomz_7b1_lora_a100", bloomz, clm, clm_note),
            ("peft_bloomz_7b1_lora_ds_zero3_offload_a100", bloomz, clm.replace(**ds), clm_note + ds_note)):
        tolerance = HIGH_TOLERANCE if pub[cid]["confidence"] == "high" else MEDIUM_TOLERANCE
        out.append(Case(cid, spec, w, a100, "allocated", round(pub[cid]["measured"]["peak_gpu_GB"] * GB), why,
                        tolerance, "peak allocated (GB)"))
    return out


def _added_cases(pub: dict[str, dict]) -> list[Case]:
    """The hand mapping of the cases added with the stack mappings (torchtune README rows, the torchtune
    'Optimization flags' rows, unsloth's context benchmarks, torchtitan's CP and 3D rows)."""
    a100, h100_96, h100 = get_device("A100-80GB"), get_device("H100-96GB"), get_device("H100-80GB")
    llama8 = load_model("meta-llama/Llama-3.1-8B-Instruct")
    out: list[Case] = []
    tune = TrainingConfig(micro_batch_size=2, seq_len=2048, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED,
                          recompute=Recompute.FULL, loss=Loss.CHUNKED, lora_library=LoraLibrary.TORCHTUNE,
                          prepare_kbit_training=KbitPrep.NONE, framework=Framework.PYTORCH, torch_compile=True)
    tune_note = "torchtune 0.3 recipe config at the README's commit; CEWithChunkedOutputLoss under torch.compile"
    cid = "torchtune_llama31_8b_full_4090"
    out.append(Case(cid, llama8, tune.replace(optimizer=Optimizer.PAGED_ADAMW8BIT, optimizer_in_bwd=True),
                    get_device("RTX-4090"), "allocated", round(pub[cid]["measured"]["peak_memory_per_gpu_GiB"] * GiB),
                    tune_note + "; PagedAdamW8bit (its states of tensors >= 1e5 elements in managed memory, in no "
                    "torch.cuda figure), optimizer in backward", MEDIUM_TOLERANCE, "peak memory (GiB)"))
    cid = "torchtune_llama31_70b_full_8xa100_cpu_offload"
    out.append(Case(cid, load_model("meta-llama/Llama-3.1-70B"),
                    tune.replace(framework=Framework.FSDP, offload=Offload.PARAMS,
                                 parallelism=Parallelism(dp=8, zero_stage=3),
                                 custom_sharded_layers="tok_embeddings,output"),
                    a100, "allocated", round(pub[cid]["measured"]["peak_memory_per_gpu_GiB"] * GiB),
                    tune_note + "; FSDP2 over 8 with CPUOffloadPolicy (shards and the fused AdamW step on the host), "
                    "the token embedding and the output projection FSDP units of their own (custom_sharded_layers); "
                    "Llama-3.1-70B-Instruct as Llama-3.1-70B (same shapes)", MEDIUM_TOLERANCE, "peak memory (GiB)"))
    cid = "torchtune_llama31_405b_qlora_8xa100"
    out.append(Case(cid, load_model("meta-llama/Llama-3.1-405B"),
                    tune.replace(method=Method.QLORA, loss=Loss.DEFAULT, framework=Framework.FSDP,
                                 parallelism=Parallelism(dp=8, zero_stage=3),
                                 lora=LoraConfig(rank=16, targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                                                                  "down_proj")),
                    a100, "allocated", round(pub[cid]["measured"]["peak_memory_per_gpu_GB"] * GiB),
                    "torchtune 0.3 405B_qlora recipe: torchao NF4 base under FSDP2 over 8, the layers compiled, the "
                    "plain CrossEntropyLoss eager (the recipe drops compile_loss's compiled module); the README's "
                    "'GB' read as GiB (get_memory_stats divides by 1024**3: torchtune/training/memory.py at "
                    "30b8519e8); Llama-3.1-405B-Instruct as Llama-3.1-405B (same shapes)", MEDIUM_TOLERANCE,
                    "peak memory ('GB', GiB)"))

    llama3b = load_model("meta-llama/Llama-3.2-3B-Instruct")
    flags = TrainingConfig(micro_batch_size=2, seq_len=4096, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED,
                           framework=Framework.PYTORCH, lora_library=LoraLibrary.TORCHTUNE,
                           prepare_kbit_training=KbitPrep.NONE)
    compiled = flags.replace(torch_compile=True, loss=Loss.CHUNKED)
    ac = compiled.replace(recompute=Recompute.FULL)
    offloaded = ac.replace(activation_offloading=True)
    lora64 = LoraConfig(rank=64, targets="q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    flags_note = ("torchtune full_finetune_single_device, bf16 params and states, packed 4096-token sequences; each "
                  "row adds its technique to the previous one")
    for cid, w in (("torchtune_llama32_3b_full_chunked_ce_a100", compiled),
                   ("torchtune_llama32_3b_full_ac_a100", ac),
                   ("torchtune_llama32_3b_full_opt_in_bwd_a100", ac.replace(optimizer_in_bwd=True)),
                   ("torchtune_llama32_3b_full_act_offload_a100", offloaded.replace(optimizer_in_bwd=True)),
                   ("torchtune_llama32_3b_full_adamw8bit_a100", offloaded.replace(optimizer_in_bwd=True,
                                                                                   optimizer=Optimizer.ADAMW8BIT)),
                   ("torchtune_llama32_3b_lora_a100", offloaded.replace(method=Method.LORA, lora=lora64)),
                   ("torchtune_llama32_3b_qlora_a100", offloaded.replace(method=Method.QLORA, lora=lora64))):
        out.append(Case(cid, llama3b, w, a100, "allocated", round(pub[cid]["measured"]["peak_memory_active_GiB"] * GiB),
                        flags_note + "; the compiled chunked cross-entropy keeps bf16 logits, the compiled layers "
                        "inductor's partition", HIGH_TOLERANCE, "peak active (GiB)"))

    unsloth_own = TrainingConfig(method=Method.QLORA, micro_batch_size=1, precision=Precision.BF16,
                                 optimizer=Optimizer.ADAMW8BIT, recompute=Recompute.FULL, activation_offloading=True,
                                 loss=Loss.FUSED, attn_implementation=AttnImplementation.FLASH_ATTENTION_2,
                                 framework=Framework.PYTORCH, lora=LoraConfig(rank=32, targets="all-linear"),
                                 prepare_kbit_training=KbitPrep.NONE, lora_library=LoraLibrary.UNSLOTH,
                                 stack=Stack.UNSLOTH)
    hf_fa2 = unsloth_own.replace(activation_offloading=False, loss=Loss.DEFAULT, prepare_kbit_training=KbitPrep.TRL,
                                 lora_library=LoraLibrary.PEFT, stack=None)
    llama70 = load_model("meta-llama/Llama-3.3-70B-Instruct")
    for cid, spec, device, w, note in (
            ("unsloth_llama31_8b_qlora_max_context_unsloth", llama8, h100, unsloth_own,
             "unsloth's column: offloaded checkpoints (one layer's input back on the device: the unsloth stack's), "
             "fused cross-entropy, adamw_8bit (its examples), its LoRA kernels (lora_dropout 0)"),
            ("unsloth_llama33_70b_qlora_max_context", llama70, a100, hf_fa2,
             "the HF + FA2 column: trl's SFTTrainer with bf16 assumed (--prepare-kbit-training trl), checkpointing on, "
             "adamw_8bit"),
            ("unsloth_llama33_70b_qlora_max_context_unsloth", llama70, a100, unsloth_own,
             "unsloth's column: offloaded checkpoints (one back on the device), fused cross-entropy, adamw_8bit (its "
             "examples), its LoRA kernels (lora_dropout 0)")):
        tokens = pub[cid]["measured"]["max_context_tokens"]
        out.append(Case(cid, spec, w.replace(seq_len=tokens), device, "device_used", device.memory_bytes,
                        f"the longest context that fits 80 GB ({tokens:,} tokens) should need the whole device; "
                        + note,
                        MEDIUM_TOLERANCE, "capacity at the max context"))

    titan = TrainingConfig(micro_batch_size=1, seq_len=32768, precision=Precision.FSDP2, optimizer=Optimizer.ADAMW,
                           recompute=Recompute.FULL, parallelism=Parallelism(dp=8, zero_stage=3), torch_compile=True,
                           float8=Float8.TENSORWISE)
    titan_note = ("torchtitan FSDP2 (bf16 params, fp32 reduce), full AC, foreach AdamW; torch.compile and float8 "
                  "tensorwise (the table's)")
    for cid, spec, w, note in (
            ("torchtitan_llama31_8b_fsdp8_cp1_32k", load_model("meta-llama/Llama-3.1-8B"), titan, ""),
            ("torchtitan_llama31_8b_fsdp1_cp8_256k", load_model("meta-llama/Llama-3.1-8B"),
             titan.replace(seq_len=262144, parallelism=Parallelism(dp=1, cp=8, zero_stage=3)),
             "; context parallel 8 (each rank a 32,768-token shard)"),
            ("torchtitan_llama31_405b_fsdp8_tp8_pp8_1f1b", load_model("meta-llama/Llama-3.1-405B"),
             titan.replace(micro_batch_size=4, seq_len=8192, grad_accum_steps=8, float8_all_gather=True,
                           parallelism=Parallelism(dp=8, tp=8, pp=8, zero_stage=3, sequence_parallel=True)),
             "; float8 all-gather (llama3_405b.toml); FSDP 8 x TP 8 (sequence parallel) x PP 8 on 64 hosts, 1F1B, "
             "the local batch 32 as 8 micro-batches "
             "of 4")):
        conf = MEDIUM_TOLERANCE if pub[cid]["confidence"] == "medium" else DEVICE_TOLERANCE
        out.append(Case(cid, spec, w, h100_96, "reserved", round(pub[cid]["measured"]["peak_reserved_GiB"] * GiB),
                        titan_note + note, conf, "peak reserved (GiB)"))

    a6000, rtx4090 = get_device("RTX-A6000"), get_device("RTX-4090")
    cid = "axolotl_llama3_8b_fft_48gb"
    out.append(Case(cid, load_model("meta-llama/Meta-Llama-3-8B"),
                    TrainingConfig(micro_batch_size=1, seq_len=8192, grad_accum_steps=8, precision=Precision.BF16,
                                   optimizer=Optimizer.PAGED_ADAMW8BIT, recompute=Recompute.FULL,
                                   attn_implementation=AttnImplementation.FLASH_ATTENTION_2, framework=Framework.PYTORCH),
                    a6000, "device_used", a6000.memory_bytes,
                    "axolotl's fft-8b.yaml: bf16 params trained in place, paged 8-bit AdamW (its states in managed "
                    "memory: resident while the card has room, the rest evicted to host RAM), 8192 packed tokens; 'Single GPU @ 48GB VRAM' as a 48 GB card's capacity (RTX A6000)",
                    MEDIUM_TOLERANCE, "capacity of the named 48 GB card"))
    cid = "axolotl_llama3_70b_qlora_fsdp_offload_2gpu"
    out.append(Case(cid, load_model("meta-llama/Meta-Llama-3-70B"),
                    TrainingConfig(method=Method.QLORA, micro_batch_size=1, seq_len=512, grad_accum_steps=4,
                                   precision=Precision.FSDP2, optimizer=Optimizer.ADAMW, recompute=Recompute.FULL,
                                   attn_implementation=AttnImplementation.FLASH_ATTENTION_2, framework=Framework.FSDP,
                                   offload=Offload.PARAMS, parallelism=Parallelism(dp=2, zero_stage=3),
                                   lora=LoraConfig(rank=8, targets="all-linear", dropout=0.05),
                                   prepare_kbit_training=KbitPrep.NONE),
                    rtx4090, "device_used", round(pub[cid]["measured"]["gpu_memory_per_gpu_GB"] * GB),
                    "axolotl's qlora-fsdp-70b.yaml: FSDP full shard over 2 with fsdp_offload_params (shards and the "
                    "step on the host), bf16 compute over the NF4 base, no prepare_model_for_kbit_training (axolotl "
                    "skips it under FSDP), 512 tokens; a 24 GB card assumed; the README's "
                    "'21GB' read as 1e9", MEDIUM_TOLERANCE, "VRAM per GPU (GB)"))
    return out


def _fms_acceleration(pub: dict[str, dict], a100: Device) -> list[Case]:
    """fms-acceleration's refs/a100_80gb.csv rows (``fms_*``, commit 24bdadb; the rule is in each case's caveats):
    fms-hf-tuning 2.5.0 on transformers 4.48.1 / torch 2.4.1 / trl 0.13.0, each as its peak allocated (rank 0) and
    its nvidia-smi figure (``@nvidia``, the mean over the GPUs).

    Two GPUs ran under ``accelerate launch`` with scripts/benchmarks/accelerate.yaml: FSDP FULL_SHARD over both,
    no offload, ``fsdp_cpu_ram_efficient_loading`` (the model loaded on rank 0's CPU, meta elsewhere). QLoRA there:
    framework_plugin_bnb.py sets ``bnb_4bit_quant_storage`` to the torch dtype (bf16) under FSDP and puts the
    meta Params4bit on the CPU, so trl 0.13 ``SFTTrainer._prepare_peft_model`` finds the 4-bit weights off the
    GPU (``is_sharded_qlora``) and skips both ``prepare_model_for_kbit_training`` and
    ``peft_module_casting_to_bf16``: the norms stay bf16 (:attr:`KbitPrep.NONE`); on one GPU it runs both
    (:attr:`KbitPrep.TRL`)."""
    note = ("HF Trainer (transformers 4.48, torch 2.4.1: adamw_torch = foreach AdamW; ForCausalLMLoss's shifted "
            "fp32 copy of the logits), torch_dtype bf16, gradient checkpointing, flash_attention_2, packed 4096-token "
            "sequences; QLoRA through trl 0.13's SFTTrainer with bf16=True (--prepare-kbit-training trl on one GPU: "
            "prepare_model_for_kbit_training, then peft_module_casting_to_bf16: norms fp32, embeddings and lm_head "
            "bf16, fp32 residual stream; under FSDP trl skips both: none)")
    lora16 = LoraConfig(rank=16, targets="q_proj,k_proj,v_proj,o_proj", dropout=0.1)
    out = []
    for cid, case in pub.items():
        if not cid.startswith("fms_"):
            continue
        n = case["hardware"]["count"]
        w = TrainingConfig(micro_batch_size=case["batch_size"], seq_len=4096, precision=Precision.BF16,
                           optimizer=Optimizer.ADAMW, recompute=Recompute.FULL, loss=Loss.SHIFT_COPY,
                           attn_implementation=AttnImplementation.FLASH_ATTENTION_2, framework=Framework.PYTORCH)
        if n > 1:
            w = w.replace(framework=Framework.FSDP, parallelism=Parallelism(dp=n, zero_stage=3))
        if case["kind"] in ("lora", "qlora"):
            w = w.replace(method=Method(case["kind"]), lora=lora16)
        if case["kind"] == "qlora":
            w = w.replace(prepare_kbit_training=KbitPrep.NONE if n > 1 else KbitPrep.TRL)
        spec = load_model(case["model"])
        measured = case["measured"]
        out.append(Case(cid, spec, w, a100, "allocated", measured["raw_peak_torch_alloc_bytes"], note,
                        HIGH_TOLERANCE, "peak allocated (bytes)"))
        out.append(Case(cid + "@nvidia", spec, w, a100, "device_used", measured["nvidia_mem_reserved_MiB"] * MiB,
                        note, DEVICE_TOLERANCE, "nvidia-smi used (MiB)"))
    return out


_LITGPT_MODELS = {"unsloth/Mistral-7B-v0.2": "mistralai/Mistral-7B-v0.1"}
"""litgpt config-hub checkpoints memest loads by another name with the same shapes."""


def _litgpt_config_hub(pub: dict[str, dict]) -> list[Case]:
    """The litgpt config-hub table's 1xA10G LoRA / QLoRA rows (``litgpt_*_a10g`` but the first one):
    litgpt 0.4 ``finetune/lora.py`` with the row's yaml, bf16-true, no checkpointing, 512 tokens."""
    out = []
    for cid, case in pub.items():
        if not (cid.startswith("litgpt_") and cid.endswith("_a10g") and "commit" in case["source"]
                and case["kind"] in ("lora", "qlora")):
            continue
        lora = case["settings"]["lora"]
        model = case["model"]
        fused = "query_key_value" if model.startswith("tiiuae/falcon") else "q_proj,v_proj"
        targets = "all-linear" if lora["mlp"] else fused
        method = Method(case["kind"])
        w = TrainingConfig(method=method, micro_batch_size=case["batch_size"], seq_len=512,
                           grad_accum_steps=case["grad_accum"], precision=Precision.BF16,
                           optimizer=Optimizer.PAGED_ADAMW32BIT if method is Method.QLORA else Optimizer.ADAMW_FUSED,
                           framework=Framework.PYTORCH,
                           lora=LoraConfig(rank=lora["r"], targets=targets, dropout=lora["dropout"]),
                           lora_library=LoraLibrary.LITGPT, prepare_kbit_training=KbitPrep.NONE,
                           loss=Loss.LITGPT_CHUNKED)
        note = ("litgpt 0.4 bf16-true (bf16 adapters; litgpt's own lm_head for a tied checkpoint); 512 tokens "
                "assumed (max_seq_length)")
        if method is Method.QLORA:
            note += ("; bnb.nf4 on every linear and the lm_head (no double quant), bitsandbytes 0.42 (MatMul4Bit "
                     "keeps its input as ctx.tensors, alive until fit() rebinds loss in the next micro-batch); bitsandbytes PagedAdamW (fp32 states, those of tensors >= 1e5 elements in "
                     "managed memory, outside the allocator's count)")
        if lora["head"]:
            note += "; the lm_head's LoRA adapter is not modelled ((V + h) x r elements)"
        if fused == "query_key_value" and not lora["mlp"]:
            note += "; litgpt's q/v-only adapter on the fused QKV is modelled as one on the whole QKV"
        out.append(Case(cid, load_model(_LITGPT_MODELS.get(model, model)), w, get_device("A10G"), "allocated",
                        round(case["measured"]["peak_memory_GB"] * GB), note, HIGH_TOLERANCE, "peak allocated (GB)"))
    return out


def _litgpt_untied(model: str) -> ModelSpec:
    """``model`` as litgpt 0.4 builds it for full training: its ``GPT`` always has its own ``lm_head``
    (``litgpt/model.py`` at commit 5895df10) and ``scripts/convert_hf_checkpoint.py`` copies a tied checkpoint's
    ``transformer.wte.weight`` into it, so both train (and shard, and take optimizer states) separately."""
    cfg = load_config(model)
    spec = spec_from_config(cfg)
    if not spec.tie_word_embeddings:
        return spec
    return spec_from_config(HFConfig({**cfg.raw, "tie_word_embeddings": False}, name=cfg.name, source=cfg.source))


def _litgpt_full(pub: dict[str, dict]) -> list[Case]:
    """The litgpt config-hub table's full fine-tune rows (commit 5895df10, ``litgpt/finetune/full.py``): the yaml's
    devices; over several, Fabric's FSDP1 FULL_SHARD with every Block checkpointed and accumulation inside
    ``no_backward_sync`` (:mod:`memest.estimate.training.fsdp`); bf16-true params and AdamW states; 512 tokens."""
    out = []
    for cid, case in pub.items():
        if not (cid.startswith("litgpt_") and case["kind"] in ("train_full", "train_multi_gpu")):
            continue
        n = case["hardware"]["count"]
        w = TrainingConfig(micro_batch_size=case["batch_size"], seq_len=512, grad_accum_steps=case["grad_accum"],
                           precision=Precision.BF16, optimizer=Optimizer.ADAMW, framework=Framework.PYTORCH)
        note = "litgpt bf16-true (bf16 params, grads and AdamW states); litgpt's own lm_head; 512 tokens assumed"
        if n > 1:
            w = w.replace(framework=Framework.FSDP, parallelism=Parallelism(dp=n, zero_stage=3),
                          recompute=Recompute.FULL, fsdp_flat_params=True, no_sync_accumulation=True)
            note += ("; Fabric FSDP1 FULL_SHARD over the yaml's devices, Block checkpointing, the root unit's "
                     "gradient assembled at the embedding's backward"
                     + (", accumulation inside no_sync (unsharded gradients)" if case["grad_accum"] > 1 else ""))
        out.append(Case(cid, _litgpt_untied(case["model"]), w, get_device("A10G"), "allocated",
                        round(case["measured"]["peak_memory_GB"] * GB), note, HIGH_TOLERANCE, "peak allocated (GB)"))
    return out


def _litgpt_resource_table(pub: dict[str, dict]) -> list[Case]:
    """The LoRA and bnb.nf4 rows of litgpt's ``tutorials/resource-tables.md`` (commit 0cc02afa, run at Lit-GPT 8641822):
    ``finetune/lora.py``, bf16-true, rank-8 q/v adapters, the longest Alpaca sample; over several A100s Fabric's
    FSDP1 with every Block checkpointed, each Block's FlatParameter holding its frozen base and adapters, and
    accumulation inside ``no_backward_sync`` (:mod:`memest.estimate.training.fsdp`)."""
    out = []
    for cid, case in pub.items():
        if not cid.startswith("litgpt_oct23_"):
            continue
        n, lora = case["hardware"]["count"], case["settings"]["lora"]
        targets = "query_key_value" if case["model"].startswith("stabilityai/") else "q_proj,v_proj"
        method = Method(case["kind"])
        w = TrainingConfig(method=method, micro_batch_size=case["batch_size"],
                           seq_len=case["seq_len"]["longest_sample"], grad_accum_steps=case["grad_accum"],
                           precision=Precision.BF16, framework=Framework.PYTORCH,
                           optimizer=Optimizer.PAGED_ADAMW32BIT if method is Method.QLORA else Optimizer.ADAMW,
                           lora=LoraConfig(rank=lora["r"], targets=targets, dropout=lora["dropout"]),
                           lora_library=LoraLibrary.LITGPT, prepare_kbit_training=KbitPrep.NONE,
                           loss=Loss.LITGPT_CHUNKED)
        note = "Lit-GPT 8641822 bf16-true (bf16 adapters), the longest sample's tokens with the steady-state gradients"
        if method is Method.QLORA:
            note += ("; Fabric bnb.nf4 on every linear and the lm_head (no double quant), bitsandbytes PagedAdamW; "
                     "MatMul4Bit's ctx.tensors of the previous micro-batch counted (as bitsandbytes 0.42)")
        if targets == "query_key_value":
            note += "; the q/v adapter on GPT-NeoX's fused QKV modelled as one on the whole QKV (same 2,097,152 elements)"
        if n > 1:
            w = w.replace(framework=Framework.FSDP, parallelism=Parallelism(dp=n, zero_stage=3),
                          recompute=Recompute.FULL, fsdp_flat_params=True, no_sync_accumulation=True)
            note += ("; Fabric FSDP1 FULL_SHARD, Block checkpointing; each layer's FlatParameter mixes the frozen base "
                     "with the adapters, so its whole gradient is made, kept unsharded inside no_sync")
        out.append(Case(cid, load_model(case["model"]), w, get_device("A100-40GB"), "allocated",
                        round(case["measured"]["peak_memory_GB"] * GB), note, HIGH_TOLERANCE, "peak allocated (GB)"))
    return out


def figure(rank: RankEstimate, metric: str) -> int:
    """memest's figure of a published metric."""
    return {"allocated": rank.allocated_bytes, "reserved": rank.reserved_bytes,
            "device_used": rank.device_used_bytes}[metric]


def rows() -> list[Row]:
    """Every case re-estimated."""
    out = []
    for case in build_cases():
        est = estimate(case.spec, case.workload, case.device)
        out.append(Row(case, figure(est.per_device, case.metric), est))
    return out


def stack_rows(table: list[Row]) -> list[Row]:
    """Every case of ``table`` (the hand mapping, :func:`rows`) mapped through its stack instead: the same model,
    device and figure, the workload :func:`memest.validation.stack_mapping.workload` resolves. Each row's
    ``case.extra`` holds ``via`` (how it was mapped) and ``differences`` (the settings where the two mappings
    disagree, :func:`memest.validation.stack_mapping.differences`)."""
    pub = cases_by_id()
    out = []
    for r in table:
        published = pub[r.case.id.split("@")[0]]
        m = stack_mapping.mapping(published)
        w = stack_mapping.workload(m, r.case.spec, r.case.device)
        differences = stack_mapping.differences(r.case.workload, w, m)
        case = dataclasses.replace(r.case, workload=w, note=published.get("stack_note", ""),
                                   extra={"via": m.via, "differences": differences})
        est = estimate(case.spec, w, case.device)
        out.append(Row(case, figure(est.per_device, case.metric), est))
    return out


def verdicts(row: Row) -> tuple[bool, bool]:
    """Whether a row is within its tolerance, and within issue 14's goal (:data:`memest.validation.gaps.GOAL`)."""
    return abs(row.error) <= row.case.tolerance, abs(row.error) <= GOAL


def summary(table: list[Row]) -> dict[str, float]:
    """Median |error| and the worst under-prediction over the primary figure of each case."""
    primary = [r for r in table if "@" not in r.case.id]
    errors = [abs(r.error) for r in primary]
    return {"cases": len(primary), "median_abs_error": statistics.median(errors),
            "worst_under": min(r.error for r in primary), "worst_over": max(r.error for r in primary)}


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def _summary_line(name: str, table: list[Row]) -> str:
    s = summary(table)
    beyond = sum(1 for r in table if "@" not in r.case.id and not verdicts(r)[1])
    return (f"| {name} | {s['cases']} | {s['median_abs_error']:.1%} | {s['worst_under']:+.1%} | "
            f"{s['worst_over']:+.1%} | {beyond} |")


def _published(r: Row, pub: dict[str, dict]) -> dict:
    return pub[r.case.id.split("@")[0]]


def markdown(table: list[Row], stacked: list[Row]) -> str:
    """The report benchmarks/training_cases.md: ``table`` (the hand mapping, :func:`rows`) beside ``stacked``
    (the same cases through their stacks, :func:`stack_rows`)."""
    pub = cases_by_id()
    lines = [
        "# Training cases: memest vs published measurements",
        "",
        "Generated by `python benchmarks/training_cases.py` from `benchmarks/data/validation_cases.json` (kinds "
        + ", ".join(KINDS) + "). Like with like: peak allocated vs allocated, peak reserved vs reserved, "
        "nvidia-smi vs device used. GiB = 2^30 bytes. Error = predicted / measured - 1.",
        "",
        "Two mappings of every case: **hand**, the settings chosen per case in `memest/validation/training.py` (what "
        "the run is believed to have done, version by version), and **stack**, what a user of the run's stack gets "
        "from memest: `--stack S`, the settings the source states and the config files memest reads "
        "(`memest/validation/stack_mapping.py`; the stored files are under `benchmarks/data/configs/`). Rows marked "
        "@nvidia compare a second figure of the same run.",
        "",
        "Cases collected for issue 14 (`collected_for` in the cases file) are runs memest was never compared "
        "with before; their rows are its check on unseen runs.",
        "",
        "| mapping | cases | median \\|error\\| | worst under | worst over | beyond ±10% |",
        "|---|---:|---:|---:|---:|---:|",
        _summary_line("hand", table),
        _summary_line("stack", stacked),
        _summary_line("hand, the earlier cases", [r for r in table if "collected_for" not in _published(r, pub)]),
        _summary_line("stack, the earlier cases", [r for r in stacked if "collected_for" not in _published(r, pub)]),
        _summary_line("hand, collected for issue 14", [r for r in table if "collected_for" in _published(r, pub)]),
        _summary_line("stack, collected for issue 14", [r for r in stacked if "collected_for" in _published(r, pub)]),
        "",
        "| case | conf. | metric | measured GiB | hand GiB | hand error | stack GiB | stack error | tol. | stack | "
        "via |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r, st in zip(table, stacked, strict=True):
        c = pub[r.case.id.split("@")[0]]
        lines.append(f"| {r.case.id} | {c['confidence']} | {r.case.figure or r.case.metric} | "
                     f"{_gib(r.case.measured_bytes)} | {_gib(r.predicted_bytes)} | {r.error:+.1%} | "
                     f"{_gib(st.predicted_bytes)} | {st.error:+.1%} | ±{r.case.tolerance:.0%} | {c['stack']} | "
                     f"{st.case.extra['via']} |")
    lines += ["", "## Where the two mappings differ", "",
              "Each setting the hand mapping chose that the stack mapping does not, as `setting: hand X, <where the "
              "stack mapping's value comes from> Y` (stated: the source; file: a config file memest read; stack "
              "default: the stack's own default). A case whose verdict changes between the mappings (inside / "
              "outside its tolerance or ±10%) says why.", ""]
    for r, st in zip(table, stacked, strict=True):
        if "@" in r.case.id or not st.case.extra["differences"]:
            continue
        lines.append(f"- **{r.case.id}** (hand {r.error:+.1%}, stack {st.error:+.1%}): "
                     + "; ".join(st.case.extra["differences"]) + ".")
        if r.case.id in STACK_GAPS:
            lines.append(f"  Why: {STACK_GAPS[r.case.id]}.")
    lines += ["", f"## Outside issue 14's goal (|error| > {GOAL:.0%} on the figure the source measured)", "",
              "Every case beyond the goal under either mapping, and the mechanism still missing "
              "(`memest/validation/gaps.py`: the same reasons the tests give their expected failures).", "",
              "| case | hand error | stack error | missing |", "|---|---:|---:|---|"]
    for r, st in zip(table, stacked, strict=True):
        if verdicts(r)[1] and verdicts(st)[1]:
            continue
        reasons = [KNOWN_GAPS[r.case.id]] if r.case.id in KNOWN_GAPS else []
        if r.case.id in STACK_GAPS and verdicts(r) != verdicts(st):
            reasons.append("stack mapping: " + STACK_GAPS[r.case.id])
        why = " / ".join(reasons)
        lines.append(f"| {r.case.id} | {r.error:+.1%} | {st.error:+.1%} | {why} |")
    lines += ["", "## What each case assumes", ""]
    for r, st in zip(table, stacked, strict=True):
        if "@" in r.case.id:
            continue
        read = st.case.workload.config_read
        lines.append(f"- **{r.case.id}**: hand: {r.case.note}. Stack ({pub[r.case.id]['stack']}): {st.case.note}"
                     + (f"; read: {'; '.join(read)}" if read else "") + ".")
    lines += ["", "## Terms of each estimate (GiB, the peak moment, hand mapping)", ""]
    for r in table:
        if "@" in r.case.id:
            continue
        terms = ", ".join(f"{t.name} {_gib(t.bytes)}" for t in r.estimate.per_device.terms)
        lines.append(f"- {r.case.id}: {terms}")
    lines.append("")
    return "\n".join(lines)
