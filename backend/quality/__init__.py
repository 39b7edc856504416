"""Quality of a quantization, measured: perplexity, KL divergence and top-1 agreement of models against a
reference on a shipped text, llama.cpp's `llama-perplexity --kl-divergence` through the engine's own
prompt logprobs (docs/quality.md)."""
