"""The soak benchmark's plan (the run itself is `python -m benchmarks.soak`, ~1,000 requests against
`app.py serve` on the default model, a few minutes: too slow for the suite, and its RSS check only means
something at full size)."""

from __future__ import annotations

from benchmarks.soak import SoakConfig, plan_jobs


def test_plan_mixes_streams_disconnects_and_malformed_requests():
    jobs = plan_jobs(SoakConfig(num_requests=1000))
    good = [job for job in jobs if job.bad_body is None]
    leaving = sum(job.disconnect_after is not None for job in good)
    assert 10 <= len(jobs) - len(good) <= 60 and 0.25 < leaving / len(good) < 0.42
    assert 0.4 < sum(job.stream for job in jobs) / len(jobs) < 0.6
    assert plan_jobs(SoakConfig(num_requests=1000)) == jobs  # seeded: the same run every time
