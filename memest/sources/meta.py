"""Models built by transformers on PyTorch's ``meta`` device: exact parameters, no memory.

The meta device gives every tensor a shape and a dtype but no storage, so even a 671B-parameter
model builds in about a second on a laptop. memest uses it two ways:

- :func:`count_params_on_meta` is the ground truth the analytic adapters are tested against;
- :func:`spec_from_meta` is the fallback for a ``model_type`` without an analytic adapter: it
  derives a :class:`~memest.spec.ModelSpec` from the instantiated module tree.

torch and transformers are imported inside the functions only, so importing this module is cheap
and the analytic path never loads them.

Limitations:
    A spec from the meta device knows shapes exactly but *guesses* what it cannot see: the
    component and tensor-parallel split of each tensor (from its name), and attention facts
    (from the config). It counts what the transformers class instantiates, which can differ
    from the checkpoint (e.g. DeepSeek-V3's multi-token-prediction layer is not instantiated).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from memest.errors import MissingDependencyError, UnsupportedArchitectureError
from memest.sources.config import HFConfig
from memest.spec import (
    AttentionSpec,
    Component,
    LayerSpec,
    MLPSpec,
    ModelSpec,
    Split,
    TaskKind,
    TensorSpec,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["build_on_meta", "count_params_on_meta", "spec_from_meta"]

# architectures class-name suffix -> the transformers auto class that builds such a head
_AUTO_BY_SUFFIX = (
    ("ForCausalLM", "AutoModelForCausalLM"),
    ("LMHeadModel", "AutoModelForCausalLM"),
    ("ForMaskedLM", "AutoModelForMaskedLM"),
    ("ForSequenceClassification", "AutoModelForSequenceClassification"),
    ("ForTokenClassification", "AutoModelForTokenClassification"),
    ("ForQuestionAnswering", "AutoModelForQuestionAnswering"),
    ("ForImageTextToText", "AutoModelForImageTextToText"),
)


def _import_torch_transformers() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(
            "building a model on the meta device needs torch and transformers; "
            "install with: pip install torch transformers"
        ) from exc
    return torch, transformers


def _dtype(cfg: HFConfig, torch: Any) -> Any:
    """The config's floating dtype (``torch_dtype`` / ``dtype``), else bfloat16; always explicit."""
    name = cfg.get("torch_dtype", "dtype", default=None) or cfg.text.get("torch_dtype", "dtype", default=None)
    value = getattr(torch, str(name), None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) and value.is_floating_point else torch.bfloat16


def build_on_meta(
    cfg: HFConfig, *, trust_remote_code: bool = False, architecture: str | None = None
) -> torch.nn.Module:
    """The transformers model of a config, instantiated on the meta device.

    The class is ``architecture`` if given, else the first of the config's ``architectures``,
    looked up in transformers; a name transformers lacks (a remote-code class such as
    ``PhiMoEForCausalLM``) falls back to the auto class for its suffix (``...ForCausalLM`` ->
    ``AutoModelForCausalLM``) on the native config class; no name at all means
    ``AutoModelForCausalLM``. Remote code runs only with ``trust_remote_code`` and only for a
    model_type transformers does not know; it comes only from the folder or Hub repository the config
    was read from (``cfg.code_from``).

    Raises:
        UnsupportedArchitectureError: transformers does not know the model_type (and remote code
            was not allowed), or the class cannot be found.
        MissingDependencyError: torch or transformers is not installed.
    """
    torch, transformers = _import_torch_transformers()
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = cfg.model_type
    arch = architecture or cfg.architecture
    dtype = _dtype(cfg, torch)
    if model_type not in CONFIG_MAPPING:
        if not cfg.has("auto_map"):
            raise UnsupportedArchitectureError(
                f"model_type {model_type!r} of {cfg.name!r} is unknown to transformers {transformers.__version__} "
                "and the config names no remote code (auto_map); upgrade transformers or pass a supported model"
            )
        if not trust_remote_code:
            raise UnsupportedArchitectureError(
                f"model_type {model_type!r} of {cfg.name!r} is not in transformers {transformers.__version__}; "
                "its config points to code in the model repository (auto_map): pass --trust-remote-code to run it"
            )
        return _build_remote(cfg, torch, transformers, arch, dtype)

    raw = {k: v for k, v in cfg.raw.items() if k not in ("model_type", "auto_map")}
    config = AutoConfig.for_model(model_type, **raw)
    cls = getattr(transformers, arch, None) if arch else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        auto_name = _auto_class_name(arch, config)
        with torch.device("meta"):
            return getattr(transformers, auto_name).from_config(config, dtype=dtype)
    with torch.device("meta"):
        return cls._from_config(config, dtype=dtype)


def _auto_class_name(arch: str, config: Any) -> str:
    if arch.endswith("ForConditionalGeneration"):
        return (
            "AutoModelForSeq2SeqLM" if getattr(config, "is_encoder_decoder", False) else "AutoModelForImageTextToText"
        )
    for suffix, auto in _AUTO_BY_SUFFIX:
        if arch.endswith(suffix):
            return auto
    return "AutoModelForCausalLM"


_NOT_COPIED = frozenset({"model_type", "auto_map", "architectures", "_name_or_path", "name_or_path"})
"""Config keys not copied onto the remote config: they choose which class runs and where its code comes from."""


def _remote_code_location(cfg: HFConfig) -> str:
    """The folder or Hub repository the remote code of ``cfg`` may come from: where the config came from.

    Raises:
        UnsupportedArchitectureError: the config came from nowhere code can be read (built in memory),
            its ``auto_map`` points into another repository (``repo--module.Class``), or a Hub id is
            shadowed by a folder of that name in the working directory (transformers would read that).
    """
    import os

    where = cfg.code_from
    if not where:
        raise UnsupportedArchitectureError(
            f"model_type {cfg.model_type!r} of {cfg.name!r} needs its repository's code, but the config was not read "
            "from a folder or a Hub repository; pass the model folder or the Hub id"
        )
    auto_map = cfg.raw.get("auto_map")
    refs = auto_map.values() if isinstance(auto_map, dict) else ()
    for ref in refs:
        for item in ref if isinstance(ref, list | tuple) else (ref,):
            if isinstance(item, str) and "--" in item:
                raise UnsupportedArchitectureError(
                    f"the auto_map of {cfg.name!r} loads code from another repository ({item!r}); memest runs remote "
                    f"code only from the folder or repository named ({where!r}): pass that repository instead"
                )
    if not os.path.isabs(where) and os.path.exists(where):
        raise UnsupportedArchitectureError(
            f"{where!r} names both a Hub repository and a folder in the working directory; transformers would run the "
            f"folder's code: run memest from another directory, or pass the folder as {os.path.abspath(where)!r}"
        )
    return where


def _build_remote(cfg: HFConfig, torch: Any, transformers: Any, arch: str, dtype: Any) -> Any:
    """The remote-code model of ``cfg`` on the meta device, with the config's values.

    The code comes only from where the config was read (:func:`_remote_code_location`): the folder
    the user named (an absolute path, never a name relative to the working directory) or the Hub repo.
    """
    from transformers import AutoConfig

    where = _remote_code_location(cfg)
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=True)
    except Exception as exc:  # network, missing repo, broken remote code: all become one message
        raise UnsupportedArchitectureError(
            f"could not load the remote code of {cfg.name!r} (model_type {cfg.model_type!r}) from {where!r}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    for key, value in cfg.raw.items():
        if key not in _NOT_COPIED:
            setattr(config, key, value)
    auto = getattr(transformers, _auto_class_name(arch, config) if arch else "AutoModelForCausalLM")
    with torch.device("meta"):
        return auto.from_config(config, trust_remote_code=True, dtype=dtype)


def count_params_on_meta(cfg: HFConfig, *, trust_remote_code: bool = False, architecture: str | None = None) -> int:
    """Parameters of the transformers model of ``cfg`` (see :func:`build_on_meta`), tied ones once."""
    model = build_on_meta(cfg, trust_remote_code=trust_remote_code, architecture=architecture)
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# ModelSpec from a module tree


def spec_from_meta(cfg: HFConfig, *, trust_remote_code: bool) -> ModelSpec:
    """A ModelSpec derived from the transformers model built on the meta device.

    Layers are the children of the model's decoder ``ModuleList`` (encoder then decoder stack
    for encoder-decoder models); layers with identical parameter shapes and facts share one
    LayerSpec object. Every other parameter goes to ``embedding`` when it is registered before the
    first layer, else to ``head``. Components and TP splits are guessed from parameter names;
    heads, KV heads and head_dim come from the config; sliding windows and causality from the
    attention modules' ``sliding_window`` / ``is_causal`` attributes when they have them.

    Raises:
        UnsupportedArchitectureError: see :func:`build_on_meta`; also when no layer stack is found.
    """
    model = build_on_meta(cfg, trust_remote_code=trust_remote_code)
    import transformers

    text = cfg.text
    stacks = _layer_stacks(model, getattr(model.config, "is_encoder_decoder", False))
    if not stacks:
        raise UnsupportedArchitectureError(
            f"found no layer stack (nn.ModuleList of blocks) in {type(model).__name__} of {cfg.name!r}"
        )
    task = _task(type(model).__name__, bool(getattr(model.config, "is_encoder_decoder", False)))
    hidden = _positive(text, "hidden_size", "n_embd", "d_model", "dim") or 0
    facts = _Facts.from_config(text, hidden)

    seen: set[int] = set()
    kinds: dict[Any, LayerSpec] = {}
    layers: list[LayerSpec] = []
    layer_prefixes = [prefix for prefix, _, _ in stacks]
    for prefix, module_list, stack in stacks:
        for index, layer_module in enumerate(module_list):
            layers.append(_layer_spec(layer_module, index, stack, facts, seen, kinds))

    embedding: list[TensorSpec] = []
    head: list[TensorSpec] = []
    past_layers = False
    for name, param in model.named_parameters():
        if any(name.startswith(p) for p in layer_prefixes):
            past_layers = True
            continue
        if id(param) in seen:
            continue
        seen.add(id(param))
        tensor = _guess_tensor(name, tuple(param.shape), in_layer=False, vocab=facts.vocab)
        (head if past_layers else embedding).append(tensor)

    inp, out = model.get_input_embeddings(), _output_embeddings(model)
    tied = inp is not None and out is not None and getattr(out, "weight", None) is getattr(inp, "weight", 0)
    vocab = facts.vocab or (int(inp.weight.shape[0]) if inp is not None and hasattr(inp, "weight") else 0)
    if not hidden and inp is not None and hasattr(inp, "weight"):
        hidden = int(inp.weight.shape[1])
    return ModelSpec(
        name=cfg.name,
        model_type=cfg.model_type,
        architecture=cfg.architecture or type(model).__name__,
        hidden_size=hidden,
        vocab_size=vocab,
        max_position_embeddings=_positive(
            text, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"
        ),
        tie_word_embeddings=bool(tied),
        layers=tuple(layers),
        embedding=tuple(embedding),
        head=tuple(head),
        task=task,
        torch_dtype=str(cfg.get("torch_dtype", "dtype", default="")) or None,
        quantization=_quantization(cfg),
        source=cfg.source,
        notes=(
            (
                f"no analytic adapter for model_type {cfg.model_type!r}: built by transformers "
                f"{transformers.__version__} on the meta device ({type(model).__name__}); parameter counts are exact, "
                "components and tensor-parallel splits are guessed from parameter names"
            ),
        ),
    )


def _quantization(cfg: HFConfig) -> Any:
    from memest.sources.families._build import quantization_of

    return quantization_of(cfg)


def _output_embeddings(model: Any) -> Any:
    try:
        return model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None


def _task(class_name: str, encoder_decoder: bool) -> TaskKind:
    if class_name.endswith("ForMaskedLM"):
        return "masked_lm"
    if encoder_decoder:
        return "seq2seq"
    if class_name.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")):
        return "causal_lm"
    return "classification"


_NOT_TEXT = re.compile(r"vision|visual|image|audio|speech|vit\b|patch|mm_projector|multi_modal", re.IGNORECASE)


def _layer_stacks(model: Any, encoder_decoder: bool) -> list[tuple[str, Any, str]]:
    """``(prefix, ModuleList, stack)`` of the text model's layer stacks, in execution order.

    A stack is an outermost ``nn.ModuleList`` whose children all have parameters and share one
    class; towers whose path names another modality (vision, audio) are skipped. For
    encoder-decoder models both stacks are returned (encoder first); otherwise the one holding
    the most parameters.
    """
    from torch import nn

    found: list[tuple[str, Any, int]] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if any(name.startswith(f"{outer}.") for outer, _, _ in found):
            continue
        classes = {type(child) for child in module}
        if len(classes) > 1 and not all("Layer" in c.__name__ or "Block" in c.__name__ for c in classes):
            continue
        if any(next(child.parameters(), None) is None for child in module):
            continue
        found.append((name, module, sum(p.numel() for p in module.parameters())))
    text = [(n, m, size) for n, m, size in found if not _NOT_TEXT.search(n)]
    if not text:
        return []
    if encoder_decoder:
        enc = [(n, m) for n, m, _ in text if "encoder" in n.split(".")]
        dec = [(n, m) for n, m, _ in text if "decoder" in n.split(".")]
        if enc and dec:
            return [(f"{enc[0][0]}.", enc[0][1], "encoder"), (f"{dec[0][0]}.", dec[0][1], "decoder")]
    name, module, _ = max(text, key=lambda item: item[2])
    return [(f"{name}.", module, "decoder")]


def _positive(cfg: HFConfig, *keys: str) -> int | None:
    """The first of ``keys`` holding a positive integer, else None (lenient: unknown families)."""
    for key in keys:
        value = cfg.raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class _Facts:
    """Attention / MLP facts the config gives (shared by every layer)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    @classmethod
    def from_config(cls, text: HFConfig, hidden: int) -> _Facts:
        heads = _positive(text, "num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads") or 0
        kv = _positive(text, "num_key_value_heads", "num_kv_heads", "n_kv_heads", "num_key_value_groups")
        if kv is None:
            kv = 1 if text.raw.get("multi_query") is True else heads
        head_dim = _positive(text, "head_dim", "d_kv") or (hidden // heads if heads else 0)
        return cls(
            heads=heads,
            kv=kv,
            head_dim=head_dim,
            vocab=_positive(text, "vocab_size") or 0,
            intermediate=_positive(
                text,
                "intermediate_size",
                "n_inner",
                "ffn_dim",
                "d_ff",
                "ffn_hidden_size",
                "hidden_dim",
                "encoder_ffn_dim",
            )
            or 4 * hidden,
            moe_intermediate=_positive(text, "moe_intermediate_size", "expert_intermediate_size") or 0,
            top_k=_positive(text, "num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts") or 0,
            activation=str(
                text.get("hidden_act", "hidden_activation", "activation_function", "activation", default="silu")
            ),
            parallel=any(
                text.raw.get(key) is True
                for key in ("use_parallel_residual", "parallel_attn", "new_decoder_architecture")
            ),
            kv_lora_rank=_positive(text, "kv_lora_rank") or 0,
            q_lora_rank=_positive(text, "q_lora_rank"),
            qk_rope_head_dim=_positive(text, "qk_rope_head_dim") or 0,
            qk_nope_head_dim=_positive(text, "qk_nope_head_dim") or 0,
            v_head_dim=_positive(text, "v_head_dim") or 0,
            window=None
            if text.raw.get("use_sliding_window") is False
            else _positive(text, "sliding_window", "window_size"),
            layer_types=text.raw.get("layer_types"),
        )


def _layer_spec(
    module: Any, index: int, stack: str, facts: _Facts, seen: set[int], kinds: dict[Any, LayerSpec]
) -> LayerSpec:
    """The LayerSpec of one layer module (``index`` within its stack), shared with equal layers."""
    tensors = []
    for name, param in module.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        tensors.append(_guess_tensor(name, tuple(param.shape), in_layer=True, vocab=facts.vocab))
    names = " ".join(t.name for t in tensors)

    window: int | None = None
    causal: bool | None = None
    sliding = (
        isinstance(facts.layer_types, list)
        and index < len(facts.layer_types)
        and (facts.layer_types[index] == "sliding_attention")
    )
    for sub in module.modules():
        value = getattr(sub, "sliding_window", None)
        if window is None and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            window = value
        if getattr(sub, "attention_type", None) == "local" or getattr(sub, "layer_type", None) == "sliding_attention":
            sliding = True
        flag = getattr(sub, "is_causal", None)
        if causal is None and isinstance(flag, bool) and "cross" not in type(sub).__name__.lower():
            causal = flag
    if window is None and sliding and facts.window:
        window = facts.window
    if causal is None:
        causal = stack == "decoder"
    cross = bool(re.search(r"EncDecAttention|crossattention|encoder_attn|cross_attn", names))
    if not causal and not cross:
        stack = "encoder"  # bidirectional layers (BERT-style) form an encoder stack
    if re.search(r"\bA_log\b|\.A_log|mixer\.|mamba\.|ssm", names):
        attention = AttentionSpec(
            kind="mamba", num_heads=0, num_kv_heads=0, head_dim=0, state_elements=_mamba_state(tensors)
        )
    elif "kv_a_proj" in names or "kv_b_proj" in names:
        attention = AttentionSpec(
            kind="mla",
            num_heads=facts.heads,
            num_kv_heads=facts.heads,
            head_dim=facts.qk_nope_head_dim + facts.qk_rope_head_dim,
            v_head_dim=facts.v_head_dim,
            q_lora_rank=facts.q_lora_rank,
            kv_lora_rank=facts.kv_lora_rank,
            qk_rope_head_dim=facts.qk_rope_head_dim,
            causal=causal,
        )
    else:
        attention = AttentionSpec(
            num_heads=facts.heads,
            num_kv_heads=facts.kv,
            head_dim=facts.head_dim,
            sliding_window=window,
            cross_attention=cross,
            causal=causal,
        )
    experts = [t for t in tensors if t.component is Component.EXPERTS and len(t.shape) >= 3]
    gated = bool(re.search(r"gate_proj|gate_up|wi_0|\.w1\.|\.w3\.|gate\.weight|c_fc2|fc1_g", names))
    if experts:
        mlp = MLPSpec(
            gated=gated or "gate_up" in names,
            intermediate_size=facts.moe_intermediate or facts.intermediate,
            activation=facts.activation,
            num_experts=experts[0].shape[0],
            num_experts_per_tok=facts.top_k or 1,
        )
    else:
        mlp = MLPSpec(gated=gated, intermediate_size=facts.intermediate, activation=facts.activation)
    norm_kind = "layer"
    for sub in module.modules():
        if "rmsnorm" in type(sub).__name__.lower():
            norm_kind = "rms"
            break
    key = (tuple(tensors), attention, mlp, norm_kind, facts.parallel, stack)
    layer = kinds.get(key)
    if layer is None:
        layer = kinds[key] = LayerSpec(
            attention=attention,
            mlp=mlp,
            norm=norm_kind,  # type: ignore[arg-type]
            parallel_residual=facts.parallel,
            tensors=tuple(tensors),
            stack=stack,  # type: ignore[arg-type]
        )
    return layer


def _mamba_state(tensors: list[TensorSpec]) -> int:
    """Recurrent state per sequence of a Mamba(-1) mixer: conv (d_in x K) + SSM (d_in x N) elements.

    Read from ``conv1d.weight (d_in, 1, K)`` and ``A_log (d_in, N)``; 0 when the layout differs
    (Mamba-2 keeps ``A_log`` per head and a grouped state this cannot infer).
    """
    conv = next((t.shape for t in tensors if t.name.endswith("conv1d.weight") and len(t.shape) == 3), None)
    a_log = next((t.shape for t in tensors if t.name.endswith("A_log") and len(t.shape) == 2), None)
    if conv is None or a_log is None or conv[0] != a_log[0]:
        return 0
    return conv[0] * conv[2] + a_log[0] * a_log[1]


_COMPONENT_RULES: tuple[tuple[re.Pattern[str], Component], ...] = (
    (
        re.compile(r"vision|visual|image|patch|multi_modal|mm_|audio|pooler|classifier|score\.|qa_outputs"),
        Component.OTHER,
    ),
    (re.compile(r"experts?\.\d+\.|\.experts\.|routed"), Component.EXPERTS),
    (re.compile(r"router|\.gate\.(weight|bias)|e_score_correction|shared_expert_gate"), Component.ROUTER),
    (re.compile(r"norm|\bln_|\.ln\d|layernorm|LayerNorm"), Component.NORM),
    (re.compile(r"mamba|mixer|ssm|A_log|(^|\.)D$"), Component.OTHER),  # state-space mixers
    (re.compile(r"lm_head|\.decoder\.weight$|output_projection|embed_out|predictions|project_out"), Component.LM_HEAD),
    (
        re.compile(r"embed|wte|wpe|word_embeddings|position_embeddings|token_type|shared\.weight|project_in"),
        Component.EMBEDDING,
    ),
    (
        re.compile(r"attn|attention|q_proj|k_proj|v_proj|o_proj|query|key|value|qkv|sinks", re.IGNORECASE),
        Component.ATTENTION,
    ),
    (
        re.compile(r"mlp|ffn|feed_forward|fc\d|c_fc|dense|\.wi|\.wo\b|intermediate|shared_expert", re.IGNORECASE),
        Component.MLP,
    ),
)
_SPLIT_RULES: tuple[tuple[re.Pattern[str], Split], ...] = (
    (re.compile(r"qkv|query_key_value|c_attn|gate_up|sinks"), Split.COL),  # fused: before the k/v rule
    (re.compile(r"k_proj|v_proj|(^|\.)key\.|(^|\.)value\.|(^|\.)k\.|(^|\.)v\."), Split.KV),
    (
        re.compile(
            r"o_proj|out_proj|c_proj|down_proj|dense_4h_to_h|fc2|(^|\.)wo\.|(^|\.)o\.|attention\.dense|self_attn\.dense"
            r"|(^|\.)output\.dense|(^|\.)w2\."
        ),
        Split.ROW,
    ),
    (
        re.compile(
            r"q_proj|q_b_proj|kv_b_proj|(^|\.)query\.|(^|\.)q\.|dense_h_to_4h|fc1|c_fc|gate_proj|up_proj|(^|\.)wi"
            r"|intermediate\.dense|(^|\.)w1\.|(^|\.)w3\."
        ),
        Split.COL,
    ),
)


def _guess_tensor(name: str, shape: tuple[int, ...], *, in_layer: bool, vocab: int) -> TensorSpec:
    """A TensorSpec whose component and split are guessed from the parameter's name."""
    component = Component.OTHER
    for pattern, comp in _COMPONENT_RULES:
        if pattern.search(name):
            component = comp
            break
    if not in_layer and component in (Component.ATTENTION, Component.MLP) and "embed" in name:
        component = Component.EMBEDDING
    if component in (Component.EMBEDDING, Component.LM_HEAD) and len(shape) == 2 and vocab and shape[0] == vocab:
        return TensorSpec(name, shape, component, Split.VOCAB)
    split = Split.NONE
    if component in (Component.ATTENTION, Component.MLP, Component.EXPERTS) and len(shape) >= 1:
        for pattern, candidate in _SPLIT_RULES:
            if pattern.search(name):
                split = candidate
                break
        if split is Split.ROW and (len(shape) == 1 or name.endswith("bias")):
            split = Split.NONE  # a row-parallel layer's bias is added after the all-reduce
        if component is Component.EXPERTS and split is Split.NONE and len(shape) >= 3:
            split = Split.COL
    return TensorSpec(name, shape, component, split)
