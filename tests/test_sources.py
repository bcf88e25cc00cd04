"""Model references: catalog ids and aliases, local folders and files, Meta params.json, errors."""

import json

import pytest

from memest.errors import ConfigError, UnknownModelError
from memest.sources import catalog, load_config, load_model


@pytest.mark.parametrize(("reference", "expected"), [
    ("meta-llama/Llama-2-70b", "meta-llama/Llama-2-70b-hf"),
    ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-hf"),
    ("Llama-2-70b-HF", "meta-llama/Llama-2-70b-hf"),
    ("Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("gpt2", "openai-community/gpt2"),
    ("openai-community/gpt2", "openai-community/gpt2"),
])
def test_aliases_name_the_same_catalog_entry(reference, expected):
    hit = catalog.resolve(reference)
    assert hit is not None and hit.model_id == expected and hit.note == ""


def test_variant_uses_base_config_with_overrides_and_says_so():
    cfg = load_config("Qwen/Qwen2.5-7B-Instruct")
    assert cfg.name == "Qwen/Qwen2.5-7B-Instruct"
    # the Instruct config.json states a 32,768-token context; the base states 131,072
    assert cfg.raw["max_position_embeddings"] == 32768
    assert "Qwen/Qwen2.5-7B" in cfg.note


def test_every_packaged_config_is_listed_in_sources():
    sources = (catalog.CATALOG_DIR / "SOURCES.md").read_text()
    for model_id in catalog.entries():
        assert f"| {model_id} |" in sources, model_id


def test_unknown_model_offline_names_close_matches():
    with pytest.raises(UnknownModelError, match=r"unknown model 'meta-llama/Llama-2-7b-hff'.*Llama-2-7b-hf"):
        load_config("meta-llama/Llama-2-7b-hff")


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(UnknownModelError, match="no such file or directory"):
        load_config(str(tmp_path / "nope" / "config.json"))


def _llama_config(**changes):
    cfg = json.loads((catalog.CATALOG_DIR / "meta-llama/Llama-2-7b-hf/config.json").read_text())
    cfg.update(changes)
    return cfg


def test_local_folder_and_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_llama_config()))
    by_dir = load_model(str(tmp_path))
    by_file = load_model(str(tmp_path / "config.json"))
    assert by_dir.num_params == by_file.num_params == 6_738_415_616


def test_nested_text_config(tmp_path):
    # a multimodal wrapper around a llama language model: only the text model is counted, with a note
    wrapper = {"model_type": "some_vlm", "architectures": ["SomeVLM"], "text_config": _llama_config()}
    (tmp_path / "config.json").write_text(json.dumps(wrapper))
    spec = load_model(str(tmp_path))
    assert spec.num_params == 6_738_415_616
    assert any("language model" in n for n in spec.notes)


def test_meta_params_json(tmp_path):
    # Llama-2-7B's params.json as Meta publishes it (vocab_size -1 replaced by the tokenizer's 32000).
    # FFN width: int(2 * 4 * 4096 / 3) = 10922 -> rounded up to a multiple of 256 = 11008.
    params = {"dim": 4096, "multiple_of": 256, "n_heads": 32, "n_layers": 32, "norm_eps": 1e-05, "vocab_size": 32000}
    (tmp_path / "params.json").write_text(json.dumps(params))
    spec = load_model(str(tmp_path))
    assert spec.intermediate_size == 11008
    assert spec.num_params == 6_738_415_616


def test_meta_params_json_llama3_ffn(tmp_path):
    # Llama-3-8B params.json: ffn = int(1.3 * int(2*4*4096/3)) = int(1.3 * 10922) = 14198 -> multiple of 1024 -> 14336
    params = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256, "multiple_of": 1024,
              "ffn_dim_multiplier": 1.3, "norm_eps": 1e-05, "rope_theta": 500000.0}
    (tmp_path / "params.json").write_text(json.dumps(params))
    spec = load_model(str(tmp_path))
    assert spec.intermediate_size == 14336
    assert spec.num_params == 8_030_261_248


def test_params_json_without_vocab_is_a_clear_error(tmp_path):
    (tmp_path / "params.json").write_text(json.dumps({"dim": 4096, "n_layers": 32, "n_heads": 32, "vocab_size": -1}))
    with pytest.raises(ConfigError, match="vocab_size -1"):
        load_model(str(tmp_path))


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not an object"),
])
def test_malformed_config(tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_model(str(tmp_path))


@pytest.mark.parametrize(("drop", "field"), [("num_hidden_layers", "num_hidden_layers"), ("model_type", "model_type")])
def test_incomplete_config(tmp_path, drop, field):
    cfg = _llama_config()
    del cfg[drop]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=field):
        load_model(str(tmp_path))


def test_non_integer_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_llama_config(hidden_size="big")))
    with pytest.raises(ConfigError, match="'hidden_size' is 'big'"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("url", ["https://huggingface.co/meta-llama/Llama-2-70b-hf",
                                 "https://huggingface.co/meta-llama/Llama-2-70b-hf/tree/main",
                                 "huggingface.co/meta-llama/Llama-2-70b-hf/"])
def test_model_page_urls_name_the_model(url):
    from memest.sources import load_model

    assert load_model(url).name == "meta-llama/Llama-2-70b-hf"
