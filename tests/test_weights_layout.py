"""The weights file layout: each expert's tensors in one page-aligned block
(2 MiB-aligned where blocks are large), and experts that are never routed to
are never read from disk, in 4 KiB or in 2 MiB pages."""

import ctypes
import mmap
import os

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.synth import synth
from colibri_build.errors import ModelError
from colibri_build.weights import (HUGE_PAGE, PAGE, drop_from_page_cache, huge_mapped_bytes, read_header,
                                   warm_page_cache)


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


@pytest.fixture(scope="module")
def large_experts(tmp_path_factory):
    """1.5 MiB expert blocks (f32, 512 x 256 x 3): laid out for 2 MiB pages."""
    return synth("olmoe", "tiny", tmp_path_factory.mktemp("m") / "large", seed=6,
                 overrides={"hidden_size": 256, "heads": 4, "kv_heads": 4, "experts": 16, "top_k": 2,
                            "expert_ffn_size": 512})


def test_large_expert_blocks_own_whole_2_mib_pages_and_the_gaps_are_holes(large_experts):
    path = large_experts / "weights.cbw"
    assert read_header(path)["alignment"] == HUGE_PAGE
    _, blocks = expert_blocks(path)
    spans = sorted(blocks.values())
    for (begin, end), (next_begin, _) in zip(spans, spans[1:] + [(path.stat().st_size, 0)]):
        assert begin % HUGE_PAGE == 0 and next_begin == (end + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    data = sum(end - begin for begin, end in spans)
    gaps = sum(-(end - begin) % HUGE_PAGE for begin, end in spans)
    assert gaps > 10 * PAGE  # 0.5 MiB a block
    assert os.stat(path).st_blocks * 512 < path.stat().st_size - gaps // 2, "the padding takes disk space"
    assert data + spans[0][0] <= path.stat().st_size


def evict(path):
    with open(path, "rb") as fh:
        drop_from_page_cache(fh)


def file_pages_map_huge(folder) -> bool:
    """Whether this kernel and file system put a file read through a
    MADV_HUGEPAGE mapping in 2 MiB pages (large folios in the page cache)."""
    probe = folder / "probe.bin"
    probe.write_bytes(os.urandom(4 * HUGE_PAGE))
    evict(probe)
    with open(probe, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
            sum(mm[i] for i in range(0, len(mm), PAGE))
            return huge_mapped_bytes(probe) > 0
        finally:
            mm.close()
            probe.unlink()


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"),
                    reason="needs MADV_HUGEPAGE and /proc (Linux)")
def test_large_experts_are_mapped_in_2_mib_pages(large_experts):
    if not file_pages_map_huge(large_experts):
        pytest.skip("this kernel or file system keeps file pages at 4 KiB")
    path = large_experts / "weights.cbw"
    evict(path)
    engine = Engine(large_experts, threads=1)
    engine.forward([1, 2, 3])
    assert huge_mapped_bytes(path) >= HUGE_PAGE


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"),
                    reason="needs MADV_HUGEPAGE and /proc (Linux)")
def test_warm_puts_a_copied_file_in_2_mib_pages(large_experts, tmp_path):
    """A copy's page cache is in small pages (written so, read back without
    MADV_HUGEPAGE); colibri-build warm drops them and reads it back huge."""
    if not file_pages_map_huge(large_experts):
        pytest.skip("this kernel or file system keeps file pages at 4 KiB")
    copy = tmp_path / "weights.cbw"
    with open(large_experts / "weights.cbw", "rb") as src, open(copy, "wb") as dst:
        while chunk := src.read(PAGE):
            dst.write(chunk)
    with open(copy, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            view = np.frombuffer(mm, dtype=np.uint8)
            view[::PAGE].sum()
            del view
            before = huge_mapped_bytes(copy)
        finally:
            mm.close()
    got = warm_page_cache(copy)
    assert got["bytes"] == copy.stat().st_size
    assert got["huge_bytes"] >= copy.stat().st_size // 2 > before, (before, got)


def test_warm_names_a_missing_file(tmp_path):
    with pytest.raises(ModelError, match="cannot open"):
        warm_page_cache(tmp_path / "missing.cbw")


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise and mincore (Linux)")
@pytest.mark.parametrize("model", ["many_experts", "large_experts"])
def test_unrouted_experts_are_never_read(model, request):
    folder = request.getfixturevalue(model)
    path = folder / "weights.cbw"
    evict(path)
    engine = Engine(folder, threads=1)
    engine.forward([1, 2, 3])
    used = {(layer, int(e)) for layer in range(engine.dims["layers"]) for e in np.unique(engine.last_routing[:, layer])}
    _, blocks = expert_blocks(path)
    size = path.stat().st_size
    resident = page_residency(path)
    def pages(keys):
        return sum(int(resident[b // PAGE:(e + PAGE - 1) // PAGE].sum()) for k, (b, e) in blocks.items() if k in keys)
    unused_pages = pages(set(blocks) - used)
    used_pages = pages(used)
    assert len(used) < len(blocks) * 3 // 4
    assert used_pages > 0
    assert unused_pages == 0, f"{unused_pages} pages of unrouted experts were read"
