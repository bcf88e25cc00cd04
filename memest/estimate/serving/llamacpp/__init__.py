"""llama.cpp and Ollama serving GGUF files (``--engine llama.cpp`` / ``--engine ollama``).

- :mod:`.ggml_types`: bytes per block of every ggml type (ggml ``type_traits``);
- :mod:`.quant`: which ggml type each tensor of a GGUF file type gets (llama-quant.cpp
  ``llama_tensor_get_type``), or the exact tensors of a ``.gguf`` header (:mod:`.gguf_file`);
- :mod:`.engine`: llama.cpp's buffers at start-up: model buffers per device after the ``-ngl`` /
  ``--tensor-split`` layer placement, the KV cache, the output and compute buffers;
- :mod:`.ollama`: Ollama's defaults and its own pre-load estimate (``llm/memory.go``);
- :mod:`.fit`: the search over quant type x context x offloaded layers.

Modelled at llama.cpp build b4715 (ggml-org/llama.cpp 3d68f034d, Feb 2025), the build of the CI logs
in ``engines.json``, and Ollama v0.11.6 (``llm/memory.go``, ``fs/ggml/ggml.go``).
"""
