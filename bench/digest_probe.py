"""Probe (issue 30 item 3): flip one byte at ~60 offsets of one fragment of a tiny store and say per offset
whether the fragment reads back the same, WRONG (silently, no error), or fails to decode. Slow on a loaded machine."""
import shutil
from pathlib import Path

import lance

from gfcr.store import RolloutStore
from gfcr.testing import make_rollout

base = Path("/tmp/dg/base")
shutil.rmtree(base, ignore_errors=True)
s = RolloutStore.open(base, create=True, auto_compact=0)
for b in range(3):
    s.append([make_rollout(b * 5 + i, step=b) for i in range(5)])
ds = s.dataset("rollouts")
fr = ds.get_fragments()[1]
rel = fr.metadata.files[0].path
f = base / "rollouts.lance" / "data" / rel
size = f.stat().st_size
print("size", size, "cols", ds.schema.names[:50])
ref = ds.scanner(fragments=[fr]).to_table()
res = {}
for off in range(0, size - 4, max(1, size // 60)):
    w = Path("/tmp/dg/w")
    shutil.rmtree(w, ignore_errors=True)
    shutil.copytree(base, w)
    g = w / "rollouts.lance" / "data" / rel
    b = bytearray(g.read_bytes())
    b[off] ^= 0x01
    g.write_bytes(bytes(b))
    try:
        d = lance.dataset(str(w / "rollouts.lance"))
        t = d.scanner(fragments=[d.get_fragment(fr.fragment_id)]).to_table()
        diff = [c for c in ref.column_names if not t.column(c).equals(ref.column(c))]
        res[off] = "WRONG " + ",".join(diff[:3]) if diff else "same"
    except BaseException as e:
        res[off] = "error " + type(e).__name__ + " " + str(e)[:80].replace("\n"," ")
for k, v in res.items():
    print(k, v)
