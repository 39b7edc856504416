"""Developer benchmarks: profiling tools and the checkers behind docs/*.md's measured claims.

Each module runs as `python -m benchmarks.NAME` from the repository root. What users run (the serving
benchmark, Compare, the offline benchmark) lives in backend/bench/; these import backend/, never the
other way round (tests/test_import_graph.py checks it).
"""
