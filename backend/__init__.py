"""Everything that is not UI: engine, planner, export, server, benchmarks. Importable without gradio."""

import os

# OpenMP workers that spin only briefly before sleeping: with GNU OpenMP's default (~300k spins) a worker
# waits for a descheduled peer at every kernel when the CPU is shared (the server, its clients, the UI),
# which made small ops 10-100x slower under load; idle machines lose nothing. Every torch import of the
# project goes through a backend module, so this runs before torch loads.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
