import struct

import pytest

from broker.store.record_file import RecordFile

REC = struct.Struct(">QI")


def recs(a, b):
    return b"".join(REC.pack(i + 1, 7) for i in range(a, b))


def test_append_read_reopen_across_files_with_held_records(tmp_path):
    rf = RecordFile(tmp_path, REC.size, 10)
    rf.append(recs(0, 25))
    assert rf.count == 25 and rf.read(3, 4) == recs(3, 7) and rf.read(20, 100) == recs(20, 25)
    rf.flush_tail()
    rf.append(recs(25, 27))  # held in memory
    assert rf.read(23, 10) == recs(23, 27)
    rf.close()
    rf = RecordFile(tmp_path, REC.size, 10)
    rf.load()
    assert (rf.first, rf.count) == (0, 27) and rf.read(0, 27) == recs(0, 27)


def test_overwrite_and_truncate_in_memory_and_on_disk(tmp_path):
    rf = RecordFile(tmp_path, REC.size, 10)
    rf.append(recs(0, 15))
    rf.flush_tail()
    rf.append(recs(15, 18))
    rf.truncate(16)  # cuts held records only
    assert rf.count == 16 and rf.read(14, 10) == recs(14, 16)
    rf.write_at(5, recs(100, 102))  # an overwrite goes to disk (held records first)
    assert rf.read(4, 4) == recs(4, 5) + recs(100, 102) + recs(7, 8)
    rf.truncate(12)
    assert rf.count == 12 and rf.read(11, 5) == recs(11, 12)
    rf.close()
    rf = RecordFile(tmp_path, REC.size, 10)
    rf.load()
    assert rf.count == 12
    with pytest.raises(ValueError, match="gap"):
        rf.write_at(14, recs(0, 1))


def test_reset_starts_mid_file(tmp_path):
    rf = RecordFile(tmp_path, REC.size, 10)
    rf.reset(37)
    rf.append(recs(37, 45))
    rf.close()
    rf = RecordFile(tmp_path, REC.size, 10)
    rf.load()
    assert (rf.first, rf.count) == (37, 45) and rf.read(37, 2) == recs(37, 39)
