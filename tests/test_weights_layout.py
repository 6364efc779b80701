"""The weights file layout: each expert's tensors in one page-aligned block,
and experts that are never routed to are never read from disk."""

import ctypes
import mmap
import os

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.synth import synth
from colibri_build.weights import PAGE, read_header


@pytest.fixture(scope="module")
def many_experts(tmp_path_factory):
    return synth("olmoe", "tiny", tmp_path_factory.mktemp("m") / "e64", seed=5,
                 overrides={"experts": 64, "top_k": 2, "expert_ffn_size": 256})


def expert_blocks(path):
    tensors = read_header(path)["tensors"]
    blocks = {}
    for name, t in tensors.items():
        if ".expert." in name:
            layer, expert = int(name.split(".")[1]), int(name.split(".")[3])
            begin, end = blocks.get((layer, expert), (t.offset, t.offset))
            blocks[(layer, expert)] = (min(begin, t.offset), max(end, t.offset + t.nbytes))
    return tensors, blocks


def test_each_expert_is_one_page_aligned_block(many_experts):
    tensors, blocks = expert_blocks(many_experts / "weights.cbw")
    for (layer, expert), (begin, end) in blocks.items():
        assert begin % PAGE == 0
        parts = [tensors[f"blk.{layer}.expert.{expert}.{r}"] for r in ("gate", "up", "down")]
        assert parts[0].offset == begin and parts[2].offset + parts[2].nbytes == end
        assert sum(p.nbytes for p in parts) <= end - begin < sum(p.nbytes for p in parts) + 3 * 64


def page_residency(path) -> np.ndarray:
    """1 for each page of path that is in the page cache (mincore(2))."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)  # writable view, shares the cache
        try:
            vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
            anchor = ctypes.c_char.from_buffer(mm)
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
            del anchor
            assert rc == 0, os.strerror(ctypes.get_errno())
            return np.frombuffer(vec, np.uint8) & 1
        finally:
            mm.close()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise and mincore (Linux)")
def test_unrouted_experts_are_never_read(many_experts):
    path = many_experts / "weights.cbw"
    with open(path, "rb") as fh:  # drop the file from the page cache
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    engine = Engine(many_experts, threads=1)
    engine.forward([1, 2, 3])
    used = {(layer, int(e)) for layer in range(engine.dims["layers"]) for e in np.unique(engine.last_routing[:, layer])}
    _, blocks = expert_blocks(path)
    size = path.stat().st_size
    resident = page_residency(path)
    def pages(keys):
        return sum(int(resident[b // PAGE:(e + PAGE - 1) // PAGE].sum()) for k, (b, e) in blocks.items() if k in keys)
    unused_pages = pages(set(blocks) - used)
    used_pages = pages(used)
    assert len(used) < len(blocks) // 4
    assert used_pages > 0
    assert unused_pages == 0, f"{unused_pages} pages of unrouted experts were read"
