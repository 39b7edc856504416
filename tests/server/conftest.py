"""Fixtures the server tests share."""

from __future__ import annotations

import pytest

from tests.server_utils import long_context_tiny_model, start_engine


@pytest.fixture(scope="module")
def engine():
    """One engine per test module: the tiny random model with an 8,192-token context, one sequence at a
    time and 1,100 KV blocks, so that limits on long prompts and on the waiting queue can be reached."""
    engine = start_engine(long_context_tiny_model(), max_num_seqs=1, num_kv_blocks=1100, max_model_len=8192)
    yield engine
    engine.shutdown()
