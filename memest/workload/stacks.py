"""What each training stack does by default, read from its source at a stated version.

One row per :class:`~memest.workload.config.Stack`: the precision recipe its "bf16" switch runs, who runs
the step on one device and on several, its default optimizer, attention kernel, loss, activation
checkpointing, QLoRA preparation and LoRA targets. :func:`stack_of` picks the stack a job names or
implies; :func:`apply` fills the settings a user did not give from it (what the user gave wins), :func:`restack`
fills them again for another stack or layout (a planned setup, as its printed command resolves);
:func:`supports` says which methods a stack runs;
:func:`recipe_words` is the job line's sentence ("HF Trainer 4.57, bf16=True: fp32 params, autocast
bf16, adamw_torch_fused").

Sources (each row cites the file that sets its defaults):

- transformers 4.57 ``src/transformers/training_args.py``: ``default_optim = "adamw_torch"``, then
  ``"adamw_torch_fused"`` when ``is_torch_greater_or_equal_than_2_8``; ``gradient_checkpointing`` False;
  ``bf16=True`` runs ``accelerator.autocast()`` over fp32 parameters (the model is loaded in fp32 unless
  ``torch_dtype`` says otherwise). ``modeling_utils`` picks ``sdpa`` when torch has it.
- trl 0.25 ``trl/trainer/sft_config.py`` (``SFTConfig`` subclasses ``TrainingArguments``: its ``optim``
  and bf16 path) and ``trl/trainer/sft_trainer.py`` (4-bit model: ``prepare_model_for_kbit_training``,
  ``peft_module_casting_to_bf16``, :attr:`KbitPrep.TRL`); ``SFTConfig.activation_offloading`` (False) runs
  ``trl/models/activation_offloading.py``, torchtune's ``OffloadActivations`` ported (``max_fwd_stash_size`` 5).
  ``SFTConfig.gradient_checkpointing`` defaults to True (since trl 0.22.0, commit a222aeb4 "New defaults:
  ``gradient_checkpointing=True``", #3510, 2025-08-08, in ``DPOConfig``, ``GRPOConfig`` and the other trainer
  configs too): full recompute; trl 0.25 passes no ``gradient_checkpointing_kwargs``, so transformers 4.57's
  ``gradient_checkpointing_enable`` runs ``use_reentrant=True`` (trl 0.27 sets ``use_reentrant=False`` under
  transformers < 5), each layer rebuilt in its backward either way. ``loss_type`` defaults to ``"nll"``, the
  model's own cross-entropy over the whole logits (``"chunked_nll"``, the lm_head a chunk at a time, is the
  default only from trl 1.5).
- accelerate ``accelerate config`` FSDP: ``fsdp_sharding_strategy`` FULL_SHARD, ``mixed_precision bf16``
  as FSDP ``MixedPrecision(param_dtype=bf16)`` over fp32 sharded parameters.
- torchtune 0.6 ``recipes/configs/llama3_1/8B_full.yaml`` / ``8B_full_single_device.yaml``: ``dtype: bf16``
  (parameters and optimizer states bf16, no fp32 master), ``optimizer: torch.optim.AdamW`` with
  ``fused: True``, ``loss: torchtune.modules.loss.CEWithChunkedOutputLoss``,
  ``enable_activation_checkpointing: True``, ``enable_activation_offloading: False``; ``optimizer_in_bwd:
  False`` in ``8B_full.yaml`` (the single-device configs of llama3 / llama3.1 / llama3.2 / most qwen2 turn it on:
  memest keeps it off, the higher estimate, unless asked); ``full_finetune_distributed`` shards with FSDP2
  ``fully_shard``.
- torchtitan ``torchtitan/models/llama3/train_configs/llama3_8b.toml``: ``mixed_precision_param = "bfloat16"``
  (FSDP2, fp32 reduce), ``[activation_checkpoint] mode = "selective"``, ``selective_ac_option = "op"``;
  ``[optimizer] name = "AdamW"`` with ``implementation = "fused"`` (``config/job_config.py``).
- axolotl ``examples/llama-3/fft-8b.yaml``: ``bf16: auto`` loads the weights in bf16 and trains them in
  place (pure bf16 states); the optimizer falls to the Trainer's default. Its QLoRA base keeps every
  non-quantized weight at ``torch_dtype`` (:attr:`KbitPrep.NONE`): ``src/axolotl/utils/models.py`` (commit
  15f7910, 2024-04) and ``src/axolotl/loaders/model.py`` (2025, ``_configure_embedding_dtypes``) set
  ``needs_fa2_dtype`` for any ``adapter: lora / qlora`` and, after ``prepare_model_for_kbit_training`` has upcast
  them, cast the modules named ``*norm*`` and the embedding modules (``embed_tokens``, ``lm_head``) back to
  ``torch_dtype`` "for flash-attn compatibility", unless QLoRA under FSDP, which skips the preparation itself
  (as ZeRO-3 does): either way the residual stream stays 16-bit.
- LLaMA-Factory ``src/llamafactory/hparams/finetuning_args.py``: ``lora_target`` default ``"all"``
  (every linear), ``pure_bf16`` False (``model/adapter.py`` upcasts trained parameters to fp32);
  ``model_args.py`` ``disable_gradient_checkpointing`` False (checkpointing on).
- unsloth ``unsloth/models/llama.py``: ``use_gradient_checkpointing="unsloth"`` (full checkpointing with the
  checkpoints in host RAM: ``unsloth_zoo/gradient_checkpointing.py``, activation offloading), its fused
  cross-entropy, LoRA on every linear in its examples, PEFT adapters whose layers its own LoRA kernels run
  (:attr:`LoraLibrary.UNSLOTH`).
- litgpt ``litgpt/finetune/full.py``: ``precision`` from ``get_default_supported_precision(training=True)``
  = ``"bf16-mixed"`` (fp32 parameters, autocast), ``torch.optim.AdamW``; several devices: Fabric
  ``FSDPStrategy`` (FULL_SHARD). Its LoRA / QLoRA (``litgpt/finetune/lora.py``) builds the adapters
  and quantizes the base its own way (:attr:`LoraLibrary.LITGPT`); torchtune likewise
  (:attr:`LoraLibrary.TORCHTUNE`); unsloth runs PEFT with its own kernels (:attr:`LoraLibrary.UNSLOTH`); NeMo 2 its own
  adapters on Megatron-core layers (``nemo/collections/llm/peft/lora.py``, :attr:`LoraLibrary.MEGATRON`); every
  other stack runs PEFT. ``--quantize bnb.*`` refuses a
  mixed precision ("Quantization and mixed precision is not supported"): its QLoRA runs
  ``bf16-true``, as every ``config_hub/finetune/*/qlora.yaml`` sets.
- DeepSpeed ``bf16: {enabled: true}``: bf16 parameters and gradients, fp32 master and Adam states in its
  optimizer (FusedAdam); ZeRO stage as given.
- Megatron-LM ``megatron/training/arguments.py`` ``--bf16``: bf16 parameters, fp32 ``main_grad`` and master;
  ``--use-distributed-optimizer`` is off unless asked. NeMo 2 ``MegatronMixedPrecision("bf16-mixed")``
  with ``use_distributed_optimizer=True`` (``nemo/collections/llm/recipes/*``).
- PyTorch FSDP2 ``fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))``;
  a plain PyTorch loop with ``torch.autocast(bf16)`` over fp32 parameters and ``torch.optim.AdamW``.

The methods each stack runs (:attr:`StackDefaults.methods`; a pair not listed is refused, and the planner
never proposes one): the HF Trainer, trl, axolotl, LLaMA-Factory, unsloth (``full_finetuning=True`` or its
LoRA / QLoRA), accelerate, DeepSpeed, FSDP2 and a plain PyTorch loop train a PEFT LoRA model or a
bitsandbytes 4-bit one (PEFT docs, "DeepSpeed" and "Fully Sharded Data Parallel": QLoRA with ZeRO-3 / FSDP);
torchtune (``recipes/lora_finetune_*.py``, ``qlora`` configs, torchao NF4) and litgpt (``finetune/lora.py``,
``--quantize bnb.nf4``) build their own. torchtitan at commit b5bcd76c (2026-08-21) has LoRA in-tree
(``torchtitan/components/lora.py`` ``LoRAConverter``, added in 74181b1e, 2026-05-08) and no 4-bit base
(no NF4 / bitsandbytes outside ``experiments/``): full and LoRA. Megatron-LM has neither: issue
NVIDIA/Megatron-LM#554 ("Support of LoRA/QLoRA?", answered "We have support for LoRA and other adapters in
NeMo"); #7267 (moving Megatron-Bridge's PEFT into Megatron Core) is open: full only. NeMo 2
``nemo/collections/llm/peft`` has LoRA (its PEFT notebook: "NeMo 2.0 currently supports Low-Rank Adaptation
(LoRA)") and no bitsandbytes QLoRA: full and LoRA.

Who runs the step when a framework is named under a stack (:attr:`StackDefaults.engines`): torchtune 0.6
(``recipes/full_finetune_distributed.py``: ``training.shard_model``, FSDP2 ``fully_shard``), torchtitan
(``parallelize_llama.py``: FSDP2 / TP / PP / CP of its own), litgpt (``litgpt/finetune/full.py`` at commit
0077627d: ``FSDPStrategy(...)`` when ``devices * num_nodes > 1``, else ``"auto"``; no strategy argument) and
PyTorch FSDP2 (and a plain PyTorch loop: under DeepSpeed it is the DeepSpeed stack) run neither DeepSpeed
nor Megatron-LM; DeepSpeed and Megatron-LM / NeMo run their own engine only. The HF Trainer, trl, axolotl and
unsloth run DeepSpeed (``deepspeed=``) but not Megatron-LM; accelerate runs both (``DeepSpeedPlugin``, ``MegatronLMPlugin``);
LLaMA-Factory is left open (its ``USE_MCA`` path trains through Megatron-core).

Who shards a ZeRO stage named under a stack (:attr:`StackDefaults.zero`): the stacks built on
``transformers.TrainingArguments`` (HF Trainer, trl, axolotl, LLaMA-Factory, unsloth) run it through
DeepSpeed, their ``deepspeed=ds.json`` argument (``deepspeed: ds_z3_config.json`` in axolotl and
LLaMA-Factory recipes); the Trainer's ``bf16=True`` fills DeepSpeed's ``bf16.enabled: "auto"``
(transformers 4.57 ``integrations/deepspeed.py`` ``HfTrainerDeepSpeedConfig.trainer_config_process``:
``fill_match("bf16.enabled", args.bf16 ...)``), so DeepSpeed's bf16 recipe runs (bf16 parameters, fp32
master and states in its optimizer), not autocast over fp32 parameters. Their FSDP is the ``fsdp``
argument (accelerate FSDP): the ``fsdp`` setting; ``TrainingArguments`` then sets ``ACCELERATE_USE_FSDP``
and the Trainer's bf16 as accelerate's mixed precision, which accelerate's ``AcceleratorState.__init__``
(``src/accelerate/state.py``: ``if self._mixed_precision != "no": fsdp_plugin.set_mixed_precision(...)``)
turns into FSDP's ``MixedPrecision(param_dtype=bf16)`` over the fp32 sharded parameters: accelerate's
recipe, not autocast over whole fp32 parameters (QLoRA keeps the stack's: PEFT sets FSDP's mixed precision
to ``bnb_4bit_quant_storage`` there, ``utils/other.py``). The FSDP stacks (accelerate, torchtune, torchtitan,
litgpt, FSDP2) shard a ZeRO stage with FSDP (stage 2 SHARD_GRAD_OP, 3 FULL_SHARD).

The losses a stack can switch to by a setting of its own (:attr:`StackDefaults.losses`): the HF Trainer
and trl ``TrainingArguments.use_liger_kernel`` (transformers 4.57 ``training_args.py``; the Trainer applies
Liger's kernels, fused linear cross-entropy among them, to the model); axolotl's Liger plugin
(``plugins: [axolotl.integrations.liger.LigerPlugin]``, ``liger_fused_linear_cross_entropy: true``);
LLaMA-Factory ``enable_liger_kernel: true`` (``hparams/model_args.py``); torchtune's
``loss: torchtune.modules.loss.CEWithChunkedOutputLoss`` (its recipes' default); unsloth's own fused
cross-entropy (its default). The other stacks name no such switch: the loss is the user's code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memest.workload import config
from memest.workload.config import (
    AttnImplementation,
    Framework,
    KbitPrep,
    LoraLibrary,
    Loss,
    Method,
    Offload,
    Optimizer,
    Precision,
    Recompute,
    Stack,
    TrainingConfig,
)


@dataclass(frozen=True, slots=True)
class StackDefaults:
    """What one stack does when the user does not say otherwise.

    Attributes:
        label: Its name and the version read (``HF Trainer 4.57``).
        bf16: How its users ask for bf16 (``bf16=True``).
        precision: The recipe that runs.
        recipe: That recipe in words (``fp32 params, autocast bf16``).
        optimizer: Its default optimizer, as memest's value.
        optimizer_name: The stack's own name for it (``adamw_torch_fused``).
        one: Who runs the step on one device.
        many: Who runs it on several data-parallel devices, and the ZeRO stage it shards with.
        recompute: Its activation checkpointing default.
        loss: Its loss.
        attn: Its attention kernel.
        kbit: How it prepares a QLoRA model.
        lora_targets: The layers its LoRA adapts (memest's ``lora_targets`` value).
        lora_library: Who builds its adapters and QLoRA base (:class:`~memest.workload.config.LoraLibrary`).
        qlora_precision: The recipe its QLoRA runs when it differs from ``precision`` (None: the same).
        qlora_recipe: How its users ask for that recipe, and what it runs, in words.
        qlora_optimizer: The optimizer its QLoRA swaps in (None: ``optimizer``).
        lora_loss: The loss its LoRA and QLoRA scripts run when it differs from ``loss`` (None: the same).
        model_parallel: It runs tensor / pipeline parallelism (Megatron-LM, NeMo, torchtitan).
        losses: The losses it switches on by a setting of its own, each with that setting in the
            stack's words (module docstring).
        activation_offloading: Its switch for activation checkpoints in host RAM, at its default (None: it has
            none); ``offload_in_flight``: the checkpoints its offloading keeps on the device.
        optimizer_in_bwd: Its switch for the optimizer step inside backward, at its default (None: it has none).
        methods: The methods it runs (module docstring).
        zero: Who shards a ZeRO stage named under it without FSDP's own setting: DeepSpeed (the
            ``deepspeed=`` argument of the Trainer-based stacks) or FSDP (module docstring).
        engines: The frameworks it runs a step under when one is named (module docstring, "Who runs the
            step"); a framework outside it is refused, and the planner never proposes one.
        fp16: How its users ask for its fp16 recipe and what that runs ("" when it has none), the recipe a
            device without bf16 gets when the stack chose bf16 (:func:`fp16_fallback`).
        many_fixed: The settings it hard-codes on several devices, by setting name (litgpt's
            :data:`LITGPT_FSDP`): :func:`apply` fills them there, and a ``recompute`` or ``zero_stage`` given
            otherwise is refused (:mod:`memest.workload.validate`).
        many_methods: The methods it runs on several devices (None: all of ``methods``).
        one_unsharded: On one device it runs no sharding backend (litgpt's strategy ``"auto"``): a ZeRO stage
            there is refused.
    """

    label: str
    bf16: str
    precision: Precision
    recipe: str
    optimizer: Optimizer
    optimizer_name: str
    one: Framework = Framework.PYTORCH
    many: tuple[Framework, int] = (Framework.DDP, 0)
    recompute: Recompute = Recompute.NONE
    loss: Loss = Loss.DEFAULT
    attn: AttnImplementation = AttnImplementation.SDPA
    kbit: KbitPrep = KbitPrep.PEFT
    lora_targets: str = "attention"
    lora_library: LoraLibrary = LoraLibrary.PEFT
    qlora_precision: Precision | None = None
    qlora_recipe: str = ""
    qlora_optimizer: Optimizer | None = None
    lora_loss: Loss | None = None
    model_parallel: bool = False
    losses: tuple[tuple[Loss, str], ...] = ()
    activation_offloading: bool | None = None
    offload_in_flight: int = 0
    optimizer_in_bwd: bool | None = None
    methods: frozenset[Method] = frozenset(Method)
    zero: Framework = Framework.FSDP
    engines: frozenset[Framework] = frozenset(Framework)
    fp16: str = ""
    many_fixed: tuple[tuple[str, Any], ...] = ()
    many_methods: frozenset[Method] | None = None
    one_unsharded: bool = False


_NO_ENGINE = frozenset(Framework) - {Framework.DEEPSPEED, Framework.MEGATRON}
"""The frameworks of the stacks that run neither DeepSpeed nor Megatron-LM (torchtune, torchtitan, litgpt, FSDP2):
their own loop on one device, FSDP on several (module docstring, "Who runs the step")."""
_NO_MEGATRON = frozenset(Framework) - {Framework.MEGATRON}
"""The Trainer-based stacks but LLaMA-Factory: DeepSpeed through ``deepspeed=``, FSDP through ``fsdp=``; no
Megatron-LM (``TrainingArguments`` has no Megatron argument)."""

_LIGER = ((Loss.FUSED, "use_liger_kernel=True"),)

TORCHTUNE_FWD_STASH = 5
"""torchtune 0.6 ``OffloadActivations(max_fwd_stash_size=5)`` (``torchtune/training/_activation_offloading.py``,
the default ``get_act_offloading_ctx_manager`` uses): the forward keeps each offloaded tensor alive on the
device until five later saved tensors have been packed (its copy to host may still run), and the backward
brings one back per autograd node; an upper bound on the checkpoints on the device at once."""

TORCHTUNE_FINAL_NORM_IDS = {True: 6, False: 4}
"""Saved-tensor ids torchtune's final norm takes up to its last offloaded tensor, by whether its scale trains
(full fine-tuning; LoRA freezes it). torchtune 1814feb17 ``torchtune/modules/rms_norm.py`` ``RMSNorm.forward``
(eager: ``compile_model`` compiles the layers one by one) saves ``x.float()`` for ``pow``, ``rsqrt``'s output,
both again for their ``mul``, then ``self.scale`` for ``x_normed * self.scale`` (a Parameter: an id, not
offloaded) and, when the scale trains, ``x_normed`` (offloaded). ``OffloadActivations.pack_tensor``
(``torchtune/training/_activation_offloading.py``) gives every saved tensor an id and, packing one of at
least 1024 B that is no Parameter, drops the stash entries of ids at or below ``id - max_fwd_stash_size``.
The output projection runs under ``NoOpManager`` (``get_act_offloading_ctx_manager``) and the loss outside
the context, so nothing is packed after the norm: at the loss the stash holds the last
:data:`TORCHTUNE_FWD_STASH` ids, the norm's and the layer inputs before them (one id each under
non-reentrant checkpointing: ``_NoopSaveInputs`` saves the positional inputs; the kwargs mask and
input_pos are not saved). Counted on the CPU with torch 2.13 (``tests/test_activation_offload_loss.py``)."""


def offloaded_checkpoints_at_loss(t: TrainingConfig) -> int:
    """How many layers' checkpoints a job's activation offloading still holds on the device through its loss
    (forward and backward, before the first layer's backward unpacks and clears the stash): torchtune's
    :data:`TORCHTUNE_FWD_STASH` less its final norm's ids (:data:`TORCHTUNE_FINAL_NORM_IDS`), 1 under LoRA
    and QLoRA, 0 under full fine-tuning; another stack's, :func:`offloaded_checkpoints_on_device` (trl's port
    runs transformers' reentrant checkpointing, whose saved inputs are not counted here)."""
    n = offloaded_checkpoints_on_device(t)
    if n and t.stack in (None, Stack.TORCHTUNE):
        return max(0, n - TORCHTUNE_FINAL_NORM_IDS[t.method is Method.FULL])
    return n


UNSLOTH_IN_FLIGHT = 1
"""unsloth ``Unsloth_Offloaded_Gradient_Checkpointer`` (``unsloth_zoo/gradient_checkpointing.py``): the forward
copies each layer's input to host (``hidden_states.to("cpu", non_blocking=True)``) and keeps none; the backward
brings back the one layer's input it recomputes."""

LITGPT_FSDP = (("recompute", Recompute.FULL), ("zero_stage", 3), ("fsdp_flat_params", True),
               ("no_sync_accumulation", True), ("offload", Offload.NONE))
"""What litgpt runs on several devices: ``litgpt/finetune/full.py`` and ``lora.py`` at commit 0077627d (and
``full.py`` at 26857050, v0.5.13) hard-code, when ``devices * num_nodes > 1``, ``FSDPStrategy(auto_wrap_policy={Block},
activation_checkpointing_policy={Block}, state_dict_type="full", limit_all_gathers=True, cpu_offload=False)``
(else ``strategy = "auto"``) and take no strategy argument: Fabric's FSDP1 FULL_SHARD over Block units, every
Block checkpointed, accumulation inside ``fabric.no_backward_sync``. ``lora.py`` there raises
``NotImplementedError("Quantization is currently not supported for multi-GPU training ...")`` for ``--quantize``
on several devices (:attr:`StackDefaults.many_methods`). (``lora.py`` at 26857050 has moved to
``ModelParallelStrategy`` with FSDP2 ``fully_shard`` and Block ``checkpoint_wrapper``; memest models the cited
commit.)"""

_TRAINER = {"bf16": "bf16=True", "precision": Precision.AMP, "recipe": "fp32 params, autocast bf16",
            "optimizer": Optimizer.ADAMW_FUSED, "optimizer_name": "adamw_torch_fused", "losses": _LIGER,
            "zero": Framework.DEEPSPEED, "engines": _NO_MEGATRON,
            "fp16": "fp16=True: fp32 params, autocast fp16, GradScaler"}
_NO_4BIT = frozenset({Method.FULL, Method.LORA})
"""torchtitan and NeMo 2: LoRA in-tree, no 4-bit base (module docstring)."""

STACKS: dict[Stack, StackDefaults] = {
    Stack.HF_TRAINER: StackDefaults(label="HF Trainer 4.57", **_TRAINER),
    Stack.TRL: StackDefaults(label="trl SFTTrainer 0.25", kbit=KbitPrep.TRL, activation_offloading=False,
                             offload_in_flight=TORCHTUNE_FWD_STASH, recompute=Recompute.FULL, **_TRAINER),
    Stack.ACCELERATE: StackDefaults(label="accelerate FSDP", bf16="mixed_precision: bf16", precision=Precision.FSDP2,
                                    recipe="fp32 sharded params, bf16 compute copies", optimizer=Optimizer.ADAMW,
                                    optimizer_name="torch AdamW", one=Framework.FSDP, many=(Framework.FSDP, 3),
                                    fp16="mixed_precision: fp16: fp32 sharded params, fp16 compute copies"),
    Stack.TORCHTUNE: StackDefaults(label="torchtune 0.6", bf16="dtype: bf16", precision=Precision.BF16,
                                   recipe="pure bf16 params and states", optimizer=Optimizer.ADAMW_FUSED,
                                   optimizer_name="AdamW(fused=True)", many=(Framework.FSDP, 3),
                                   recompute=Recompute.FULL, loss=Loss.CHUNKED, kbit=KbitPrep.NONE,
                                   losses=((Loss.CHUNKED, "loss: torchtune.modules.loss.CEWithChunkedOutputLoss"),),
                                   activation_offloading=False, offload_in_flight=TORCHTUNE_FWD_STASH,
                                   optimizer_in_bwd=False, lora_library=LoraLibrary.TORCHTUNE,
                                   engines=_NO_ENGINE),
    Stack.TORCHTITAN: StackDefaults(label="torchtitan", bf16='mixed_precision_param = "bfloat16"',
                                    precision=Precision.FSDP2, recipe="FSDP2 fp32 sharded params, bf16 compute, "
                                                                      "fp32 reduce",
                                    optimizer=Optimizer.ADAMW_FUSED, optimizer_name="AdamW fused",
                                    one=Framework.FSDP, many=(Framework.FSDP, 3), recompute=Recompute.SELECTIVE_OP,
                                    kbit=KbitPrep.NONE, model_parallel=True, methods=_NO_4BIT,
                                    engines=_NO_ENGINE),
    Stack.AXOLOTL: StackDefaults(label="axolotl", bf16="bf16: auto", precision=Precision.BF16,
                                 recipe="bf16 params trained in place", optimizer=Optimizer.ADAMW_FUSED,
                                 optimizer_name="adamw_torch_fused", kbit=KbitPrep.NONE, zero=Framework.DEEPSPEED,
                                 engines=_NO_MEGATRON,
                                 losses=((Loss.FUSED, ("plugins: [axolotl.integrations.liger.LigerPlugin], "
                                                       "liger_fused_linear_cross_entropy: true")),)),
    Stack.LLAMAFACTORY: StackDefaults(label="LLaMA-Factory", bf16="bf16: true", precision=Precision.AMP,
                                      recipe="fp32 trained params, autocast bf16", optimizer=Optimizer.ADAMW_FUSED,
                                      optimizer_name="adamw_torch_fused", recompute=Recompute.FULL,
                                      kbit=KbitPrep.NONE, lora_targets="all-linear", zero=Framework.DEEPSPEED,
                                      losses=((Loss.FUSED, "enable_liger_kernel: true"),),
                                      fp16="fp16: true: fp32 trained params, autocast fp16"),
    Stack.UNSLOTH: StackDefaults(label="unsloth", bf16="bf16=True", precision=Precision.AMP,
                                 recipe="fp32 params, autocast bf16", optimizer=Optimizer.ADAMW_FUSED,
                                 optimizer_name="adamw_torch_fused", recompute=Recompute.FULL, loss=Loss.FUSED,
                                 kbit=KbitPrep.NONE, lora_targets="all-linear",
                                 losses=((Loss.FUSED, "its fused cross-entropy (the default)"),),
                                 activation_offloading=True, offload_in_flight=UNSLOTH_IN_FLIGHT,
                                 lora_library=LoraLibrary.UNSLOTH, zero=Framework.DEEPSPEED,
                                 engines=_NO_MEGATRON, fp16="fp16=True: fp32 params, autocast fp16, GradScaler"),
    Stack.LITGPT: StackDefaults(label="litgpt", bf16='precision="bf16-mixed"', precision=Precision.AMP,
                                recipe="fp32 params, autocast bf16", optimizer=Optimizer.ADAMW,
                                optimizer_name="torch AdamW", many=(Framework.FSDP, 3), kbit=KbitPrep.NONE,
                                lora_library=LoraLibrary.LITGPT, qlora_precision=Precision.BF16,
                                qlora_optimizer=Optimizer.PAGED_ADAMW32BIT, lora_loss=Loss.LITGPT_CHUNKED,
                                qlora_recipe='precision="bf16-true" (quantize bnb.nf4): bf16 params and states',
                                engines=_NO_ENGINE, many_fixed=LITGPT_FSDP,
                                many_methods=frozenset({Method.FULL, Method.LORA}), one_unsharded=True,
                                fp16='precision="16-mixed": fp32 params, autocast fp16, GradScaler'),
    Stack.DEEPSPEED: StackDefaults(label="DeepSpeed", bf16="bf16.enabled", precision=Precision.MIXED,
                                   recipe="bf16 params and grads, fp32 master and states", optimizer=Optimizer.ADAMW,
                                   optimizer_name="FusedAdam", one=Framework.DEEPSPEED, many=(Framework.DEEPSPEED, 0),
                                   zero=Framework.DEEPSPEED, engines=frozenset({Framework.DEEPSPEED}),
                                   fp16="fp16.enabled: fp16 params and grads, fp32 master and states, loss scaling"),
    Stack.MEGATRON: StackDefaults(label="Megatron-LM", bf16="--bf16", precision=Precision.MIXED,
                                  recipe="bf16 params, fp32 main_grad and master", optimizer=Optimizer.ADAMW,
                                  optimizer_name="fused Adam", one=Framework.MEGATRON, many=(Framework.MEGATRON, 0),
                                  model_parallel=True, methods=frozenset({Method.FULL}),
                                  engines=frozenset({Framework.MEGATRON}),
                                  fp16="--fp16: fp16 params, fp32 main_grad and master, loss scaling"),
    Stack.NEMO: StackDefaults(label="NeMo 2", bf16='"bf16-mixed"', precision=Precision.MIXED,
                              recipe="bf16 params, fp32 main_grad, distributed optimizer", optimizer=Optimizer.ADAMW,
                              optimizer_name="fused Adam", one=Framework.MEGATRON, many=(Framework.MEGATRON, 1),
                              model_parallel=True, methods=_NO_4BIT, lora_library=LoraLibrary.MEGATRON,
                              engines=frozenset({Framework.MEGATRON}),
                              fp16='"16-mixed": fp16 params, fp32 main_grad, distributed optimizer'),
    Stack.FSDP: StackDefaults(label="PyTorch FSDP2", bf16="MixedPrecisionPolicy(param_dtype=bf16)",
                              precision=Precision.FSDP2, recipe="fp32 sharded params, bf16 compute, fp32 reduce",
                              optimizer=Optimizer.ADAMW, optimizer_name="torch AdamW", one=Framework.FSDP,
                              many=(Framework.FSDP, 3), kbit=KbitPrep.NONE, engines=_NO_ENGINE,
                              fp16="MixedPrecisionPolicy(param_dtype=fp16): fp32 sharded params, fp16 compute"),
    Stack.PYTORCH: StackDefaults(label="PyTorch", bf16="torch.autocast(bf16)", precision=Precision.AMP,
                                 recipe="fp32 params, autocast bf16", optimizer=Optimizer.ADAMW,
                                 optimizer_name="torch AdamW", kbit=KbitPrep.NONE, engines=_NO_ENGINE,
                                 fp16="torch.autocast(fp16) + GradScaler: fp32 params, autocast fp16"),
}
"""Every stack's defaults (sources in the module docstring)."""

_FRAMEWORK_STACK = {Framework.PYTORCH: Stack.PYTORCH, Framework.DDP: Stack.PYTORCH,
                    Framework.DEEPSPEED: Stack.DEEPSPEED, Framework.MEGATRON: Stack.MEGATRON,
                    Framework.FSDP: Stack.FSDP}
"""The stack a framework named without a stack stands for."""


def stack_of(v: Mapping[str, Any], dp: int) -> tuple[Stack, str]:
    """The stack of a job, and why it was assumed ("" when the job names it).

    No stack named: a named framework is its own stack; ``tp`` / ``pp`` is Megatron-LM, ``fsdp``
    accelerate, a ZeRO stage DeepSpeed, anything else the HF Trainer.
    """
    if v["stack"] is not None:
        return Stack(v["stack"]), ""
    framework = Framework(v["framework"])
    if framework is not Framework.AUTO:
        return _FRAMEWORK_STACK[framework], f"framework {framework.value}"
    if (v["tp"] or 1) > 1 or v["pp"] > 1:
        return Stack.MEGATRON, "tensor / pipeline parallelism"
    if v["fsdp"] is not None:
        return Stack.ACCELERATE, "FSDP sharding"
    if v["zero_stage"]:
        return Stack.DEEPSPEED, "a ZeRO stage"
    return Stack.HF_TRAINER, "no stack named"


FILLED = ("precision", "optimizer", "recompute", "loss", "attn_implementation", "lora_targets",
          "prepare_kbit_training", "lora_library", "activation_offloading", "optimizer_in_bwd")
"""The settings a stack's defaults fill when not given (:func:`apply`): a job records which it filled
(:attr:`~memest.workload.config.TrainingConfig.stack_filled`), so that a setup on another stack or layout
takes that stack's defaults for them (:func:`restack`)."""


def supports(stack: Stack, method: Method) -> bool:
    """Whether ``stack`` runs ``method`` (:attr:`StackDefaults.methods`, sources in the module docstring)."""
    return method in STACKS[stack].methods


_FP16_OF = {Precision.AMP: Precision.AMP, Precision.FSDP2: Precision.FSDP2, Precision.MIXED: Precision.FP16}
"""The fp16 recipe of the same bytes as each bf16 one (:attr:`memest.workload.config.TrainingConfig.half_dtype`):
autocast and FSDP's compute copies in fp16, DeepSpeed's / Megatron-LM's fp16 parameters over an fp32 master. Pure
bf16 has none (torchtune 0.6's recipes raise "full fp16 training is not supported with this recipe. Please use bf16
or fp32 instead.")."""


def fp16_fallback(t: TrainingConfig) -> Precision | None:
    """The recipe a job's stack runs in fp16 in place of its bf16 one, at ``half_dtype`` fp16
    (:data:`_FP16_OF`), or None: no stack, a stack without an fp16 recipe (:attr:`StackDefaults.fp16`), or pure
    bf16."""
    if t.stack is None or not STACKS[t.stack].fp16:
        return None
    return _FP16_OF.get(t.precision)


def _fp16_switch(d: StackDefaults) -> str:
    """How a stack's users ask for its fp16 recipe (``fp16=True``): :attr:`StackDefaults.fp16` before its recipe."""
    return d.fp16.rsplit(": ", 1)[0]


def fp16_words(t: TrainingConfig) -> str:
    """What a job's stack runs in fp16 in place of its bf16 recipe, in its words (no setting named: the planner
    prints it as it is)."""
    d = STACKS[t.stack] if t.stack is not None else None
    if d is None or fp16_fallback(t) is None:
        return f"{d.label if d is not None else 'the job'} has no fp16 recipe of these bytes"
    return f"{d.label}'s fp16 is {d.fp16}"


def on_device(t: TrainingConfig, arch: str, vendor: str, device_name: str) -> TrainingConfig:
    """``t`` as it runs on a device without bf16 (:func:`memest.workload.config.lacks_bf16`) when its stack chose
    its bf16 recipe (``precision`` in :attr:`~memest.workload.config.TrainingConfig.stack_filled`): the stack's
    fp16 recipe of the same bytes (:func:`fp16_fallback`), said in a note. ``t`` itself otherwise (a recipe the
    user gave is refused there: :func:`memest.workload.config.training_refusal`)."""
    if "precision" not in t.stack_filled or not config.lacks_bf16(arch, vendor) or not config.computes_bf16(t):
        return t
    fallback = fp16_fallback(t)
    if fallback is None:
        return t
    out = t.replace(precision=fallback, half_dtype="fp16")
    stack = t.stack
    assert stack is not None  # fp16_fallback is None without a stack
    words = recipe_words(stack, fallback, t.optimizer, resolve_framework(out), out.parallelism.zero_stage,
                         "fp16").split(", ", 1)[1]
    note = (f"{device_name} ({arch}) has no bf16 (compute capability below 8.0): assumed the stack's fp16 recipe, "
            f"{words.rsplit(', ', 1)[0]} (the bytes of its bf16 one)")
    return out.replace(config_notes=(*t.config_notes, note))


def runs_engine(stack: Stack, framework: Framework) -> bool:
    """Whether ``stack`` runs a step under ``framework`` named with it (:attr:`StackDefaults.engines`; ``auto``
    always: the stack picks)."""
    return framework is Framework.AUTO or framework in STACKS[stack].engines


def stacks_running(framework: Framework) -> tuple[Stack, ...]:
    """The stacks that run a step under ``framework``, in table order."""
    return tuple(k for k in STACKS if runs_engine(k, framework))


def stacks_supporting(method: Method) -> tuple[Stack, ...]:
    """The stacks that run ``method``, in table order."""
    return tuple(k for k in STACKS if supports(k, method))


def runs_deepspeed(stack: Stack, framework: Framework, zero_stage: int, fsdp: bool, model_parallel: bool,
                   precision: Precision | None = None) -> bool:
    """Whether a job of ``stack`` runs under DeepSpeed: the framework named, else a ZeRO stage without FSDP's
    own setting (``fsdp``) under a stack that shards ZeRO with DeepSpeed (:attr:`StackDefaults.zero`), with
    no tensor / pipeline parallelism and not FSDP's own precision recipe."""
    d = STACKS[stack]
    if framework is not Framework.AUTO:
        return framework is Framework.DEEPSPEED
    if d.one is Framework.DEEPSPEED:
        return True
    return (d.zero is Framework.DEEPSPEED and zero_stage >= 1 and not fsdp and not model_parallel
            and precision is not Precision.FSDP2)


def apply(v: Mapping[str, Any], stack: Stack, dp: int) -> dict[str, Any]:
    """The settings not given (None) filled from ``stack``'s defaults; what was given stays.

    A stack whose QLoRA runs another recipe or optimizer (litgpt: bf16-true, ``instantiate_bnb_optimizer``'s
    bitsandbytes PagedAdamW in ``litgpt/utils.py`` at commit 00af8b0) gets them under QLoRA; one whose LoRA
    scripts run their own loss (litgpt ``finetune/lora.py``: :attr:`Loss.LITGPT_CHUNKED`) gets it under LoRA and QLoRA. A stack that shards
    over several devices by default (torchtune, NeMo's distributed optimizer) gets
    its ZeRO stage when neither it nor FSDP was given, without tensor / pipeline parallelism; torchtitan with
    them too (its FSDP over the data-parallel ranks beside TP / PP). A Trainer-based stack under DeepSpeed
    (:func:`runs_deepspeed`) runs DeepSpeed's bf16 recipe (module docstring). trl prepares no sharded QLoRA model
    (FSDP, ZeRO-3). A stack that hard-codes settings on several devices (:attr:`StackDefaults.many_fixed`:
    litgpt's Block checkpointing and Fabric FSDP1) gets them there.
    """
    d = STACKS[stack]
    out = dict(v)
    model_parallel = (v["tp"] or 1) > 1 or v["pp"] > 1
    # torchtitan shards over the data-parallel ranks with TP / PP too (models/llama3/parallelize_llama.py:
    # apply_fsdp when dp_shard is enabled; data_parallel_shard_degree = -1 takes every rank tp x pp x cp leave)
    fsdp_beside_model_parallel = d.model_parallel and d.many[0] is Framework.FSDP
    if (Framework(v["framework"]) is Framework.AUTO and v["fsdp"] is None and not v["zero_stage"]
            and dp * v["cp"] > 1 and (not model_parallel or fsdp_beside_model_parallel)):
        out["zero_stage"] = d.many[1]
    if dp * v["cp"] * (v["tp"] or 1) * v["pp"] > 1:
        # what the stack hard-codes on several devices (litgpt's FSDPStrategy); a falsy value (None, 0, False)
        # is taken as not given, as the ZeRO stage above (a given one otherwise is refused by validate)
        out |= {name: value for name, value in d.many_fixed if not v.get(name)}
    if out["precision"] is None and d.qlora_precision is not None and v["finetune"] == Method.QLORA.value:
        out["precision"] = d.qlora_precision
    if out["optimizer"] is None and d.qlora_optimizer is not None and v["finetune"] == Method.QLORA.value:
        out["optimizer"] = d.qlora_optimizer
    if out["loss"] is None and d.lora_loss is not None and v["finetune"] in (Method.LORA.value, Method.QLORA.value):
        out["loss"] = d.lora_loss
    fsdp = v["fsdp"] is not None or Framework(v["framework"]) is Framework.FSDP  # FSDP, however it was asked
    if out["precision"] is None and runs_deepspeed(stack, Framework(v["framework"]), out["zero_stage"] or 0,
                                                   v["fsdp"] is not None, model_parallel):
        out["precision"] = STACKS[Stack.DEEPSPEED].precision
    if (out["precision"] is None and d.zero is Framework.DEEPSPEED and d.one is not Framework.DEEPSPEED and fsdp
            and not model_parallel and v["finetune"] != Method.QLORA.value):
        out["precision"] = STACKS[Stack.ACCELERATE].precision  # the Trainer's fsdp= is accelerate FSDP (docstring)
    if (v["precision"] is not None and Precision(v["precision"]) is Precision.FP16 and d.fp16 and not v["finetune"]
            and not runs_deepspeed(stack, Framework(v["framework"]), out["zero_stage"] or 0, v["fsdp"] is not None,
                                   model_parallel)):
        # precision fp16 is the stack's fp16 switch: without DeepSpeed the Trainer's fp16=True (and Lightning's
        # "16-mixed", accelerate's mixed_precision fp16) is its bf16 recipe in fp16, not DeepSpeed's fp16 params
        natural = apply({**v, "precision": None}, stack, dp)["precision"]
        if natural in (Precision.AMP, Precision.FSDP2):
            out["precision"], out["half_dtype"] = natural, "fp16"
    fill = {"precision": d.precision, "optimizer": d.optimizer,
            "recompute": d.recompute, "loss": d.loss, "attn_implementation": d.attn, "lora_targets": d.lora_targets,
            "prepare_kbit_training": d.kbit, "lora_library": d.lora_library}
    out |= {name: value for name, value in fill.items() if out[name] is None}
    if out["activation_offloading"] is None:  # a stack offloads checkpoints only when it checkpoints
        out["activation_offloading"] = bool(d.activation_offloading) and Recompute(out["recompute"]) is Recompute.FULL
    if out["optimizer_in_bwd"] is None:
        out["optimizer_in_bwd"] = bool(d.optimizer_in_bwd)
    if (v["prepare_kbit_training"] is None and d.kbit is KbitPrep.TRL
            and (fsdp or (out["zero_stage"] or 0) >= 3)):
        # trl SFTTrainer._prepare_peft_model: a sharded QLoRA (FSDP / DeepSpeed ZeRO-3 load the Params4bit on
        # cpu / meta: is_sharded_qlora) gets neither prepare_model_for_kbit_training nor the bf16 casts
        out["prepare_kbit_training"] = KbitPrep.NONE
    return out


def restack(t: TrainingConfig, stack: Stack | None = None, refill: frozenset[str] | None = None) -> TrainingConfig:
    """``t`` with the settings its stack filled (:attr:`~memest.workload.config.TrainingConfig.stack_filled`)
    taken again from ``stack``'s defaults (None: its own) at ``t``'s method and layout: what a ``memest hf``
    command naming that stack and layout resolves to (:func:`apply`). Settings the user gave stay.

    Args:
        refill: The filled settings to take again (None: all of them); the others keep ``t``'s value
            (a planner's change of one).
    """
    stack = stack if stack is not None else t.stack
    if stack is None:
        return t
    names = [n for n in t.stack_filled if refill is None or n in refill]
    if not names and stack is t.stack and not STACKS[stack].many_fixed:
        return t
    par = t.parallelism
    current = {"precision": t.precision, "optimizer": t.optimizer, "recompute": t.recompute, "loss": t.loss,
               "attn_implementation": t.attn_implementation, "lora_targets": t.lora.targets,
               "prepare_kbit_training": t.prepare_kbit_training, "lora_library": t.lora_library,
               "activation_offloading": t.activation_offloading, "optimizer_in_bwd": t.optimizer_in_bwd,
               "fsdp_flat_params": t.fsdp_flat_params, "no_sync_accumulation": t.no_sync_accumulation}
    fsdp = t.framework is Framework.FSDP
    v = {n: None if n in names else value for n, value in current.items()} | {
        "finetune": None if t.method is Method.FULL else t.method.value, "tp": par.tp, "pp": par.pp, "cp": par.cp,
        "framework": Framework.AUTO.value if fsdp else t.framework.value, "fsdp": "sharded" if fsdp else None,
        "zero_stage": par.zero_stage}
    out = apply(v, stack, par.dp)
    changes = {n: out[n] for n in current if n != "lora_targets" and out[n] != current[n]}
    if out["lora_targets"] != t.lora.targets:
        changes["lora"] = dataclasses.replace(t.lora, targets=out["lora_targets"])
    if stack is not t.stack:
        changes["stack"] = stack
    return t.replace(**changes) if changes else t


def resolve_framework(t: TrainingConfig) -> Framework:
    """Who runs a job's step: the framework it names, else its stack's (a ZeRO stage under a stack that
    is not DeepSpeed or Megatron-LM: the backend that stack shards ZeRO with, :attr:`StackDefaults.zero`:
    DeepSpeed for the Trainer-based stacks, FSDP for the FSDP ones; any stack with tp / pp: what
    :func:`memest.workload.config.resolve_framework` picks, Megatron-LM or FSDP + TP), else the
    choice from precision and parallelism (a workload built with no stack)."""
    if t.framework is not Framework.AUTO or t.stack is None:
        return config.resolve_framework(t)
    d, par = STACKS[t.stack], t.parallelism
    if d.one in (Framework.DEEPSPEED, Framework.MEGATRON):
        return d.one
    if par.tp > 1 or par.pp > 1:
        return config.resolve_framework(t)
    if par.zero_stage >= 1:
        if runs_deepspeed(t.stack, t.framework, par.zero_stage, False, False, t.precision):
            return Framework.DEEPSPEED
        return Framework.FSDP
    return d.many[0] if par.dp * par.cp > 1 else d.one


_FSDP_STRATEGY = {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}
_BACKEND_WORDS = {Framework.DEEPSPEED: ("DeepSpeed ZeRO-{z}", " (deepspeed=ds.json)"),
                  Framework.FSDP: ("FSDP {s}", " (fsdp={a})")}
"""How a job line names the backend that shards a stack's job, and (for the Trainer-based stacks, whose
:attr:`StackDefaults.zero` is DeepSpeed) the argument that asks for it."""


def sharding_words(t: TrainingConfig) -> str:
    """How the job's stack asks for its ZeRO stage, in the stack's words ("" without one): the Trainer-based
    stacks' ``deepspeed=ds.json`` with ``zero_optimization.stage N``, DeepSpeed's own config key, FSDP's
    sharding strategy, Megatron-LM's distributed optimizer."""
    z = t.parallelism.zero_stage
    if t.stack is None or z < 1:
        return ""
    d, fw = STACKS[t.stack], resolve_framework(t)
    if fw is Framework.DEEPSPEED:
        return ("deepspeed=ds.json with " if d.one is not Framework.DEEPSPEED else "") + f"zero_optimization.stage {z}"
    if fw is Framework.FSDP:
        return f"FSDP {_FSDP_STRATEGY.get(z, str(z))}"
    if fw is Framework.MEGATRON:
        return "--use-distributed-optimizer"
    return ""


def recipe_words(stack: Stack, precision: Precision, optimizer: Optimizer, framework: Framework | None = None,
                 zero_stage: int = 0, half_dtype: str = "bf16") -> str:
    """The job line's sentence for a stack: its name (and the backend that shards it, when the stack runs
    under another: ``HF Trainer 4.57 + DeepSpeed ZeRO-3 (deepspeed=ds.json)``), how its users ask for bf16 and
    what that runs, and its optimizer (the stack's own words where the user kept its defaults).

    Args:
        framework: Who runs the step (:func:`resolve_framework`); None: the stack's own.
        zero_stage: The job's ZeRO stage, named with DeepSpeed.
        half_dtype: The job's :attr:`~memest.workload.config.TrainingConfig.half_dtype`: at fp16, the stack's
            fp16 recipe in its words (:attr:`StackDefaults.fp16`).
    """
    d = STACKS[stack]
    opt = d.optimizer_name if optimizer is d.optimizer else optimizer.value
    label = d.label
    backend = (framework is not None and framework in _BACKEND_WORDS and framework not in (d.one, d.many[0])
               and zero_stage >= 1)
    if backend:
        words, argument = _BACKEND_WORDS[framework]  # type: ignore[index]
        label = label.removesuffix(" FSDP")  # accelerate under DeepSpeed: "accelerate + DeepSpeed ZeRO-3"
        strategy = _FSDP_STRATEGY.get(zero_stage, str(zero_stage))
        label += " + " + words.format(z=zero_stage, s=strategy)
        if d.zero is Framework.DEEPSPEED:
            label += argument.format(a=strategy.lower())
    if precision is d.qlora_precision and precision is not d.precision:
        return f"{label}, {d.qlora_recipe}, {opt}"
    fp16 = half_dtype == "fp16" or precision is Precision.FP16
    for fw, other in ((Framework.DEEPSPEED, STACKS[Stack.DEEPSPEED]), (Framework.FSDP, STACKS[Stack.ACCELERATE])):
        if backend and framework is fw and fp16 and d.fp16 and precision is _FP16_OF[other.precision]:
            return f"{label}, {_fp16_switch(d)} sets {other.fp16}, {opt}"
        if backend and framework is fw and precision is other.precision and precision is not d.precision:
            return f"{label}, {d.bf16} sets {other.bf16}: {other.recipe}, {opt}"
    if d.fp16 and fp16 and _FP16_OF.get(d.precision) is precision:
        return f"{label}, {d.fp16}, {opt}"
    if precision is not d.precision:  # not what the stack's bf16 switch runs: that switch is not named
        return f"{label}: precision {precision.value}, {opt}"
    return f"{label}, {d.bf16}: {d.recipe}, {opt}"


def offloaded_checkpoints_on_device(t: TrainingConfig) -> int:
    """How many layers' activation checkpoints a job's activation offloading keeps on the device at once (0: it
    does not offload): its stack's (:data:`TORCHTUNE_FWD_STASH`, :data:`UNSLOTH_IN_FLIGHT`); a workload built
    with no stack gets torchtune's, the larger."""
    if not t.activation_offloading:
        return 0
    if t.stack is not None and STACKS[t.stack].offload_in_flight:
        return STACKS[t.stack].offload_in_flight
    return TORCHTUNE_FWD_STASH
