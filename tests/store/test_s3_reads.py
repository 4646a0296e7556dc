"""Random-row reads on object storage (gfcr.store.readcache, gfcr.store.reads.take_planned), on a
loopback S3 server that records every request it answers (gfcr.testing.S3Server).

The request counts are behaviour: a data file read whole is one GET, a cached file is fetched once
and then costs no request, and a file is fetched only when the range reads it served have cost its
size. Every read mode returns the rows a local store with the same commits returns for the same seed.
"""

import pytest
from tests.store.conftest import s3_uri

from gfcr.store import RolloutStore
from gfcr.store.readcache import ReadCache, plan_reads
from gfcr.testing import make_rollout

MIB = 1 << 20


def _fill(where, fragments=4, per=40, n_gen=300, **kw):
    """A store of ``fragments`` commits of ``per`` rollouts (``n_gen`` generated tokens; step = commit
    index; no automatic compaction: one fragment, one data file per commit)."""
    s = RolloutStore.open(where, create=True, auto_compact=0, **kw)
    for b in range(fragments):
        s.append([make_rollout(b * per + i, step=b, n_gen=n_gen, seed=b, rollout_id=f"b{b}-{i}") for i in range(per)])
    return s


def _data_gets(srv, uri, since=0):
    """The GETs of the data files of ``uri``'s rollouts table answered since the ``since``-th request
    (``srv.log``): a list of their response sizes."""
    srv.count()  # (waits for requests being answered)
    part = uri.split("://", 1)[1].split("/", 1)[1] + "/rollouts.lance/data/"
    return [b for m, p, b in srv.log[since:] if m == "GET" and part in p]


def _file_sizes(store):
    return {f.fragment_id: f.metadata.files[0].file_size_bytes for f in store.dataset("rollouts").get_fragments()}


def test_plan_reads_follows_the_cost_model():
    """Whole when the file costs no more than its rows' requests (m × B); from the cache when cached or
    when the rent paid so far plus this take's reaches the size; ranges otherwise."""
    sizes, rows = {1: 15_000_000, 2: 15_000_000, 3: None, 4: 90 * MIB}, {1: 50, 2: 5, 3: 50, 4: 50}
    assert plan_reads(sizes, rows, 2 * MIB) == {1: "whole", 2: "rows", 3: "rows", 4: "rows"}  # 4: over WHOLE_FILE_MAX
    assert plan_reads(sizes, rows, 2 * MIB, whole_max=100 * MIB)[4] == "whole"
    cache = dict(rent={2: 4_600_000}, cache_bytes=1 << 30)
    assert plan_reads(sizes, rows, 2 * MIB, **cache) == {1: "local", 2: "local", 3: "rows", 4: "local"}
    assert plan_reads(sizes, rows, 2 * MIB, rent={2: 4_000_000}, cache_bytes=1 << 30)[2] == "rows"
    assert plan_reads(sizes, rows, 2 * MIB, cached={2, 3}) == {1: "whole", 2: "local", 3: "local", 4: "rows"}
    assert plan_reads(sizes, rows, 2 * MIB, cacheable={2}, **cache)[1] == "whole"  # (not cacheable)
    assert plan_reads(sizes, rows, 2 * MIB, rent={}, cache_bytes=10_000_000)[1] == "whole"  # larger than the cache


def test_every_read_mode_returns_the_local_stores_rows(s3_counted_env, tmp_path):
    """sample (with and without ``where``) and get, with a deletion and in a checkout, read by ranges, whole
    files, or the read cache (one too small for the table: it evicts), return what a local store with the
    same commits returns for the same seed, and what a full scan holds."""
    local, uri = _fill(tmp_path / "local"), s3_uri("modes")
    _fill(uri)
    for s in (local, RolloutStore.open(uri)):
        s.dataset("rollouts").delete("rollout_id = 'b1-3'")
    v = local.version

    def reads(s):
        ids = ["b3-7", "b0-0", "b2-5", "b3-7"]
        return [[r["rollout_id"] for r in t.to_pylist()] for t in (
            s.sample(30, seed=1), s.sample(30, seed=2, columns=["rollout_id", "reward"]),
            s.sample(7, where="step >= 2", seed=3), s.get(ids), s.checkout(v).sample(12, seed=4), s.sample(500, seed=5))]

    want = reads(local)
    assert "b1-3" not in want[5] and len(want[5]) == 159 and want[3] == ["b3-7", "b0-0", "b2-5", "b3-7"]
    size = max(_file_sizes(local).values())
    modes = {"rows": dict(request_bytes=1), "whole": dict(request_bytes=1 << 30),
             "cache": dict(read_cache=ReadCache(tmp_path / "c1", 1 << 30)),
             "small cache": dict(read_cache=ReadCache(tmp_path / "c2", 2 * size))}
    scan = {r["rollout_id"]: r for r in RolloutStore.open(uri).scan().to_pylist()}
    for name, kw in modes.items():
        s = RolloutStore.open(uri, **kw)
        assert reads(s) == want, name
        assert all(r == scan[r["rollout_id"]] for r in s.sample(40, seed=9).to_pylist() + s.get(["b2-2"]).to_pylist())
    held = sum(p.stat().st_size for p in (tmp_path / "c2").rglob("*") if p.is_file())
    assert 0 < held <= 2 * size  # the small cache trimmed itself to its size


def test_a_data_file_read_whole_is_one_request(s3_counted_env):
    """With B large enough, each touched data file (1.6 MB, over Lance's 1 MiB read block) is read in
    one GET of the whole file; by ranges the same sample takes more requests."""
    srv, gets = s3_counted_env, {}
    for name, b in (("whole", 1 << 30), ("rows", 1)):
        uri = s3_uri(name)  # (a table of its own: nothing cached by an earlier read)
        _fill(uri, fragments=2, per=600, n_gen=400)
        sizes = sorted(_file_sizes(RolloutStore.open(uri)).values())
        mark = len(srv.log)
        t = RolloutStore.open(uri, request_bytes=b).sample(8, seed=1)
        gets[name] = sorted(_data_gets(srv, uri, mark))
    assert {r.split("-")[0] for r in t.column("rollout_id").to_pylist()} == {"b0", "b1"}
    assert sizes[0] > 1 << 20 and gets["whole"] == sizes and len(gets["rows"]) > 2


def test_the_read_cache_fetches_each_file_once_then_samples_cost_no_data_request(s3_counted_env, tmp_path):
    """A sample whose files are worth reading whole fetches each into the cache (one GET of the whole
    file); later samples (with ``where`` too) and gets make no data request once every file is cached,
    in this store object and in one opened anew over the same folder, with an index on the table too."""
    srv, uri = s3_counted_env, s3_uri("cache")
    _fill(uri)
    sizes = _file_sizes(RolloutStore.open(uri))
    s = RolloutStore.open(uri, read_cache=tmp_path / "cache")
    mark = len(srv.log)
    first = s.sample(60, seed=1)
    assert sorted(_data_gets(srv, uri, mark)) == sorted(sizes.values())  # four whole files, nothing else
    again = RolloutStore.open(uri, read_cache=str(tmp_path / "cache"))
    assert again.read_cache is s.read_cache  # (one cache object per folder and process)
    mark = len(srv.log)
    assert again.sample(60, seed=1) == first and again.sample(60, seed=2, where="step >= 1").num_rows == 60
    assert again.get(["b0-1", "b3-39"]).column("rollout_id").to_pylist() == ["b0-1", "b3-39"]
    assert _data_gets(srv, uri, mark) == [] and len(list((tmp_path / "cache").glob("*/data/*"))) == 4
    again.compact()  # one new file, and a BTREE index on rollout_id: get's look-up goes through it, remotely
    s.sample(60, seed=3)
    idx = srv.count("GET", "/_indices/")[0]
    assert s.get(["b0-1", "b3-39"]).column("rollout_id").to_pylist() == ["b0-1", "b3-39"]
    assert srv.count("GET", "/_indices/")[0] > idx and len(list((tmp_path / "cache").glob("*/data/*"))) == 5


def test_a_file_is_fetched_when_its_range_reads_have_cost_its_size(s3_counted_env, tmp_path):
    """Ski rental: each sample of m rows from a file pays m × B in range reads; the sample that brings
    the total to the file's size fetches it (one GET of the whole file), and the next makes no data request."""
    srv, uri = s3_counted_env, s3_uri("rent")
    _fill(uri, fragments=1, per=600, n_gen=400)  # (1.6 MB: range reads do not cover it)
    size = next(iter(_file_sizes(RolloutStore.open(uri)).values()))
    s = RolloutStore.open(uri, read_cache=ReadCache(tmp_path / "cache"), request_bytes=-(-size // 10))
    for k in range(4):  # 4 rows x size/10 each: 0.4, 0.8 of the size by ranges; 1.2: fetched; then cached
        mark = len(srv.log)
        s.sample(4, seed=k)
        gets = _data_gets(srv, uri, mark)
        assert (size in gets, bool(gets)) == ((k == 2), k < 3), k
        assert bool(list((tmp_path / "cache").glob("*/data/*"))) == (k >= 2)


def test_the_read_cache_returns_the_stores_rows_on_every_backend(store_uri, tmp_path):
    """With a read cache (ignored by a local store), sample and get return what the store without one
    returns, on local disk, S3 and Azure; a remote store's files are then in the cache."""
    _fill(store_uri, fragments=3, per=20)
    plain, cached = RolloutStore.open(store_uri), RolloutStore.open(store_uri, read_cache=tmp_path / "c")
    for s in (plain, cached):
        s.dataset("rollouts").delete("rollout_id = 'b2-0'")
    for seed in (1, 2):
        assert cached.sample(25, seed=seed) == plain.sample(25, seed=seed)
    assert cached.get(["b2-3", "b0-0"]) == plain.get(["b2-3", "b0-0"])
    assert len(list((tmp_path / "c").glob("*/data/*.lance"))) == (0 if plain.local else 3)
    assert len(list((tmp_path / "c").glob("*/_deletions/*"))) == (0 if plain.local else 1)
    plain.compact()  # (a new file, and an index the cache does not hold)
    assert cached.sample(9, where="step = 1", seed=3) == plain.sample(9, where="step = 1", seed=3)
    assert cached.get(["b1-3", "b2-19"]) == plain.get(["b1-3", "b2-19"])


def test_the_read_cache_and_the_request_cost_come_from_the_environment(s3_counted_env, tmp_path, monkeypatch):
    """GFCR_READ_CACHE (folder), GFCR_READ_CACHE_BYTES and GFCR_REQUEST_BYTES configure a remote store's
    reads; a local store keeps no cache; a bad size is one line naming the variable."""
    uri = s3_uri("env")
    _fill(uri, fragments=1, per=5)
    monkeypatch.setenv("GFCR_READ_CACHE", str(tmp_path / "envc"))
    monkeypatch.setenv("GFCR_READ_CACHE_BYTES", "1000000")
    monkeypatch.setenv("GFCR_REQUEST_BYTES", "4096")
    s = RolloutStore.open(uri)
    assert (s.read_cache.root, s.read_cache.max_bytes, s.request_bytes) == ((tmp_path / "envc").resolve(), 10**6, 4096)
    assert RolloutStore.open(tmp_path / "local", create=True).read_cache is None
    monkeypatch.setenv("GFCR_READ_CACHE_BYTES", "lots")
    with pytest.raises(ValueError, match="GFCR_READ_CACHE_BYTES='lots': expected a positive number of bytes"):
        RolloutStore.open(uri)
