"""Weights kept in their checkpoint's quantized format and computed from directly (GGUF blocks)."""
