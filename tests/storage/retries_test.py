"""The retry budget (`cairn.storage.retries`) against the emulator behind the fault-injecting
proxy (`cairn.storage.fault_proxy`): gcsfs's writes, reads, listings and create-if-absent and
the direct GET path come through 10 % of faults whole; an outage past the budget is one
`StorageUnavailableError` naming the bucket and the operation, and later failures do not wait
again until a request succeeds; the budget's setting and what tensorstore is given for it."""

import time

import pytest

from cairn import storage
from cairn.storage import retries
from cairn.storage.fault_proxy import FaultProxy
from cairn.storage.testing import GcsEmulator


@pytest.fixture(scope="module")
def proxy():
    with GcsEmulator() as emu, FaultProxy(emu.url, rate=0.1, seed=1, delay_s=0.2) as p:
        emu.create_bucket("stutter")
        p.activate()
        yield p
    retries.reset_outage()


def test_every_operation_comes_through_faults_whole(proxy, monkeypatch):
    monkeypatch.setenv(retries.RETRY_VARIABLE, "5")
    before = proxy.counts()
    blobs = {f"gs://stutter/x/{i}": bytes([i]) * (5000 + i) for i in range(30)}
    for path, data in blobs.items():
        storage.write_bytes(path, data)
    assert storage.create_exclusive("gs://stutter/lock", b"me")
    assert not storage.create_exclusive("gs://stutter/lock", b"2")
    assert storage.read_bytes("gs://stutter/lock") == b"me"
    assert storage.sizes("gs://stutter/x") == {p.rsplit("/", 1)[1]: len(d) for p, d in blobs.items()}
    assert [storage.read_bytes(p) for p in blobs] == list(blobs.values())
    ranges = [(p, 7, 4007) for p in blobs] * 3
    assert storage.read_ranges(ranges) == [blobs[p][7:4007] for p, _, _ in ranges]
    served = {k: v - before[k] for k, v in proxy.counts().items()}
    assert served["requests"] > 150 and all(served[k] > 0 for k in ("429", "503", "reset")), served


def test_an_outage_past_the_budget_names_the_bucket_and_the_operation(proxy, monkeypatch):
    monkeypatch.setenv(retries.RETRY_VARIABLE, "2")
    proxy.outage(60)
    try:
        start = time.monotonic()
        with pytest.raises(storage.StorageUnavailableError) as raised:
            storage.write_text("gs://stutter/y/config.json", "{}")
        assert 1.0 < time.monotonic() - start < 4.0
        error = raised.value
        assert (error.bucket, error.operation) == ("stutter", "writing gs://stutter/y/config.json"), str(error)
        assert str(error).startswith("bucket 'stutter' unavailable: writing gs://stutter/y/config.json still failing")
        assert "the retry budget is 2 s, CAIRN_STORAGE_RETRY_S" in str(error)
        assert retries.declared_outage() is error
        start = time.monotonic()  # the outage is declared: a later failure does not wait again
        with pytest.raises(storage.StorageUnavailableError, match=r"reading bytes \[0, 4\) of gs://stutter/x/1"):
            storage.read_ranges([("gs://stutter/x/1", 0, 4)])
        assert time.monotonic() - start < 0.5
    finally:
        proxy.end_outage()
    proxy.set_rate(0.0)  # (the first failure would fail at once while the outage is recorded)
    assert storage.read_bytes("gs://stutter/x/1") == bytes([1]) * 5001  # back: the outage is over
    assert retries.declared_outage() is None


def test_the_budget_setting_and_tensorstore_s_share_of_it(monkeypatch):
    monkeypatch.delenv(retries.RETRY_VARIABLE, raising=False)
    assert storage.retry_budget() == storage.DEFAULT_RETRY_S == 300
    # 13 waits fit in 300 s: 1 + 2 + 4 + 8 + 16 + 32 * 8 = 287 s
    assert retries.tensorstore_retries() == {"max_retries": 13, "initial_delay": "1s", "max_delay": "32s"}
    storage.set_retry_budget(6.4)
    assert storage.retry_budget() == 6.4 and retries.tensorstore_retries()["initial_delay"] == "0.1s"
    monkeypatch.setenv(retries.RETRY_VARIABLE, "soon")
    with pytest.raises(ValueError, match="CAIRN_STORAGE_RETRY_S='soon': the storage retry budget must be"):
        storage.retry_budget()
