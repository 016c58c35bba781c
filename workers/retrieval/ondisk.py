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
_GROWING = "lists.growing.ivfdata"


def move_lists_to_disk(index: faiss.Index, folder: Path) -> None:
    """Replace ``index``'s inverted lists by the same lists on disk under ``folder``."""
    _replace_by_compact_copy(index, folder)


def stream_lists_to_disk(index: faiss.Index, folder: Path) -> None:
    """Give an empty, trained ``index`` inverted lists on disk under ``folder``: what is added to
    it then goes to disk as it comes, for a corpus whose lists do not fit in memory. Call
    :func:`finish_streamed_lists` once every vector is in."""
    ivf = faiss.extract_index_ivf(index)
    if ivf.ntotal:
        raise ValueError("stream_lists_to_disk needs an empty index")
    growing = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(folder / _GROWING))
    ivf.replace_invlists(growing, True)
    growing.this.disown()  # the index frees it


def finish_streamed_lists(index: faiss.Index, folder: Path) -> None:
    """The streamed lists copied once more, packed: while growing, each list and the file
    double their room as they fill, so up to about half the growing file is slack."""
    _replace_by_compact_copy(index, folder)
    (folder / _GROWING).unlink()


def _replace_by_compact_copy(index: faiss.Index, folder: Path) -> None:
    ivf = faiss.extract_index_ivf(index)
    on_disk = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(folder / LISTS))
    source = faiss.InvertedListsPtrVector()
    source.push_back(ivf.invlists)
    on_disk.merge_from_multiple(source.data(), source.size())
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
