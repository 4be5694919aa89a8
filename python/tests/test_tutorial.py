"""rabit's tutorial examples (basic, broadcast, lazy allreduce, k-means with a
killed worker), ported to switchyard and run as processes under `switchyard launch`."""

import re


def test_basic_allreduce_max_then_sum(launch):
    job = launch(3, "basic")
    for rank in range(3):
        assert "[%d] @node[%d] after-allreduce-max: a=[2.0, 3.0, 4.0]" % (rank, rank) in job.out, job.out
        assert "[%d] @node[%d] after-allreduce-sum: a=[6.0, 9.0, 12.0]" % (rank, rank) in job.out, job.out


def test_broadcast_of_a_dict_with_an_array(launch):
    job = launch(3, "broadcast")
    lines = job.lines("after-broadcast")
    assert len(lines) == 3, job.out
    for line in lines:
        assert "s=[('hello world', 100), (2, 3)] weights=262144 sum=34359607296.0" in line, line


def test_lazy_allreduce_does_not_prepare_a_recovered_result(launch):
    # Rank 0 dies before its second allreduce (mock=0,0,1,0); restarted, it gets the
    # first result from rank 1 and must not run its prepare function again.
    job = launch(2, "lazy_allreduce", "mock=0,0,1,0", restarts=1)
    assert "rank 0 exits at version 0 call 1" in job.out, job.out
    assert len(job.lines("@node[0] run prepare function")) == 1, job.out
    assert len(job.lines("@node[1] run prepare function")) == 1, job.out
    assert len(job.lines("@node[0] after-allreduce-max: a=[1, 2, 3]")) == 2, job.out
    for rank in range(2):
        assert "@node[%d] after-allreduce-sum: a=[2, 4, 6]" % rank in job.out, job.out


def _centroids(job):
    found = job.lines("centroids ")
    assert len(found) == 1, job.out
    return found[0].split("centroids ", 1)[1]


def test_kmeans_with_a_killed_worker_ends_with_the_same_centroids(launch):
    clean = launch(4, "kmeans", restarts=1)
    assert len(clean.lines("prepared 8 times from version 0")) == 4, clean.out
    # Rank 1 dies at the checkpoint of version 3 (its allreduce done), is restarted,
    # resumes from version 3 and gets that iteration's sums from the survivors.
    killed = launch(4, "kmeans", "mock=1,3,1,0", restarts=1)
    assert "rank 1 exits at version 3 call 1" in killed.out, killed.out
    assert "[1] rank 1: resumed at version 3" in killed.out, killed.out
    assert "[1] rank 1: prepared 4 times from version 3" in killed.out, killed.out
    assert _centroids(killed) == _centroids(clean)
    assert re.search(r"rank 1 +2 ", killed.out), killed.out  # two starts in the summary


def test_every_dtype_through_every_collective(launch):
    job = launch(3, "dtypes")
    assert len(job.lines("dtypes ok")) == 3, job.out


def test_the_gil_is_released_and_a_second_thread_is_refused(launch):
    job = launch(2, "threads")
    found = re.search(r"rank 0: counted (\d+) while waiting; second call: \['(.*)'\]", job.out)
    assert found, job.out
    assert int(found.group(1)) > 1000, job.out
    assert "inside a call: one on another thread" in found.group(2), job.out
