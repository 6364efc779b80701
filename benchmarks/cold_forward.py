"""First forward from a cold page cache: how long the engine takes to read
the weights it needs when the model file is not cached (Linux; drops the
file's pages with posix_fadvise, so it needs no root).

    python benchmarks/cold_forward.py models/bench-olmoe-q80
"""

import json
import os
import sys
import time
from pathlib import Path

from colibri_build import Engine


def main() -> None:
    model = Path(sys.argv[1])
    weights = model / json.loads((model / "model-config.json").read_text())["weights"]["file"]
    fd = os.open(weights, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    engine = Engine(model, threads=2)
    t1 = time.perf_counter()
    engine.forward(list(range(1, 17)))
    t2 = time.perf_counter()
    engine.forward(list(range(1, 17)))
    t3 = time.perf_counter()
    print(f"open {1e3 * (t1 - t0):.1f} ms, first 16-token forward (cold) {1e3 * (t2 - t1):.0f} ms, "
          f"second (warm) {1e3 * (t3 - t2):.0f} ms")


if __name__ == "__main__":
    main()
