"""IVF-PQ whose inverted lists and refine codes stay on disk (``--index-type ivfpq-disk``).

The lists go to ``lists.ivfdata`` (faiss' OnDiskInvertedLists, memory-mapped) with their table of
offsets in ``lists.meta``; ``index.faiss`` keeps the coarse quantizer and the refine stage, whose
codes are memory-mapped when read. Resident memory is then the centroids and whatever pages the
searches touch, which the kernel can drop again: a corpus larger than RAM is served from the
page cache. The lists are written in the version's staging folder and found again beside
``lists.meta`` when read, so a version folder can be renamed or mounted elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import faiss

LISTS = "lists.ivfdata"
LISTS_META = "lists.meta"


def move_lists_to_disk(index: faiss.Index, folder: Path) -> None:
    """Replace ``index``'s inverted lists by the same lists on disk under ``folder``."""
    ivf = faiss.extract_index_ivf(index)
    on_disk = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(folder / LISTS))
    in_memory = faiss.InvertedListsPtrVector()
    in_memory.push_back(ivf.invlists)
    on_disk.merge_from_multiple(in_memory.data(), in_memory.size())
    writer = faiss.FileIOWriter(str(folder / LISTS_META))
    faiss.write_InvertedLists(on_disk, writer)
    del writer  # flushed and closed
    ivf.replace_invlists(on_disk, True)
    on_disk.this.disown()  # the index frees it


def read(folder: Path) -> faiss.Index:
    """The index saved in ``folder``, its refine codes and inverted lists memory-mapped."""
    flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_SKIP_IVF_DATA
    index = faiss.read_index(str(folder / "index.faiss"), flags)
    reader = faiss.FileIOReader(str(folder / LISTS_META))
    lists = faiss.read_InvertedLists(reader, faiss.IO_FLAG_ONDISK_SAME_DIR)
    del reader
    faiss.extract_index_ivf(index).replace_invlists(lists, True)
    lists.this.disown()
    return index
