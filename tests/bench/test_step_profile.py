"""step_profile's prefill mode on a tiny bf16 model: every timed step is exactly --prefill-tokens prompt
tokens whose requests finish in it, and the report names our kernels and the model's parts."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import step_profile
from benchmarks.step_parts import labelled_targets
from tests.engine_utils import tiny_model


def profile_args(model: str, **overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    step_profile.add_arguments(parser)
    args = parser.parse_args(["--model", model, "--threads", "1"])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


@pytest.mark.usefixtures("one_torch_thread")
def test_prefill_feed_makes_every_step_a_whole_prefill():
    args = profile_args(tiny_model("llama")[0], prefill_tokens=96, prompt_len=32, dtype="float32")
    engine, feed = step_profile.start_engine(args, args.model)
    assert feed is not None and feed.prompts == 3
    scheduled: list[int] = []
    schedule = engine.scheduler.schedule

    def counting_schedule(*a, **kw):
        out = schedule(*a, **kw)
        scheduled.append(sum(item.num_new_tokens for item in out))
        return out

    engine.scheduler.schedule = counting_schedule
    wall, cpu = step_profile.time_steps(engine, 3, feed)
    assert len(wall) == len(cpu) == 3 and scheduled == [96] * 5
    assert not engine.requests and feed.count == 15  # each step's prompts finished in it
    assert step_profile.step_name(args) == ("96-token prefill step (3 prompts x 32)", 96)


@pytest.mark.usefixtures("one_torch_thread")
def test_prefill_report_names_the_parts(capsys, monkeypatch):
    for owner, name, _ in labelled_targets():  # main() wraps these for the profiler: put them back after
        monkeypatch.setattr(owner, name, getattr(owner, name))
    args = profile_args(
        tiny_model("llama")[0], prefill_tokens=64, prompt_len=16, steps=2, profile_steps=1, top=60
    )
    assert step_profile.main(args) == 0
    report = capsys.readouterr().out
    assert "64-token prefill step (4 prompts x 16): median" in report
    assert "minor page faults a step" in report and "host: prefill chunks" in report
    assert "Attention.forward (all of it)" in report and "MLP.forward (all of it)" in report
