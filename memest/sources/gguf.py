"""The tensors of a ``.gguf`` file's header (setting ``gguf``): names, ggml types and shapes, no weights read.

Through the ``gguf`` package (llama.cpp's ``gguf-py``; ``pip install memest[gguf]``): ``GGUFReader``
memory-maps the file and parses the header's tensor infos; the tensor data is never touched.
"""

from __future__ import annotations

from pathlib import Path

from memest.errors import InputError


def read_tensors(path: str | Path) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """(name, ggml type name, shape rows first) of every tensor in the file's header.

    Raises:
        InputError: the gguf package is missing, the file does not exist or is not a GGUF file, or a
            tensor has a type memest does not know.
    """
    from memest.sources.ggml_types import BY_ID

    p = Path(path)
    if not p.is_file():
        raise InputError(f"{{gguf}} {str(path)!r} is not a file; give the path of a .gguf file", field="gguf")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise InputError("{gguf} needs the gguf package: pip install 'memest[gguf]'", field="gguf") from None
    try:
        reader = GGUFReader(str(p), "r")
    except (ValueError, OSError) as exc:
        raise InputError(f"{{gguf}} {str(path)!r} is not a readable GGUF file ({exc})", field="gguf") from None
    out = []
    for t in reader.tensors:
        kind = BY_ID.get(int(t.tensor_type))
        if kind is None:
            raise InputError(f"{{gguf}} {p.name}: tensor {t.name} has ggml type {t.tensor_type!r}, which memest does "
                             "not size; known: " + ", ".join(x.name for x in BY_ID.values()), field="gguf")
        shape = tuple(int(n) for n in reversed([int(x) for x in t.shape]))
        out.append((str(t.name), kind.name, shape))
    return tuple(out)
