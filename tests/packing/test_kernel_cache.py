"""packer.packing.kernel_cache: cached kernels compiled from other planner sources are dropped, others kept."""

from __future__ import annotations

from packer.packing import kernel_cache, kernels  # noqa: F401  (importing kernels runs the guard)


def test_numba_cache_folder_carries_the_sources_digest():
    folder = kernel_cache.cache_dir()
    assert folder is not None and (folder / kernel_cache.STAMP).read_text() == kernel_cache.sources_digest()


def test_a_stale_stamp_drops_the_package_kernels_only(tmp_path):
    (tmp_path / kernel_cache.STAMP).write_text("compiled from older sources")
    stale = [tmp_path / "bulk_budgets._bfd_budgeted-250.py311.nbi", tmp_path / "kernels.ix_find-324.py311.1.nbc"]
    kept = [tmp_path / "gather.copy_ranges-10.py311.nbi", tmp_path / "kernels.notes.txt"]
    for path in stale + kept:
        path.write_bytes(b"x")
    assert kernel_cache.drop_stale_kernels(tmp_path)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert (tmp_path / kernel_cache.STAMP).read_text() == kernel_cache.sources_digest()
    stale[0].write_bytes(b"x")  # compiled again from these sources: kept from now on
    assert not kernel_cache.drop_stale_kernels(tmp_path) and stale[0].exists()
