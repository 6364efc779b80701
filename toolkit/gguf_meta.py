"""The key/value metadata of a GGUF file (versions 2 and 3), read directly:
the `gguf` package's reader builds a NumPy view per array element and takes
seconds on a 150k-token vocabulary; this takes a fraction of one. Tensors
are not read."""

from __future__ import annotations

import struct
from pathlib import Path

from .errors import ModelError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


def read_gguf_metadata(path: Path) -> dict:
    data = Path(path).read_bytes()
    try:
        if data[:4] != b"GGUF":
            raise ValueError("bad magic")
        version, _, n_kv = struct.unpack_from("<IQQ", data, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}; expected 2 or 3")
        pos = 24
        out = {}

        def string(pos):
            (n,) = struct.unpack_from("<Q", data, pos)
            end = pos + 8 + n
            if end > len(data):
                raise ValueError("string past the end of the file")
            return data[pos + 8:end].decode("utf-8"), end

        def value(kind, pos):
            if kind == STRING:
                return string(pos)
            if kind == ARRAY:
                elem, n = struct.unpack_from("<IQ", data, pos)
                pos += 12
                if elem in _SCALARS:
                    fmt = _SCALARS[elem]
                    size = struct.calcsize(fmt)
                    items = list(struct.unpack_from(f"<{n}{fmt[1]}", data, pos))
                    return items, pos + n * size
                items = []
                for _ in range(n):
                    item, pos = value(elem, pos)
                    items.append(item)
                return items, pos
            fmt = _SCALARS.get(kind)
            if fmt is None:
                raise ValueError(f"unknown value type {kind}")
            return struct.unpack_from(fmt, data, pos)[0], pos + struct.calcsize(fmt)

        for _ in range(n_kv):
            key, pos = string(pos)
            (kind,) = struct.unpack_from("<I", data, pos)
            out[key], pos = value(kind, pos + 4)
        return out
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: not a readable GGUF file: {exc}") from None
