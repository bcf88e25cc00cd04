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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memest.errors import MissingDependencyError, UnsupportedArchitectureError
from memest.sources.config import HFConfig
from memest.sources.families._build import torch_dtype_of
from memest.spec import (
    AttentionSpec,
    Component,
    LayerSpec,
    MLPSpec,
    ModelSpec,
    Split,
    StateSpec,
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

    model_type = cfg.model_type
    arch = architecture or cfg.architecture
    dtype = _dtype(cfg, torch)
    if not _check_buildable(cfg, transformers, trust_remote_code=trust_remote_code):
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


def check_buildable(cfg: HFConfig, *, trust_remote_code: bool) -> None:
    """Refuse, before anything is built, a config :func:`spec_from_meta` would refuse: a ``layer_types``
    entry memest does not know, a model_type transformers lacks without remote code (``auto_map``), or
    remote code without ``trust_remote_code``. Callers run it before saying that a build starts, so a
    refused model gets its one-line error and nothing else.

    Raises:
        ConfigError, UnsupportedArchitectureError, MissingDependencyError: as :func:`spec_from_meta`.
    """
    _check_layer_types(cfg.text)
    _, transformers = _import_torch_transformers()
    _check_buildable(cfg, transformers, trust_remote_code=trust_remote_code)


def _check_buildable(cfg: HFConfig, transformers: Any, *, trust_remote_code: bool) -> bool:
    """True when transformers ships the model_type; False when it runs remote code the user allowed.

    Raises:
        UnsupportedArchitectureError: transformers lacks the model_type and the config names no remote
            code, or names it without ``trust_remote_code``.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = cfg.model_type
    if model_type in CONFIG_MAPPING:
        return True
    if not cfg.has("auto_map"):
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} of {cfg.name!r} is unknown to transformers {transformers.__version__} "
            "and the config names no remote code (auto_map); upgrade transformers or pass a supported model"
        )
    if not trust_remote_code:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} of {cfg.name!r} is not in transformers {transformers.__version__}; "
            "its config points to code in the model repository (auto_map): pass {trust_remote_code} to run it",
            field="trust_remote_code"
        )
    return False


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
    _check_layer_types(cfg.text)
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
    built = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    built_types = getattr(built, "layer_types", None)
    if isinstance(built_types, list) and all(isinstance(t, str) for t in built_types):
        facts.layer_types = built_types  # as transformers derives them (Llama 4 chunked layers, Nemotron-H)
    facts.chunk = _positive_attr(built, "attention_chunk_size")
    facts.built = built
    facts.encoder_tokens = _image_tokens(cfg)

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
        torch_dtype=torch_dtype_of(cfg),
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


# layer_types words of the families transformers builds; the layer's tensors decide its kind
_LAYER_TYPE_WORDS = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "linear_attention", "conv", "mamba", "attention",
    "moe", "mlp", "hybrid", "hybrid_sliding", "indexed_attention", "compressed_sparse_attention",
    "heavily_compressed_attention",
})


def _check_layer_types(text: HFConfig) -> None:
    """A ``layer_types`` entry memest does not know is a ConfigError naming it (``layer_types[3] = 'foo'``)."""
    from memest.sources.families._layers import listed_kinds

    if isinstance(text.raw.get("layer_types"), list):
        listed_kinds(text, "layer_types", None, {word: word for word in sorted(_LAYER_TYPE_WORDS)})


def _positive_attr(obj: Any, name: str) -> int | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _image_tokens(cfg: HFConfig) -> int:
    """Encoder positions a cross-attention layer caches per request: one image of mllama's vision
    tower, ``max_num_tiles x ((image_size / patch_size)^2 + 1)`` (``MllamaVisionModel``: a class
    token per tile); 0 when the config has no such tower."""
    vision = cfg.raw.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    tiles, image, patch = (vision.get(k) for k in ("max_num_tiles", "image_size", "patch_size"))
    if not all(isinstance(v, int) and v > 0 for v in (tiles, image, patch)):
        return 0
    return tiles * ((image // patch) ** 2 + 1)


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
            chunk=None,
            encoder_tokens=0,
            text=text,
            built=None,
        )

    def value(self, *names: str) -> Any:
        """The first of ``names`` the built transformers config has (its class defaults filled in),
        else the raw config's; None when neither has one."""
        for name in names:
            value = getattr(self.built, name, None) if self.built is not None else None
            if value is None:
                value = self.text.raw.get(name)
            if value is not None:
                return value
        return None

    def positive(self, *names: str) -> int | None:
        """:meth:`value` when it is a positive int."""
        value = self.value(*names)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


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
    cross = bool(re.search(_CROSS, names))
    if not causal and not cross:
        stack = "encoder"  # bidirectional layers (BERT-style) form an encoder stack
    layer_type = facts.layer_types[index] if isinstance(facts.layer_types, list) and index < len(facts.layer_types) \
        else None
    self_attention = any(_ATTN_PROJ.search(t.name) and not _CROSS.search(t.name) for t in tensors)
    # a Mamba mixer beside the attention (Falcon-H1) keeps its state too
    state = _state(tensors, facts, None if self_attention else layer_type)
    if state is not None and not self_attention:
        attention = AttentionSpec(kind=state[0], num_heads=0, num_kv_heads=0, head_dim=0, state=state[1])
    elif cross and not self_attention:  # a cross-attention-only layer (mllama): the image tokens per request
        attention = AttentionSpec(kind="cross", num_heads=facts.heads, num_kv_heads=facts.kv, head_dim=facts.head_dim,
                                  encoder_tokens=facts.encoder_tokens)
    elif not self_attention and not cross and re.search(r"(^|\s)(mixer|mamba)\.", names):
        attention = AttentionSpec(kind="none", num_heads=0, num_kv_heads=0, head_dim=0)  # MLP-only block
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
            index_head_dim=(facts.positive("index_head_dim") or 0) if re.search(r"(^|\.)indexer\.", names) else 0,
            causal=causal,
        )
    else:
        heads = _module_heads(module, facts)
        attention = AttentionSpec(
            num_heads=heads.num_heads,
            num_kv_heads=heads.num_kv_heads,
            head_dim=heads.head_dim,
            v_head_dim=heads.v_head_dim,
            kv_shared=heads.kv_shared,
            kv_reused=heads.kv_reused,
            sliding_window=window,
            chunk_size=facts.chunk if layer_type == "chunked_attention" and window is None else None,
            state=state[1] if state is not None else None,
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


@dataclass(frozen=True)
class _Heads:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int = 0
    kv_shared: bool = False
    kv_reused: bool = False


def _module_heads(module: Any, facts: _Facts) -> _Heads:
    """A layer's own attention geometry, read from its self-attention module when it has separate
    ``q_proj`` / ``k_proj`` / ``v_proj`` linears (per-layer KV heads and head dims: MiMo-V2-Flash's
    sliding layers, Gemma 4's global layers), else the config's.

    ``head_dim`` is the module's attribute; KV heads are ``k_proj`` outputs / head_dim, V's head dim
    ``v_proj`` outputs / KV heads; a module built without ``v_proj`` (``v_proj = None``: Gemma 4
    ``attention_k_eq_v``) uses K as V; one without ``k_proj`` reads another layer's cache (Gemma 4
    ``num_kv_shared_layers``).
    """
    from torch import nn

    default = _Heads(facts.heads, facts.kv, facts.head_dim)
    for sub in module.modules():
        q = getattr(sub, "q_proj", None)
        if not isinstance(q, nn.Linear) or "cross" in type(sub).__name__.lower():
            continue
        d = getattr(sub, "head_dim", None)
        if not isinstance(d, int) or d <= 0:
            return default
        k_proj, v_proj = getattr(sub, "k_proj", None), getattr(sub, "v_proj", None)
        groups = getattr(sub, "num_key_value_groups", None)
        if not isinstance(k_proj, nn.Linear):
            if hasattr(sub, "k_proj") or getattr(sub, "is_kv_shared_layer", False):
                return _Heads(facts.heads, facts.kv, d, kv_reused=True)
            return default
        kv = k_proj.out_features // d
        heads = kv * groups if isinstance(groups, int) and groups > 0 else facts.heads
        if isinstance(v_proj, nn.Linear):
            return _Heads(heads, kv, d, v_head_dim=v_proj.out_features // kv)
        return _Heads(heads, kv, d, kv_shared=hasattr(sub, "v_proj") and v_proj is None)
    return default


_ATTN_PROJ = re.compile(r"(^|\.)(q_proj|k_proj|v_proj|qkv_proj|query_key_value|c_attn|Wqkv|query|key|value|q_a_proj"
                        r"|kv_a_proj_with_mqa|kv_b_proj|q|k|v)\.weight$")
"""A softmax attention's projection (GDN's ``in_proj_qkvz`` is not one)."""
_CROSS = re.compile(r"EncDecAttention|crossattention|encoder_attn|cross_attn")


def _state(tensors: list[TensorSpec], facts: _Facts, layer_type: str | None) -> tuple[str, StateSpec] | None:
    """The kind and per-sequence state of a state layer (None for other layers), read from its
    tensors and the config (:mod:`memest.sources.families._layers`).

    - LFM2 short convolution: ``conv.conv.weight (h, 1, L)``;
    - Gated DeltaNet (``linear_attn.``): ``conv1d.weight (2 Hk dk + Hv dv, 1, K)`` and the config's
      ``linear_*`` head counts and dims;
    - Mamba(-1): ``A_log (d_in, N)`` and ``conv1d.weight (d_in, 1, K)``;
    - Mamba-2: ``A_log (heads,)`` and ``conv1d.weight (d_in + 2 G N, 1, K)``, N and G from the config.

    Raises:
        UnsupportedArchitectureError: a state layer whose state cannot be read (never a silent 0).
    """
    from memest.sources.families._layers import gated_deltanet_state, mamba1_state, mamba2_state, short_conv_state

    def shape(pattern: str) -> tuple[int, ...] | None:
        return next((t.shape for t in tensors if re.search(pattern, t.name)), None)

    short = shape(r"(^|\.)conv\.conv\.weight$")
    if short is not None and len(short) == 3:
        return "conv", short_conv_state(short[0], short[2])
    conv = shape(r"conv1d\.weight$")
    a_log = shape(r"(^|\.)A_log$")
    if a_log is None:
        if layer_type in ("conv", "linear_attention", "mamba"):
            raise UnsupportedArchitectureError(f"layer_types names a {layer_type!r} layer whose state memest cannot "
                                               "read from its parameters (no A_log / conv weight)")
        return None
    if conv is None or len(conv) != 3:
        raise UnsupportedArchitectureError("a state-space layer without a conv1d.weight (channels, 1, kernel): "
                                           "memest cannot size its per-sequence state")
    if any(x.name.startswith("linear_attn.") for x in tensors):
        k_heads, v_heads = facts.positive("linear_num_key_heads"), facts.positive("linear_num_value_heads")
        k_dim, v_dim = facts.positive("linear_key_head_dim"), facts.positive("linear_value_head_dim")
        if not (k_heads and v_heads and k_dim and v_dim):
            raise UnsupportedArchitectureError("a linear-attention layer without linear_num_key_heads / "
                                               "linear_num_value_heads / linear_key_head_dim / linear_value_head_dim")
        return "linear", gated_deltanet_state(k_heads, v_heads, k_dim, v_dim, conv[2],
                                              ssm_dtype=_ssm_dtype(facts.value("mamba_ssm_dtype")))
    if len(a_log) == 2:
        return "mamba", mamba1_state(a_log[0], a_log[1], conv[2])
    n = facts.positive("ssm_state_size", "state_size", "mamba_d_state", "d_state")
    groups = facts.positive("n_groups", "mamba_n_groups", "ngroups") or 1
    if not n:
        raise UnsupportedArchitectureError("a Mamba-2 layer without ssm_state_size / state_size / mamba_d_state: "
                                           "memest cannot size its per-sequence state")
    d_in = conv[0] - 2 * groups * n
    heads = a_log[0]
    return "mamba", mamba2_state(d_in, groups, n, heads, d_in // heads, conv[2],
                                 ssm_dtype=_ssm_dtype(facts.value("mamba_ssm_cache_dtype")))


def _ssm_dtype(value: Any) -> str | None:
    """The SSM state's dtype a config fixes (``float32``), None for the model's (absent or ``auto``)."""
    return value if isinstance(value, str) and value != "auto" else None


_COMPONENT_RULES: tuple[tuple[re.Pattern[str], Component], ...] = (
    (
        re.compile(r"vision|visual|image|patch|multi_modal|mm_|audio|pooler|classifier|score\.|qa_outputs"
                   r"|altup|laurel"),  # Gemma 3n's AltUp and LAuReL blocks
        Component.OTHER,
    ),
    (re.compile(r"experts?\.\d+\.|(^|\.)experts\.|routed"), Component.EXPERTS),  # Gemma 4: a layer's own experts
    (re.compile(r"router|\.gate\.(weight|bias)|e_score_correction|shared_expert_gate"), Component.ROUTER),
    (re.compile(r"norm|\bln_|(^|\.)ln\d|(^|\.)pre_ln\.|layernorm|LayerNorm"), Component.NORM),  # RWKV: ln1, pre_ln
    # state-space mixers; Nemotron-H names every block's module "mixer", its attention and MLPs too
    (re.compile(r"mamba|ssm|A_log|(^|\.)D$|mixer\.(?!(q_proj|k_proj|v_proj|o_proj|up_proj|down_proj|shared_experts"
                r"|fc\d_latent_proj)\b)"), Component.OTHER),
    (re.compile(r"lm_head|\.decoder\.weight$|output_projection|embed_out|predictions|project_out|^head\.weight$"),
     Component.LM_HEAD),  # RWKV: head
    (
        re.compile(r"embed|wte|wpe|word_embeddings|position_embeddings|token_type|shared\.weight|project_in"),
        Component.EMBEDDING,
    ),
    (re.compile(r"(^|\.)feed_forward\."), Component.MLP),  # RWKV's channel mix has a key and a value
    (
        re.compile(r"attn|attention|q_proj|k_proj|v_proj|o_proj|query|key|value|qkv|sinks", re.IGNORECASE),
        Component.ATTENTION,
    ),
    (
        re.compile(r"mlp|ffn|feed_forward|fc\d|c_fc|dense|\.wi|\.wo\b|intermediate|shared_expert|(^|\.)(up|down)_proj",
                   re.IGNORECASE),
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
