"""Speculative decoding (vLLM's vllm/v1/spec_decode): n-gram prompt lookup and a draft model propose
tokens, the target model verifies them all in one forward pass, rejection sampling keeps its distribution."""
