"""The peer watchdog on an in-memory key-value store: a silent peer is named after the bound
(not before), the others stop before process 0, store errors are not taken for silence. The
real thing (2 processes, SIGKILL) is tests/launchers/pod_faults_test.py."""

import io
import threading
import time

import pytest

from cairn.partitioning import initialize_distributed
from cairn.partitioning.peer_watchdog import PEER_LOST_EXIT_CODE, PeerWatchdog, jax_heartbeat_timeout


class FakeStore:
    """The three key-value calls of JAX's `DistributedRuntimeClient` the watchdog uses."""

    def __init__(self):
        self.data, self.lock, self.fail = {}, threading.Lock(), False

    def _check(self):
        if self.fail:
            raise RuntimeError("UNAVAILABLE: the coordination service is unreachable")

    def key_value_set(self, key, value, allow_overwrite=False):
        self._check()
        with self.lock:
            if key in self.data and not allow_overwrite:
                raise RuntimeError(f"ALREADY_EXISTS: {key}")
            self.data[key] = value

    def key_value_dir_get(self, prefix):
        self._check()
        with self.lock:
            return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))

    def key_value_try_get(self, key):
        self._check()
        with self.lock:
            if key not in self.data:
                raise RuntimeError(f"NOT_FOUND: {key}")
            return self.data[key]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watchdogs(store, n, timeout_s, clock=None, **kwargs):
    exits = []
    dogs = [
        PeerWatchdog(
            store,
            i,
            n,
            timeout_s,
            exit_fn=lambda code, i=i: exits.append((i, code)),
            stream=io.StringIO(),
            **({"clock": clock} if clock else {}),
            **kwargs,
        )
        for i in range(n)
    ]
    return dogs, exits


def test_a_silent_peer_is_named_after_the_bound_and_not_before():
    store, clock = FakeStore(), Clock()
    dogs, exits = watchdogs(store, 3, timeout_s=10, clock=clock, interval_s=1, grace_s=0)
    for _ in range(5):  # everyone beats
        clock.now += 1
        assert [d.tick() for d in dogs] == [None, None, None]
    # Process 2 is gone; process 0 saw its last beat at t=6 (it judges before 2 beats in a round).
    for _ in range(11):  # until t=16: 10 s of silence is not more than the bound
        clock.now += 1
        assert dogs[1].tick() is None and dogs[0].tick() is None
    clock.now += 1
    dogs[1].tick()
    line = dogs[0].tick()
    assert line == "error: process 2 of 3 stopped responding (no heartbeat for 11 s); stopping"
    assert exits == [(0, PEER_LOST_EXIT_CODE)]
    assert dogs[0]._stream.getvalue() == line + "\n"
    assert dogs[1].tick() == line and exits[-1] == (1, PEER_LOST_EXIT_CODE)  # process 1 reads the verdict
    assert dogs[1].decided.is_set() and dogs[1].wait_for_verdict(0)


def test_peers_that_keep_beating_are_never_named():
    store, clock = FakeStore(), Clock()
    dogs, exits = watchdogs(store, 2, timeout_s=2, clock=clock, interval_s=0.5)
    for _ in range(100):
        clock.now += 0.5
        assert [d.tick() for d in dogs] == [None, None]
    assert exits == [] and not dogs[1].wait_for_verdict(0)


def test_a_peer_that_finished_is_not_lost():
    store, clock = FakeStore(), Clock()
    dogs, exits = watchdogs(store, 3, timeout_s=2, clock=clock, interval_s=0.5, grace_s=0)
    for _ in range(3):
        clock.now += 0.5
        assert [d.tick() for d in dogs] == [None, None, None]
    dogs[2].stop()  # process 2 is done (at exit) and says so; process 1 simply falls silent
    assert ("cairn/done/2", "1") in store.key_value_dir_get("cairn/done/")
    for _ in range(10):
        clock.now += 0.5
        line = dogs[0].tick()
        if line:
            break
    assert line == "error: process 1 of 3 stopped responding (no heartbeat for 2 s); stopping", line


def test_stop_joins_the_running_thread():
    store = FakeStore()
    dogs, exits = watchdogs(store, 2, timeout_s=5, interval_s=0.05)
    dogs[1].start()
    time.sleep(0.2)
    dogs[1].stop()
    assert not dogs[1]._thread.is_alive() and exits == []


def test_store_errors_are_no_news_not_silence():
    store, clock = FakeStore(), Clock()
    dogs, exits = watchdogs(store, 2, timeout_s=2, clock=clock, interval_s=0.5)
    store.fail = True
    for _ in range(20):  # 10 s without readings
        clock.now += 0.5
        assert [d.tick() for d in dogs] == [None, None]
    store.fail = False
    for _ in range(3):
        clock.now += 0.5
        assert [d.tick() for d in dogs] == [None, None]
    assert exits == []


def test_the_other_survivors_stop_before_process_0():
    """Process 0 hosts the coordination service: it waits for the others to say they stop."""
    store = FakeStore()
    dogs, exits = watchdogs(store, 3, timeout_s=0.3, interval_s=0.02, grace_s=10)
    for d in dogs:
        d.start()
    time.sleep(0.1)
    dogs[2]._stopped.set()  # process 2 goes silent (killed: it never says it finished)
    assert dogs[0].wait_for_verdict(10) and dogs[1].wait_for_verdict(10)
    for d in dogs:
        d.stop()
    assert [i for i, _ in exits] == [1, 0], exits
    assert "process 2 of 3 stopped responding" in dogs[0].message


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="heartbeat timeout must be > 0"):
        PeerWatchdog(FakeStore(), 0, 2, 0)
    with pytest.raises(ValueError, match=r"process_id 2 is not in \[0, 2\)"):
        PeerWatchdog(FakeStore(), 2, 2, 5)
    with pytest.raises(ValueError, match="heartbeat_timeout_seconds must be > 0"):
        initialize_distributed(heartbeat_timeout_seconds=-1)


def test_jax_decides_later_than_the_watchdog():
    for bound in (1, 10, 100):
        assert jax_heartbeat_timeout(bound) >= 2 * bound + 10
