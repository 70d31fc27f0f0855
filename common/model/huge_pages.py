"""Weights mapped in 2 MB pages: the advice that asks for them, and how much of a mapping has them.

A decode step reads its experts from all over a file of many GB. Mapped in 4 KB pages, that is a
TLB miss every 4 KB; in 2 MB pages (transparent huge pages of the page cache, on kernels and file
systems with large folios: ext4, xfs, tmpfs on recent Linux) one entry covers 512 times as much.
With MADV_HUGEPAGE given before the first read, readahead fills the mapping with 2 MB folios
where the kernel can; where it cannot, the advice is refused or ignored and nothing else changes.
"""
from __future__ import annotations

import mmap
import re

MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)   # linux/mman.h
HUGE_PAGE = 2 << 20


def advise_huge_pages(mm: mmap.mmap, start: int = 0, end: int | None = None) -> bool:
    """Ask for 2 MB pages over the whole 2 MB spans of [start, end) of this mapping; before the
    pages are first read, as readahead picks the folio size then. False when refused."""
    end = len(mm) if end is None else end
    lo, hi = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
    if hi <= lo:
        return False
    try:
        mm.madvise(MADV_HUGEPAGE, lo, hi - lo)
    except OSError:          # no THP in this kernel, or not for this kind of mapping
        return False
    return True


def huge_page_share(address: int, smaps: str = "/proc/self/smaps") -> float | None:
    """The share of the resident pages of the mapping holding `address` that are mapped by 2 MB
    entries (FilePmdMapped, or AnonHugePages for anonymous memory); None where /proc says nothing."""
    try:
        text = open(smaps).read()
    except OSError:
        return None
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
        if lo <= address < hi:
            fields = dict(re.findall(r"^(\w+):\s+(\d+) kB", block, re.M))
            rss = int(fields.get("Rss", 0))
            huge = int(fields.get("FilePmdMapped", 0)) + int(fields.get("AnonHugePages", 0))
            return huge / rss if rss else 0.0
    return None
