"""Write a dense safetensors folder (config.json, tokenizer files, model.safetensors) from a GGUF file.

Engines that no longer load GGUF (vLLM 0.33 dropped its `gguf` quantization) serve the folder instead:

    python -m backend.engine.convert --gguf model.gguf --out ./model-dense [--dtype bfloat16]

The weights are dequantized by transformers' GGUF reader, the same one the embedded engine loads with
(`loader.read_gguf`), so the folder gives the same greedy tokens as the GGUF file (exactly so in float32).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPES = ("bfloat16", "float16", "float32")


def convert_gguf(gguf: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the folder; returns its path. ValueError for a bad input, FileExistsError for a used folder."""
    import torch  # heavy: imported when converting, not when the CLI parses its arguments
    from safetensors.torch import save_file

    from backend.engine.gguf_cache import config_and_tokenizer
    from backend.engine.loader import architecture_of, read_gguf

    gguf, out = Path(gguf).expanduser(), Path(out).expanduser()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if gguf.suffix != ".gguf" or not gguf.is_file():
        raise ValueError(f"{gguf} is not a .gguf file")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose a new folder")
    hf_config, state = read_gguf(str(gguf.parent), gguf.name, trust_remote_code=False)
    hf_config.architectures = [architecture_of(hf_config)]
    if getattr(hf_config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # shares the embedding's storage; safetensors stores it once
    weights = {name: t.to(getattr(torch, dtype)).contiguous() for name, t in state.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # readable inside containers that run as another user
    hf_config.dtype = dtype
    if hasattr(hf_config, "quantization_config"):  # it names the GGUF file; the folder holds plain weights
        del hf_config.quantization_config
    hf_config.save_pretrained(out)
    # the engine's converted tokenizer (cached after the first parse of the file's 49k-string vocabulary)
    config_and_tokenizer(str(gguf))[1].save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=None, help="the .gguf file (default: the packaged default model)")
    parser.add_argument("--out", type=Path, required=True, help="a new folder to write")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    args = parser.parse_args(argv)
    gguf = args.gguf
    if gguf is None:
        from backend.default_model import packaged_gguf

        gguf = packaged_gguf()
        if gguf is None:
            print("error: no --gguf given and the default model package is not installed", file=sys.stderr)
            return 2
    try:
        folder = convert_gguf(gguf, args.out, args.dtype)
    except (ValueError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
