import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from speceyes_graph.models import BatchScheduler


def doubler(log):
    def run(key, payloads):
        log.append((key, list(payloads)))
        time.sleep(0.01)  # a model call takes time: requests pile up meanwhile
        return [ValueError(f"bad {p}") if p == "bad" else (key, p * 2) for p in payloads]

    return run


def test_32_threads_get_their_own_results_in_few_calls():
    log = []
    sched = BatchScheduler(doubler(log), max_batch_size=16, max_wait_s=0.02)
    barrier = threading.Barrier(32)

    def worker(i):
        barrier.wait()
        return sched.call("draft", i)

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(worker, range(32)))
    assert results == [("draft", 2 * i) for i in range(32)]
    assert sched.stats.requests == 32 and sched.stats.calls <= 4
    assert max(len(p) for _, p in log) <= 16
    sched.close()


def test_requests_with_different_settings_are_never_mixed():
    log = []
    sched = BatchScheduler(doubler(log), max_batch_size=8, max_wait_s=0.02)
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(sched.call, "judge" if i % 2 else "agent", i) for i in range(12)]
        results = [f.result() for f in futures]
    assert results == [("judge" if i % 2 else "agent", 2 * i) for i in range(12)]
    for key, payloads in log:
        assert all((p % 2 == 1) == (key == "judge") for p in payloads)
    sched.close()


def test_a_failing_request_fails_only_its_caller():
    sched = BatchScheduler(doubler([]), max_batch_size=8, max_wait_s=0.02)
    futures = sched.submit_many("k", [1, "bad", 3])
    assert futures[0].result() == ("k", 2) and futures[2].result() == ("k", 6)
    with pytest.raises(ValueError, match="bad bad"):
        futures[1].result()
    sched.close()


def test_a_failing_batch_is_retried_one_by_one():
    def run(key, payloads):
        if len(payloads) > 1:
            raise RuntimeError("a kernel failed for this batch")
        if payloads[0] == 13:
            raise RuntimeError("this one is broken")
        return [payloads[0] + 1]

    sched = BatchScheduler(run, max_batch_size=8, max_wait_s=0.02)
    futures = sched.submit_many("k", [1, 13, 5])
    assert futures[0].result() == 2 and futures[2].result() == 6
    with pytest.raises(RuntimeError, match="broken"):
        futures[1].result()
    assert sched.stats.retried_alone == 3
    sched.close()


def test_asyncio_callers_are_batched_too():
    log = []
    sched = BatchScheduler(doubler(log), max_batch_size=16, max_wait_s=0.5)  # loaded CI machines

    async def main():
        return await asyncio.gather(*(sched.acall("k", i) for i in range(10)))

    assert asyncio.run(main()) == [("k", 2 * i) for i in range(10)]
    assert len(log) == 1
    sched.close()


def test_max_batch_size_one_disables_batching():
    log = []
    sched = BatchScheduler(doubler(log), max_batch_size=1)
    assert [f.result() for f in sched.submit_many("k", [1, 2, 3])] == [("k", 2), ("k", 4), ("k", 6)]
    assert sched.stats.calls == 3
    sched.close()
    with pytest.raises(RuntimeError, match="closed"):
        sched.submit("k", 1)
