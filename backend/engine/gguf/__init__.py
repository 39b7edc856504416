"""GGUF files as llama.cpp's converter writes them: metadata (metadata.py), the transformers config it
stands for (hf_config.py), per-architecture conventions as data (families.py), tensor names (tensor_names.py)
and the tokenizer with its chat template (tokenizer.py). The weights themselves are read by
quantization/gguf_reader.py; gguf_cache.py keeps what was converted."""
