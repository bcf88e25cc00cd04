"""The tensors of a GGUF file: which ggml type each tensor of a file type (``Q4_K_M``, ``Q8_0``, ...) gets.

A GGUF file made by ``convert_hf_to_gguf.py`` (``--outtype f16`` / ``bf16``) stores every tensor of two
or more dimensions in 16 bits and the 1-D ones (norms, biases) in f32; ``llama-quantize`` then gives
each weight a type (``src/llama-quant.cpp``, llama.cpp b4715):

A multimodal checkpoint's vision tower goes to a separate ``mmproj`` file and is left out.

- only tensors of 2+ dimensions whose name ends in ``weight`` are quantized, not norms, the MoE
  router (``ffn_gate_inp``), position embeddings or token types (``llama_model_quantize_impl``);
- the file type's default type (``Q4_K_M`` -> ``q4_K``) with the mixes of ``llama_tensor_get_type``:
  the output matrix (or, for tied embeddings, ``token_embd``) in ``q6_K`` (``q8_0`` for Falcon or rows
  not divisible by the block); for ``Q4_K_M`` / ``Q5_K_M``, ``attn_v`` and ``ffn_down`` of the layers
  where ``use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2`` in ``q6_K``; the fused
  ``attn_qkv`` in ``q5_K`` (``Q4_K_M``) / ``q6_K`` (``Q5_K_M``); the Q2_K / Q3_K / Q4_K_S / IQ4 rules;
- a type whose block does not divide a row falls back (``q4_K`` -> ``q5_0``, ``q5_K`` -> ``q5_1``,
  ``q6_K`` -> ``q8_0``, 256-blocks of IQ -> ``iq4_nl``, ``q2_K`` / ``q3_K`` -> ``q4_0``; else f16).

b4715 treats ``attn_qkv`` in its own branch (the CI logs of pythia-2.8b: Q4_K_M gives q4_K x81,
q5_K x32, q6_K x17); later builds fold it into the ``attn_v`` rule. No imatrix is assumed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memest.errors import InputError
from memest.sources.ggml_types import GGMLType, ggml_type, tensor_bytes
from memest.spec import Component, ModelSpec, TensorSpec

FILE_TYPES: dict[str, str] = {
    "f32": "f32", "f16": "f16", "bf16": "bf16",
    "q4_0": "q4_0", "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1", "q8_0": "q8_0",
    "q2_k": "q2_K", "q2_k_s": "q2_K", "q3_k_s": "q3_K", "q3_k_m": "q3_K", "q3_k_l": "q3_K",
    "q4_k_s": "q4_K", "q4_k_m": "q4_K", "q5_k_s": "q5_K", "q5_k_m": "q5_K", "q6_k": "q6_K",
    "iq4_xs": "iq4_xs", "iq4_nl": "iq4_nl",
}
"""The GGUF file types memest models (``llama-quantize`` names, lower case) -> their default ggml
type (``llama_model_quantize_impl``: ``default_type``). ``q4_k`` and ``q5_k`` mean the ``_M`` mixes,
``q3_k`` ``Q3_K_M``, as llama-quantize's aliases do."""

ALIASES = {"q4_k": "q4_k_m", "q5_k": "q5_k_m", "q3_k": "q3_k_m"}

CATEGORIES = ("token_embd", "pos_embd", "output", "output_norm", "attn_q", "attn_k", "attn_v", "attn_qkv",
              "attn_kv_b", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_inp", "norm", "other")


def file_type(name: str) -> str:
    """The canonical file-type name of ``--quantization`` (``Q4_K_M`` -> ``q4_k_m``).

    Raises:
        InputError: not a GGUF file type memest models (the message names them).
    """
    key = ALIASES.get(name.lower(), name.lower())
    if key not in FILE_TYPES:
        raise InputError(f"{{quantization}} {name!r} is not a GGUF file type memest models for llama.cpp / Ollama; "
                         f"use one of {', '.join(FILE_TYPES)}", field="quantization")
    return key


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor of a GGUF file.

    Attributes:
        name: Its GGUF name (``blk.3.ffn_down.weight``; memest's own for tensors it cannot name).
        category: What llama.cpp's quantizer and loader see it as (:data:`CATEGORIES`).
        layer: Its block index, None outside the blocks.
        shape: Its shape, rows first (transformers order; ggml's ``ne`` reversed).
        type: Its ggml type.
    """

    name: str
    category: str
    layer: int | None
    shape: tuple[int, ...]
    type: GGMLType

    @property
    def nbytes(self) -> int:
        """Bytes in the file (``ggml_nbytes``)."""
        return tensor_bytes(self.type, self.shape)

    @property
    def numel(self) -> int:
        """Elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


def _layer_category(t: TensorSpec) -> str:
    """The GGUF category of a layer tensor from its transformers name."""
    if len(t.shape) < 2:
        return "norm"
    module = t.module.rsplit(".", 1)[-1].lower()
    if t.component is Component.ROUTER:
        return "ffn_gate_inp"
    if t.component is Component.NORM:
        return "norm"
    if t.component is Component.ATTENTION:
        if module in ("query_key_value", "qkv_proj", "c_attn", "wqkv", "w_pack", "qkv"):
            return "attn_qkv"
        if module in ("q_proj", "query", "wq"):
            return "attn_q"
        if module in ("k_proj", "key", "wk"):
            return "attn_k"
        if module in ("v_proj", "value", "wv"):
            return "attn_v"
        if module == "kv_b_proj":
            return "attn_kv_b"
        if module in ("o_proj", "dense", "out_proj", "c_proj", "wo", "o"):
            return "attn_output"
        return "other"
    if t.component in (Component.MLP, Component.EXPERTS):
        name = t.name.lower()
        if "down" in name or "4h_to_h" in name or "fc2" in name or module in ("c_proj", "w2", "wo"):
            return "ffn_down"
        if "gate_up" in name or "up" in name or "h_to_4h" in name or "fc1" in name or module in ("c_fc", "w1", "w3"):
            return "ffn_up"
        if "gate" in name:
            return "ffn_gate"
        return "other"
    return "other"


def source_tensors(spec: ModelSpec, stored: str = "f16") -> list[GGUFTensor]:
    """The tensors of a GGUF file converted from ``spec`` by ``convert_hf_to_gguf.py --outtype
    <stored>``: 2+-D tensors in ``stored``, 1-D in f32; a tied lm_head stored once (as
    ``token_embd``)."""
    wide, f32 = ggml_type(stored), ggml_type("f32")
    out: list[GGUFTensor] = []
    for t in spec.embedding:
        if t.component is Component.OTHER:
            continue  # vision towers and projectors: a separate mmproj GGUF for llama.cpp
        if t.component is Component.EMBEDDING and len(t.shape) == 2:
            cat = "pos_embd" if "pos" in t.name or "wpe" in t.name else "token_embd"
        else:
            cat = "norm" if len(t.shape) < 2 else "other"
        out.append(GGUFTensor(t.name, cat, None, t.shape, wide if len(t.shape) >= 2 else f32))
    for i, layer in enumerate(spec.layers):
        for t in layer.tensors:
            cat = _layer_category(t)
            out.append(GGUFTensor(f"blk.{i}.{t.name}", cat, i, t.shape, wide if len(t.shape) >= 2 else f32))
    for t in spec.head:
        cat = "output" if t.component is Component.LM_HEAD else ("output_norm" if t.component is Component.NORM
                                                                 else "other")
        out.append(GGUFTensor(t.name, cat, None, t.shape, wide if len(t.shape) >= 2 else f32))
    return out


def _quantizable(t: GGUFTensor) -> bool:
    """``llama_model_quantize_impl``: 2+-D weights except norms, the router, position embeddings."""
    return len(t.shape) >= 2 and t.category not in ("norm", "output_norm", "ffn_gate_inp", "pos_embd")


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_FALLBACK = {"q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0", "q2_K": "q4_0", "q3_K": "q4_0",
             "iq2_xxs": "iq4_nl", "iq2_xs": "iq4_nl", "iq2_s": "iq4_nl", "iq3_xxs": "iq4_nl", "iq3_s": "iq4_nl",
             "iq1_s": "iq4_nl", "iq1_m": "iq4_nl", "iq4_xs": "iq4_nl"}


def _fallback(t: GGUFTensor, name: str) -> str:
    """``tensor_type_fallback``: a compatible type when the block does not divide the rows."""
    ncols = t.shape[-1]
    if ncols % ggml_type(name).block == 0:
        return name
    alt = _FALLBACK.get(name, "f16")
    return alt if ncols % ggml_type(alt).block == 0 else "f16"


@dataclass
class _State:
    n_attention_wv: int
    n_layer: int
    i_attention_wv: int = 0
    i_ffn_down: int = 0


def _mixed_type(t: GGUFTensor, default: str, ftype: str, spec: ModelSpec, st: _State, tied: bool) -> str:
    """``llama_tensor_get_type`` of b4715 for one tensor (counters advance as llama-quantize's do)."""
    falcon = spec.model_type == "falcon"
    n_gqa = spec.num_heads // max(1, spec.num_kv_heads)
    n_expert = spec.num_experts
    is_70b = spec.model_type == "llama" and spec.num_layers == 80
    new = default
    cat = t.category
    if cat == "output" or (tied and cat == "token_embd"):
        if falcon or t.shape[-1] % ggml_type(default).block:
            return "q8_0"
        return "q8_0" if default == "q8_0" else "q6_K"
    if cat == "token_embd":
        return new
    if cat in ("attn_v",):
        if ftype == "q2_k":
            new = "q4_K" if n_gqa >= 4 else "q3_K"
        elif ftype == "q2_k_s" and n_gqa >= 4:
            new = "q4_K"
        elif ftype == "q3_k_m":
            new = "q5_K" if st.i_attention_wv < 2 else "q4_K"
        elif ftype == "q3_k_l":
            new = "q5_K"
        elif ftype in ("iq4_nl", "iq4_xs") and n_gqa >= 4:
            new = "q5_K"
        elif ftype in ("q4_k_m", "q5_k_m") and _use_more_bits(st.i_attention_wv, st.n_attention_wv):
            new = "q6_K"
        elif ftype == "q4_k_s" and st.i_attention_wv < 4:
            new = "q5_K"
        if is_70b and new in ("q3_K", "q4_K"):
            new = "q5_K"
        if n_expert == 8:
            new = "q8_0"
        st.i_attention_wv += 1
    elif cat == "attn_k":
        if n_expert == 8:
            new = "q8_0"
    elif cat == "ffn_down":
        i, n = (t.layer if n_expert > 1 and t.layer is not None else st.i_ffn_down), st.n_layer
        if ftype == "q2_k":
            new = "q3_K"
        elif ftype == "q2_k_s":
            if i < n // 8:
                new = "q4_K"
        elif ftype == "q3_k_m":
            new = "q5_K" if i < n // 16 else ("q4_K" if not falcon or _use_more_bits(i, n) else "q3_K")
        elif ftype == "q3_k_l":
            new = "q4_K" if falcon else "q5_K"
        elif ftype == "q4_k_m":
            if falcon:
                new = "q6_K" if i < n // 16 else ("q5_K" if _use_more_bits(i, n) else "q4_K")
            elif _use_more_bits(i, n):
                new = "q6_K"
        elif i < n // 8 and ftype in ("iq4_nl", "iq4_xs"):
            new = "q5_K"
        elif ftype == "q5_k_m" and _use_more_bits(i, n):
            new = "q6_K"
        elif ftype == "q4_k_s" and not falcon and i < n // 8:
            new = "q5_K"
        st.i_ffn_down += 1
    elif cat == "attn_output":
        if not falcon:
            if n_expert == 8:
                if ftype in ("q2_k", "q3_k_s", "q3_k_m", "iq4_nl", "q4_k_s", "q4_k_m", "iq4_xs"):
                    new = "q5_K"
            elif ftype == "q2_k":
                new = "q3_K"
            elif ftype == "q3_k_m":
                new = "q4_K"
            elif ftype == "q3_k_l":
                new = "q5_K"
        elif ftype == "q3_k_l":
            new = "q4_K"
    elif cat == "attn_qkv":
        if ftype in ("q3_k_m", "q3_k_l"):
            new = "q4_K"
        elif ftype == "q4_k_m":
            new = "q5_K"
        elif ftype == "q5_k_m":
            new = "q6_K"
    return new


def quantized_tensors(spec: ModelSpec, quantization: str) -> list[GGUFTensor]:
    """The tensors of ``spec`` as a GGUF file of type ``quantization`` holds them (module docstring).

    Raises:
        InputError: an unknown file type.
    """
    ftype = file_type(quantization)
    default = FILE_TYPES[ftype]
    if not ggml_type(default).quantized:
        return source_tensors(spec, default if default != "f32" else "f32")
    tensors = source_tensors(spec, "f16")
    tied = not any(t.category == "output" for t in tensors)
    st = _State(n_attention_wv=sum(t.category in ("attn_v", "attn_qkv", "attn_kv_b") for t in tensors),
                n_layer=spec.num_layers)
    out = []
    for t in tensors:
        if not _quantizable(t):
            out.append(t)
            continue
        new = _fallback(t, _mixed_type(t, default, ftype, spec, st, tied))
        out.append(GGUFTensor(t.name, t.category, t.layer, t.shape, ggml_type(new)))
    return out


def type_counts(tensors: Iterable[GGUFTensor]) -> dict[str, int]:
    """Tensors per ggml type (what llama.cpp's loader logs as ``- type q4_K: 81 tensors``)."""
    out: dict[str, int] = {}
    for t in tensors:
        out[t.type.name] = out.get(t.type.name, 0) + 1
    return out
