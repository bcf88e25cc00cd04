"""The LoRA-target rule (:mod:`memest.lora_targets`) and its four readers: the estimator
(``estimate.training.lora_targets_tensor``, its adapters ``lora_adapters`` and its activations'
``LoraActivations.adapts``), the trace (``trace._model.lora_targets``, PEFT
``target_modules``), calibration (``calibration.training.lora_target_modules``) and the workload's
check (``workload._validate_lora_targets``) select the same layer modules for every catalog model and
every ``--lora-targets`` value; and PEFT itself, on tiny meta-device models, adapts what they name.
"""

from __future__ import annotations

import pytest

from memest.calibration.training import lora_target_modules
from memest.errors import InputError
from memest.estimate.sharding import stages
from memest.estimate.training import execution, lora_adapters, lora_targets_tensor
from memest.lora_targets import ALL_LINEAR, ATTENTION, layer_modules, nameable_modules, peft_target_modules
from memest.sources import catalog, load_model
from memest.spec import ModelSpec
from memest.workload import Framework, LoraConfig, Method, TrainingConfig
from memest.workload.validate import _validate_lora_targets

CATALOG = sorted(catalog.entries())


def _layer_linears(spec: ModelSpec) -> list[str]:
    """Layer-relative paths of every 2-D linear weight's module, in model order (the test's own walk)."""
    out: dict[str, None] = {}
    for layer, _ in spec.layer_kinds():
        for t in layer.tensors:
            if t.is_linear_weight and len(t.shape) == 2:
                out[t.module] = None
    return list(out)


def _values(spec: ModelSpec) -> list[str]:
    """``attention``, ``all-linear``, each name the model has, and two names together."""
    names = list(nameable_modules(spec))
    return [ATTENTION, ALL_LINEAR, *names, *([f" {names[0]} , {names[1]} "] if len(names) > 1 else [])]


def _estimator(spec: ModelSpec, targets: str) -> list[str]:
    """The layer linears the estimator adapts; its rule, its adapters' count and its activations agree
    (the count also takes same-named mixer projections, component ``OTHER``, as PEFT does)."""
    rule: dict[str, None] = {}
    for layer, _ in spec.layer_kinds():
        for t in layer.tensors:
            if lora_targets_tensor(t, targets):
                rule[t.module] = None
    in_layers = {id(t) for layer, _ in spec.layer_kinds() for t in layer.tensors if t.is_linear_weight}
    whole = stages(spec.num_layers, 1)[0]
    counted = {tn.module for tn, _, _ in lora_adapters(spec, whole, LoraConfig(rank=8, targets=targets), 1)
               if id(tn) in in_layers}
    lora = execution(spec, TrainingConfig(method=Method.LORA, lora=LoraConfig(targets=targets)), Framework.PYTORCH).lora
    saved = {t.module for layer, _ in spec.layer_kinds() for t in layer.tensors if lora is not None and lora.adapts(t)}
    assert counted == saved == set(rule), targets
    return list(rule)


def _accepted(spec: ModelSpec, targets: str) -> bool:
    try:
        _validate_lora_targets(spec, targets)
    except InputError:
        return False
    return True


def _peft_matches(key: str, target_modules: list[str]) -> bool:
    """PEFT's match of a list of ``target_modules`` against a module's full name
    (``peft/tuners/tuners_utils.py`` ``check_target_module_exists``: the name itself, or a suffix after a dot)."""
    return key in target_modules or any(key.endswith(f".{t}") for t in target_modules)


@pytest.mark.parametrize("model", CATALOG)
def test_the_four_readers_select_the_same_layer_modules(model: str) -> None:
    pytest.importorskip("torch")
    from memest.trace._model import lora_targets as trace_target_modules

    spec = load_model(model)
    linears = _layer_linears(spec)
    for targets in _values(spec):
        chosen = _estimator(spec, targets)
        assert chosen == layer_modules(spec, targets), targets
        if targets == ALL_LINEAR:
            assert chosen == linears  # every linear of the layers
            assert lora_target_modules(spec, targets) == ALL_LINEAR  # calibration lets PEFT expand it
        # every value offered is valid, but attention on a model without attention projections
        assert _accepted(spec, targets) == (targets != ATTENTION or bool(chosen)), targets
        if not chosen:  # a name only outside the layers (a vision tower's, a mixer's): nothing in them
            with pytest.raises(InputError):
                lora_target_modules(spec, targets)
            continue
        if targets != ALL_LINEAR:
            assert lora_target_modules(spec, targets) == sorted(chosen), targets
        names = trace_target_modules(spec, targets)
        if targets not in (ATTENTION, ALL_LINEAR):  # names as given, stripped
            assert names == [x.strip() for x in targets.split(",")], targets
        # PEFT, matching by suffix, adapts exactly the chosen modules (for names: every same-named linear)
        assert [m for m in linears if _peft_matches(f"model.layers.0.{m}", names)] == chosen, targets


@pytest.mark.parametrize("model", CATALOG)
def test_peft_adapts_the_attention_the_trace_names(model: str) -> None:
    pytest.importorskip("torch")
    from memest.trace._model import lora_targets as trace_target_modules

    spec = load_model(model)
    chosen = _estimator(spec, ATTENTION)
    if not chosen:
        pytest.skip(f"{model} has no attention projections")
    names = trace_target_modules(spec, ATTENTION)
    assert [m for m in _layer_linears(spec) if _peft_matches(f"model.layers.0.{m}", names)] == chosen


def test_the_rule_by_hand() -> None:
    # LlamaDecoderLayer: self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj (modeling_llama.py)
    spec = load_model("meta-llama/Llama-3.1-8B")
    attention = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    assert layer_modules(spec, ATTENTION) == attention
    assert layer_modules(spec, ALL_LINEAR) == attention + ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert layer_modules(spec, " v_proj ,q_proj") == ["self_attn.q_proj", "self_attn.v_proj"]  # model order
    # GPT-2's Block: attn.c_attn (fused QKV), attn.c_proj, mlp.c_fc, mlp.c_proj (Conv1D, modeling_gpt2.py)
    gpt2 = load_model("openai-community/gpt2")
    assert layer_modules(gpt2, ATTENTION) == ["attn.c_attn", "attn.c_proj"]
    assert layer_modules(gpt2, "c_proj") == ["attn.c_proj", "mlp.c_proj"]
    # Jamba: the mamba mixers' in_proj / out_proj are nameable, but no layer linear memest adapts
    # attention takes attn.c_proj, not mlp.c_proj: PEFT gets the longer suffix where the last name is shared
    assert peft_target_modules(gpt2, ATTENTION) == ["c_attn", "attn.c_proj"]
    # BertLayer: attention.self.{query,key,value}, attention.output.dense, intermediate.dense, output.dense
    bert = load_model("google-bert/bert-base-uncased")
    assert peft_target_modules(bert, ATTENTION) == ["query", "key", "value", "attention.output.dense"]
    jamba = load_model("ai21labs/Jamba-v0.1")
    assert {"in_proj", "out_proj"} <= set(nameable_modules(jamba))
    assert layer_modules(jamba, "in_proj,out_proj") == []


@pytest.mark.parametrize(("model", "expected"), [
    # GPT2Block (n_embd 768, 12 layers; Conv1D weights): attn.c_attn 768 -> 2304, attn.c_proj 768 -> 768;
    # r = 8: 8 * (768 + 2304) + 8 * (768 + 768) = 24,576 + 12,288 = 36,864 per layer; x 12 = 442,368
    # (mlp.c_proj 3072 -> 768, 8 * 3,840 = 30,720 per layer, is not attention)
    ("openai-community/gpt2", 442_368),
    # gpt2-xl (n_embd 1600, 48 layers): 8 * (1600 + 4800) + 8 * (1600 + 1600) = 51,200 + 25,600 = 76,800; x 48
    ("openai-community/gpt2-xl", 3_686_400),
    # octocoder (gpt_bigcode, n_embd 6144, 40 layers, 48 heads of 128, multi-query): c_attn 6144 -> 6144 + 2 * 128
    # = 6400; 8 * (6144 + 6400) + 8 * (6144 + 6144) = 100,352 + 98,304 = 198,656 per layer; x 40 = 7,946,240
    ("bigcode/octocoder", 7_946_240),
    # BertLayer (hidden 768, 12 layers): query, key, value, attention.output.dense all 768 -> 768:
    # 4 * 8 * (768 + 768) = 49,152 per layer; x 12 = 589,824 (intermediate.dense and output.dense, 768 <-> 3072, not)
    ("google-bert/bert-base-uncased", 589_824),
])
def test_attention_adapter_parameters_by_hand(model: str, expected: int) -> None:
    spec = load_model(model)
    whole = stages(spec.num_layers, 1)[0]
    adapters = lora_adapters(spec, whole, LoraConfig(rank=8, targets=ATTENTION), 1)
    assert sum(local * count for _, local, count in adapters) == expected


PEFT_FAMILIES = ["llama", "qwen2", "gemma2", "phi", "phi3", "gpt2", "gpt_neox", "falcon", "bloom", "opt", "olmo2"]
"""Tiny text decoders (tests/trace_models.py) on which PEFT's ``all-linear`` is memest's: every linear of
the layers. Not so: routed-expert models (PEFT also adapts the router ``gate`` and the expert stacks),
Jamba (the mamba mixers' projections), Gemma 3 (its vision tower)."""


@pytest.mark.parametrize("family", PEFT_FAMILIES)
def test_peft_adapts_what_memest_selects(family: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    from trace_models import tiny_config

    from memest.sources import spec_from_config
    from memest.trace import _model

    cfg = tiny_config(family)
    spec = spec_from_config(cfg)

    def adapted(target_modules: str | list[str]) -> tuple[list[str], int]:
        model, _ = _model.build(cfg, torch.bfloat16, "sdpa", task=spec.task)
        peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=target_modules))
        inside = {name for layer in _model.decoder_layers(peft_model)
                  for name, module in layer.named_modules() if isinstance(module, LoraLayer)}
        everywhere = sum(isinstance(module, LoraLayer) for module in peft_model.modules())
        per_layer = sum(isinstance(module, LoraLayer) for layer in _model.decoder_layers(peft_model)
                        for module in layer.modules())
        return [m for m in _layer_linears(spec) if m in inside], everywhere - per_layer

    # PEFT's all-linear: every Linear / Conv1D but the output layer (tuners_utils._maybe_include_all_linear_layers)
    modules, outside = adapted(ALL_LINEAR)
    assert (modules, outside) == (layer_modules(spec, ALL_LINEAR), 0)  # no lm_head adapter, nothing else
    assert adapted(lora_target_modules(spec, ATTENTION)) == (layer_modules(spec, ATTENTION), 0)
