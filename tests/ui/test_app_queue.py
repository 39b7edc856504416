"""The served app's Gradio queue does not poll every millisecond when idle (ui/app.py quiet_queue): an idle
`python app.py` used 9.5% of a core on that poll alone, 2.8% at 10 ms (measured over 10 s, no browser)."""

from __future__ import annotations

from starlette.routing import Mount

from backend.server.engine_holder import EngineHolder
from ui.app import QUEUE_IDLE_POLL_S, build_server
from ui.common import AppContext


def test_the_mounted_apps_queue_polls_every_10_ms_when_idle():
    ctx = AppContext(EngineHolder(), "HuggingFaceTB/SmolLM2-135M-Instruct", "http://127.0.0.1:9/v1")
    server = build_server(ctx)
    mounts = [route.app for route in server.routes if isinstance(route, Mount)]
    blocks = [app.get_blocks() for app in mounts if hasattr(app, "get_blocks")]
    assert len(blocks) == 1, server.routes  # the UI, mounted at /
    assert blocks[0]._queue.sleep_when_free == QUEUE_IDLE_POLL_S == 0.01  # Gradio's own: 0.001
