"""The 2 MB page advice on weight mappings and the share that /proc reports."""
import mmap

import numpy as np

from common.model.huge_pages import HUGE_PAGE, advise_huge_pages, huge_page_share

SMAPS = """\
7f0000000000-7f0000400000 r--s 00000000 fd:01 123 /models/a.gguf
Size:               4096 kB
Rss:                4096 kB
FilePmdMapped:      2048 kB
AnonHugePages:         0 kB
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
Size:               2048 kB
Rss:                   0 kB
AnonHugePages:         0 kB
"""


def test_share_is_that_of_the_mapping_holding_the_address(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert huge_page_share(0x7F0000000000 + 12345, str(smaps)) == 0.5
    assert huge_page_share(0x7F0000400000, str(smaps)) == 0.0     # nothing resident
    assert huge_page_share(0x1000, str(smaps)) is None             # in no mapping
    assert huge_page_share(0x1000, str(tmp_path / "missing")) is None


def test_advice_covers_only_whole_huge_pages(tmp_path):
    small, large = tmp_path / "small.bin", tmp_path / "large.bin"
    small.write_bytes(b"\1" * (HUGE_PAGE - 4096))
    large.write_bytes(b"\1" * (2 * HUGE_PAGE + 4096))
    with open(small, "rb") as f:
        assert not advise_huge_pages(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    with open(large, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        assert not advise_huge_pages(mm, 1, HUGE_PAGE + 1)          # holds no whole 2 MB span
        advise_huge_pages(mm)                                       # True where the kernel has THP
        data = np.frombuffer(mm, np.uint8)
        assert int(data.sum()) == len(data)                         # the mapping still reads
        share = huge_page_share(data.ctypes.data)
        assert share is None or 0.0 <= share <= 1.0
        del data
        mm.close()
