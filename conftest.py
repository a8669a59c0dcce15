"""pytest glue shared by tests/ and the nbval run over nbs/.

GPU cells: a notebook cell tagged `gpu` is skipped (and counted as skipped) unless
`coreinv.runtime.has_gpu()` is true. The book build applies the same rule in `_ext/coreinv_book.py`.
"""
import pytest

from coreinv.presets import GPU_TAG


def gpu_skip_marker(item, gpu_available: bool):
    "The skip marker for an nbval cell tagged `gpu` when no GPU is available, else None."
    cell = getattr(item, "cell", None)
    if cell is None or gpu_available:
        return None
    if GPU_TAG in cell.get("metadata", {}).get("tags", []):
        return pytest.mark.skip(reason="needs a GPU (cell tagged 'gpu')")
    return None


def pytest_collection_modifyitems(config, items):
    if not any(hasattr(i, "cell") for i in items):
        return
    from coreinv.runtime import has_gpu
    gpu = has_gpu()
    for item in items:
        marker = gpu_skip_marker(item, gpu)
        if marker is not None:
            item.add_marker(marker)
