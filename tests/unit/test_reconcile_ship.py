"""What reconcile_main ships to executors on other machines is all a Spark task imports: the
decode step (segment_reader on TLE1 and TLE2 segments, through codec's lazy re-export of
codec_batch) runs from the zip alone, in an interpreter that cannot see the repository."""

from __future__ import annotations

import json
import subprocess
import sys

from spark_jobs import craft
from spark_jobs.reconcile_main import code_zip

TASK = """
import json, sys
sys.path.insert(0, sys.argv[1])
from spark_jobs.segment_reader import read_columns
import spark_jobs.reconcile, spark_jobs.inputs, spark_jobs.warehouse, broker.store.logreader
out = {}
for fmt, path in json.loads(sys.argv[2]).items():
    cols = read_columns(open(path, "rb").read(), 0)
    out[fmt] = [len(cols["kind"]), all(cols["crc_ok"]), sorted(set(cols["batch_pos"]))]
out["from"] = sorted({m.__file__.split(".zip")[0] + ".zip" for n, m in list(sys.modules.items())
                      if n.split(".")[0] in ("broker", "spark_jobs")})
print(json.dumps(out))
"""


def test_a_task_decodes_both_formats_from_the_shipped_zip_alone(tmp_path):
    z = code_zip(tmp_path)
    segs = {}
    for fmt in craft.FORMATS:
        (seg,) = craft.encode_log(craft.log(20), 1 << 16, fmt)
        segs[fmt] = str(tmp_path / f"seg{fmt}")
        (tmp_path / f"seg{fmt}").write_bytes(seg[1])
    # -I: no cwd, no PYTHONPATH; -S: no site-packages (where the editable install points at the repo)
    p = subprocess.run([sys.executable, "-I", "-S", "-c", TASK, str(z), json.dumps(segs)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["from"] == [str(z)]
    assert out["1"] == [20, True, [0]]
    assert out["2"] == [sum(e.records(2) for e in craft.log(20)), True, list(range(craft.BATCH_RECORDS_MAX))]
