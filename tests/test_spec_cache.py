"""The on-disk cache of meta-device specs (memest.sources.spec_cache): exact round trips, the key, atomic
writes, the notices, the switches.

The conftest points MEMEST_CACHE_DIR at a folder of this run; each test here uses its own tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from memest.devices import get_device
from memest.estimate import estimate
from memest.sources import load_model, spec_cache, spec_from_config
from memest.sources.config import HFConfig
from memest.workload import Engine, ServingConfig, TrainingConfig
from memest.workload.config import ENGINES_SERVING

H100 = get_device("H100-80GB")
# specs of every part the format must carry: GQA + sliding windows, MLA + MoE + fp8 quantization, Mamba-2 and
# attention hybrids with states, short-conv states, towers (OTHER), buffers (GPT-BigCode's causal mask), T5's
# two stacks, BERT's encoder
ROUND_TRIP = ["google/gemma-3-27b-it", "deepseek-ai/DeepSeek-V3", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
              "Qwen/Qwen3-VL-30B-A3B-Instruct", "bigcode/octocoder", "google-t5/t5-small", "google-bert/bert-base-uncased",
              "mistralai/Voxtral-Mini-3B-2507", "openai/gpt-oss-20b"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMEST_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMEST_NO_CACHE", raising=False)
    return tmp_path / "specs"


def _summary(est):
    return [(r.kind, r.count, tuple(sorted(r.breakdown.items())) if hasattr(r, "breakdown") else None,
             getattr(r, "peak_allocated", None)) for r in est.ranks]


@pytest.mark.parametrize("model_id", ROUND_TRIP)
def test_encode_decode_round_trips_exactly(model_id: str) -> None:
    spec = load_model(model_id)
    data = json.loads(json.dumps(spec_cache.encode(spec)))  # through JSON text, as on disk
    back = spec_cache.decode(data).replace(name=spec.name, source=spec.source)
    assert back == spec
    assert back.layers == spec.layers and back.embedding == spec.embedding and back.head == spec.head
    # one object per distinct layer, as the adapters build them (estimators group layers by identity)
    assert len({id(layer) for layer in back.layers}) == len(spec.layer_kinds())
    # under an engine that serves the model_type (vLLM serves no T5: memest.workload.config.ENGINES_SERVING)
    s = ServingConfig(engine=min(ENGINES_SERVING.get(spec.model_type, {Engine.VLLM}), key=list(Engine).index))
    assert estimate(back, s, H100) == estimate(spec, s, H100)


def test_second_call_reads_the_file_and_says_nothing(cache) -> None:
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                    "intermediate_size": 96, "vocab_size": 97}, name="tiny", source="test")
    built = spec_from_config(cfg)
    calls: list[str] = []
    heard: list[str] = []

    def build():
        calls.append("built")
        return built

    first = spec_cache.cached_spec(cfg, build, trust_remote_code=False, notice=heard.append)
    assert calls == ["built"] and len(heard) == 1
    assert "building tiny on the meta device" in heard[0] and str(cache) in heard[0]
    files = list(cache.glob("*.json"))
    assert len(files) == 1 and not list(cache.glob("*.tmp"))
    # another reference to the same config: read back, under its own name and source
    other = HFConfig(dict(cfg.raw), name="elsewhere", source="/tmp/config.json")
    second = spec_cache.cached_spec(other, build, trust_remote_code=False, notice=heard.append)
    assert calls == ["built"] and len(heard) == 1
    assert second == first.replace(name="elsewhere", source="/tmp/config.json")
    w = TrainingConfig(seq_len=256)
    assert estimate(second, w, H100) == estimate(first.replace(name="elsewhere", source="/tmp/config.json"), w, H100)


def test_key_is_the_config_transformers_and_memest(cache, monkeypatch) -> None:
    raw = {"model_type": "llama", "hidden_size": 64}
    key = spec_cache.cache_key(raw, trust_remote_code=False, transformers="5.24.0")
    assert key == spec_cache.cache_key(dict(reversed(list(raw.items()))), trust_remote_code=False,
                                       transformers="5.24.0")  # key order does not matter
    assert key != spec_cache.cache_key({**raw, "hidden_size": 65}, trust_remote_code=False, transformers="5.24.0")
    assert key != spec_cache.cache_key(raw, trust_remote_code=False, transformers="5.25.0")
    assert key != spec_cache.cache_key(raw, trust_remote_code=True, transformers="5.24.0")
    import memest

    monkeypatch.setattr(memest, "__version__", "9.9.9")
    assert key != spec_cache.cache_key(raw, trust_remote_code=False, transformers="5.24.0")


def test_another_transformers_rebuilds(cache, monkeypatch, tiny) -> None:
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64}, name="t", source="test")
    calls: list[int] = []
    spec_cache.cached_spec(cfg, lambda: calls.append(1) or tiny, trust_remote_code=False)
    monkeypatch.setattr(spec_cache, "transformers_version", lambda: "99.0.0")
    spec_cache.cached_spec(cfg, lambda: calls.append(1) or tiny, trust_remote_code=False)
    assert calls == [1, 1] and len(list(cache.glob("*.json"))) == 2


def test_no_cache_switch_and_remote_code(cache, monkeypatch, tiny) -> None:
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64}, name="t", source="test")
    calls: list[int] = []
    heard: list[str] = []
    monkeypatch.setenv("MEMEST_NO_CACHE", "1")
    assert spec_cache.cache_dir() is None
    for _ in range(2):
        spec_cache.cached_spec(cfg, lambda: calls.append(1) or tiny, trust_remote_code=False, notice=heard.append)
    assert calls == [1, 1] and not cache.exists() and len(heard) == 2 and "once" not in heard[0]
    monkeypatch.setenv("MEMEST_NO_CACHE", "0")  # "0" keeps it on
    assert spec_cache.cache_dir() == cache
    remote = HFConfig({"model_type": "x", "auto_map": {"AutoModelForCausalLM": "m.X"}}, name="r", source="hub")
    for _ in range(2):
        spec_cache.cached_spec(remote, lambda: calls.append(1) or tiny, trust_remote_code=True)
    assert calls == [1, 1, 1, 1] and not cache.exists()  # remote code is never cached


def test_cache_dir_follows_xdg(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("MEMEST_CACHE_DIR", raising=False)
    monkeypatch.delenv("MEMEST_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert spec_cache.cache_dir() == tmp_path / "memest" / "specs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert spec_cache.cache_dir() == tmp_path / "home" / ".cache" / "memest" / "specs"


def test_a_broken_file_is_a_miss_and_is_rewritten(cache, tiny) -> None:
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64}, name="t", source="test")
    spec_cache.cached_spec(cfg, lambda: tiny, trust_remote_code=False)
    (path,) = cache.glob("*.json")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # a half-written file (a full disk, an old memest without os.replace)
    calls: list[int] = []
    again = spec_cache.cached_spec(cfg, lambda: calls.append(1) or tiny, trust_remote_code=False)
    assert calls == [1] and again == tiny and path.read_text() == text


def test_a_failed_write_leaves_nothing_behind(cache, monkeypatch, tiny) -> None:
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64}, name="t", source="test")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spec_cache.json, "dump", fail)
    heard: list[str] = []
    spec = spec_cache.cached_spec(cfg, lambda: tiny, trust_remote_code=False, notice=heard.append)
    assert spec == tiny
    assert list(cache.iterdir()) == []  # neither the file nor its temporary
    assert "could not keep the spec" in heard[-1] and "No space left on device" in heard[-1]


def test_concurrent_writers_leave_one_whole_file(cache, tiny) -> None:
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64}, name="t", source="test")
    results = []

    def run():
        results.append(spec_cache.cached_spec(cfg, lambda: tiny, trust_remote_code=False))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r.replace(name="tiny") == tiny for r in results)
    (path,) = cache.glob("*.json")
    assert not list(cache.glob("*.tmp"))
    assert spec_cache.decode(json.loads(path.read_text())).replace(name="tiny", source="test") == tiny


def test_context_notices_reach_the_installed_callback(tiny, cache) -> None:
    heard: list[str] = []
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64}, name="t", source="test")
    with spec_cache.notices(heard.append):
        spec_cache.cached_spec(cfg, lambda: tiny, trust_remote_code=False)
    spec_cache.notify("outside")  # no callback: nobody hears it
    assert len(heard) == 1 and heard[0].startswith("no analytic adapter for model_type 'llama'")


TINY_GPT_NEO = {"model_type": "gpt_neo", "architectures": ["GPTNeoForCausalLM"], "hidden_size": 64, "num_heads": 4,
                "num_layers": 2, "vocab_size": 97, "max_position_embeddings": 64, "window_size": 16,
                "attention_types": [[["global", "local"], 1]]}


@pytest.mark.slow
def test_meta_fallback_spec_and_estimate_equal_with_and_without_the_cache(cache, monkeypatch) -> None:
    """A family without an adapter (gpt_neo): built on the meta device with the cache off, then with it
    (built and stored), then read back without building (the builder replaced by one that fails)."""
    from memest.sources import meta

    cfg = HFConfig(TINY_GPT_NEO, name="neo", source="test")
    monkeypatch.setenv("MEMEST_NO_CACHE", "1")
    plain = spec_from_config(cfg)
    monkeypatch.delenv("MEMEST_NO_CACHE")
    heard: list[str] = []
    stored = spec_from_config(cfg, notice=heard.append)
    assert len(heard) == 1 and "gpt_neo" in heard[0]

    def no_build(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(meta, "spec_from_meta", no_build)
    read = spec_from_config(cfg, notice=heard.append)
    assert len(heard) == 1
    assert plain == stored == read
    for w in (ServingConfig(), TrainingConfig(seq_len=32)):
        assert estimate(read, w, H100) == estimate(plain, w, H100)


@pytest.mark.slow
def test_cli_says_on_stderr_once(tmp_path) -> None:
    """`memest hf` on a config without an adapter: the first run's stderr names the meta build, the
    second run's does not, and both print the same report."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GPT_NEO))
    env = {**os.environ, "MEMEST_CACHE_DIR": str(tmp_path / "cache"), "MEMEST_DEBUG": ""}
    env.pop("MEMEST_NO_CACHE", None)

    def run():
        return subprocess.run([sys.executable, "-m", "memest", "hf", str(path), "--serve", "--json"],
                              capture_output=True, text=True, env=env, timeout=300)

    first, second = run(), run()
    assert first.returncode == second.returncode == 0, first.stderr
    assert "on the meta device" in first.stderr and "once" in first.stderr
    assert "on the meta device" not in second.stderr
    assert json.loads(first.stdout) == json.loads(second.stdout)


@pytest.mark.parametrize("cache_on", [True, False], ids=["cache", "no-cache"])
def test_a_refused_build_says_nothing_of_building(cache, monkeypatch, tiny, cache_on) -> None:
    # the check runs before the notice: a config the build would refuse (remote code without
    # trust_remote_code) gets its error and no "building ... on the meta device" line; a stored spec
    # needs no check at all
    if not cache_on:
        monkeypatch.setenv("MEMEST_NO_CACHE", "1")
    cfg = HFConfig({"model_type": "llama", "hidden_size": 64}, name="t", source="test")
    heard: list[str] = []
    calls: list[int] = []

    class Refused(Exception):
        pass

    def refuse() -> None:
        raise Refused

    with pytest.raises(Refused):
        spec_cache.cached_spec(cfg, lambda: calls.append(1) or tiny, trust_remote_code=False, notice=heard.append,
                               check=refuse)
    assert heard == [] and calls == []
    spec_cache.cached_spec(cfg, lambda: calls.append(1) or tiny, trust_remote_code=False, notice=heard.append,
                           check=lambda: None)
    assert calls == [1] and len(heard) == 1
    if cache_on:  # read back: neither check nor notice
        spec_cache.cached_spec(cfg, lambda: calls.append(1) or tiny, trust_remote_code=False, notice=heard.append,
                               check=refuse)
        assert calls == [1] and len(heard) == 1


def test_remote_code_refusal_comes_before_the_notice(cache) -> None:
    # end to end through spec_from_config: a model_type transformers lacks, with auto_map, no trust_remote_code
    from memest.errors import UnsupportedArchitectureError

    pytest.importorskip("transformers")
    cfg = HFConfig({"model_type": "memest_remote_test", "auto_map": {"AutoModelForCausalLM": "m.X"}, "hidden_size": 64,
                    "num_attention_heads": 4, "num_hidden_layers": 2}, name="r", source="test")
    heard: list[str] = []
    with pytest.raises(UnsupportedArchitectureError, match="trust_remote_code"):
        spec_from_config(cfg, notice=heard.append)
    assert heard == []


def test_rwkv_state_round_trips() -> None:
    # StateSpec.shift_channels (RWKV's token shifts) survives the stored format
    cfg = HFConfig({"model_type": "rwkv6", "hidden_size": 64, "num_hidden_layers": 2, "head_size": 16,
                    "vocab_size": 97}, name="t", source="test")
    spec = spec_from_config(cfg)
    back = spec_cache.decode(json.loads(json.dumps(spec_cache.encode(spec)))).replace(name=spec.name,
                                                                                      source=spec.source)
    assert back == spec and back.layers[0].attention.state.shift_channels == 2 * 64
