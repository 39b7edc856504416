"""/metrics monitoring: one normalised time series from any server's Prometheus /metrics or from the
embedded engine's stats(), for the live charts, the exports' process views and the benchmarks."""
