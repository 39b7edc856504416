"""Extract the command-line options each serving engine accepts from its released source.

    python tools/flagdata.py ENGINE SOURCE_PATH VERSION "WHERE IT CAME FROM" \
        > tests/data/engine_flags/ENGINE-VERSION.json

ENGINE and SOURCE_PATH:
  vllm      the `vllm/` package folder (a checkout's vllm/, or an unpacked wheel)
  sglang    the `sglang/` package folder
  tgi       launcher/src/main.rs of text-generation-inference
  llamacpp  the llama.cpp folder (reads common/arg.cpp and common/speculative.cpp)
  trtllm    tensorrt_llm/commands/serve.py

`python tools/flagdata.py vllm-argparse < ARGVS.json`, run with a Python that has vLLM installed, parses
each argument list with that vLLM's real `vllm serve` parser and prints what the parser accepts: the
tests compare it with the extraction from the same source.

The output lists every option string (`options`), options that the engine still parses only to stop with
"removed" (`removed`), and the allowed values of the enumerated ones (`choices`).
tests/export/test_export_flags.py checks every exported command against these files; when an engine
module's target version changes, regenerate its file.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path


def literal_strings(node: ast.AST) -> list[str]:
    """The string values of a Literal[...] / list / tuple node."""
    if isinstance(node, ast.Subscript):
        node = node.slice
    elts = node.elts if isinstance(node, ast.Tuple | ast.List) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def assignments(tree: ast.AST) -> dict[str, ast.AST]:
    """Module-level NAME = value (or NAME: T = value) nodes."""
    found: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            found.setdefault(node.target.id, node.value)
    return found


def add_argument_flags(tree: ast.AST) -> set[str]:
    """Option strings passed literally to add_argument(...) / click.option(...)."""
    flags: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("add_argument", "option"):
            flags |= {
                a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            }
    return flags


def explicit_actions(tree: ast.AST) -> set[str]:
    """Flags declared with a plain action such as "store_true" (they get no --no-x form)."""
    flags: set[str] = set()
    for node in ast.walk(tree):
        is_call = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
        if is_call and any(k.arg == "action" and isinstance(k.value, ast.Constant) for k in node.keywords):
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return flags


def bool_fields(trees: list[ast.AST]) -> set[str]:
    """Dataclass fields annotated bool (vLLM makes each one a --x / --no-x pair)."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                text = ast.unparse(node.annotation).replace(" ", "")
                if text in ("bool", "bool|None", "Optional[bool]"):
                    names.add(node.target.id)
    return names


def parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"))


def vllm(root: Path) -> dict:
    cli_files = sorted((root / "entrypoints").rglob("cli_args.py"))
    files = [
        root / "engine" / "arg_utils.py",
        *cli_files,
        root / "entrypoints" / "cli" / "serve.py",
    ]
    trees = [parse(f) for f in files]
    config_trees = [parse(f) for f in sorted((root / "config").glob("*.py"))]
    flags: set[str] = set().union(*(add_argument_flags(t) for t in trees))
    for tree in map(parse, cli_files):  # frontend dataclasses: every field is a --flag
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name.endswith("Args")]:
            flags |= {
                "--" + n.target.id.replace("_", "-")
                for n in cls.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
    bools = bool_fields(trees + config_trees)
    explicit = set().union(*(explicit_actions(t) for t in trees))  # e.g. action="store_true": no --no-x
    flags |= {"--no-" + f[2:] for f in flags if f[2:].replace("-", "_") in bools and f not in explicit}
    quant = assignments(parse(root / "model_executor" / "layers" / "quantization" / "__init__.py"))
    cache, model = (assignments(parse(root / "config" / n)) for n in ("cache.py", "model.py"))
    choices = {
        "--quantization": literal_strings(quant["QuantizationMethods"]),
        "-q": literal_strings(quant["QuantizationMethods"]),
        "--kv-cache-dtype": literal_strings(cache["CacheDType"]),
        "--dtype": literal_strings(model["ModelDType"]),
    }
    return {"options": sorted(flags), "removed": [], "choices": choices}


def sglang_field_flags(tree: ast.AST) -> tuple[set[str], dict[str, ast.AST]]:
    """`name: A[T, "help" | Arg(...)]` fields -> their flags, and each flag's choices (or type) node."""
    flags: set[str] = set()
    types: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        ann = node.annotation
        if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")):
            continue
        parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        meta = parts[1] if len(parts) > 1 else None
        names = ["--" + node.target.id.replace("_", "-")]
        kind = parts[0]
        if isinstance(meta, ast.Call):
            kw = {k.arg: k.value for k in meta.keywords}
            if kw.get("no_cli") is not None and ast.unparse(kw["no_cli"]) == "True":
                continue
            if "cli_name" in kw:
                names = literal_strings(kw["cli_name"])
            names += literal_strings(kw["aliases"]) if "aliases" in kw else []
            kind = kw.get("choices", kind)
        flags |= set(names)
        types |= dict.fromkeys(names, kind)
    return flags, types


def sglang(root: Path) -> dict:
    srt = root / "srt"
    files = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py"))]
    flags: set[str] = set()
    types: dict[str, ast.AST] = {}
    for tree in map(parse, files):
        flags |= add_argument_flags(tree)
        field_flags, field_types = sglang_field_flags(tree)
        flags |= field_flags
        types |= field_types
    named = assignments(parse(srt / "arg_groups" / "choices.py"))

    def values(flag: str) -> list[str]:
        node = types[flag]
        if isinstance(node, ast.Name):
            node = named[node.id]
        found = [n for n in ast.walk(node) if isinstance(n, ast.Subscript) and "Literal" in ast.unparse(n)]
        return literal_strings(found[0] if found else node)

    choices = {flag: values(flag) for flag in ("--quantization", "--kv-cache-dtype", "--dtype")}
    return {"options": sorted(flags), "removed": [], "choices": choices}


def kebab(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


def rust_enum(text: str, name: str) -> list[str]:
    """clap ValueEnum values: each variant's #[clap(name = ...)] or its kebab-case name."""
    body = re.search(rf"\benum {name} \{{(.*?)\n\}}", text, re.S).group(1)
    values, rename = [], None
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("//"):
            continue
        if match := re.match(r'#\[clap\(name = "([^"]+)"\)\]', line):
            rename = match.group(1)
        elif match := re.match(r"([A-Z]\w*),?$", line):
            values.append(rename or kebab(match.group(1)))
            rename = None
    return values


def tgi(main_rs: Path) -> dict:
    text = main_rs.read_text(encoding="utf-8")
    body = re.search(r"\nstruct Args \{(.*?)\n\}", text, re.S).group(1)
    flags: set[str] = set()
    attrs: list[str] = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("#[clap("):
            attrs.append(line)
        elif match := re.match(r"(\w+): ", line):
            joined = " ".join(attrs)
            if re.search(r"\blong\b", joined):
                flags.add("--" + match.group(1).replace("_", "-"))
            if re.search(r"\bshort\b", joined):
                flags.add("-" + match.group(1)[0])
            attrs = []
    choices = {
        "--quantize": rust_enum(text, "Quantization"),
        "--dtype": rust_enum(text, "Dtype"),
        "--kv-cache-dtype": rust_enum(text, "KVCacheDtype"),
    }
    return {"options": sorted(flags), "removed": [], "choices": choices}


def llamacpp(root: Path) -> dict:
    text = (root / "common" / "arg.cpp").read_text(encoding="utf-8")
    flags: set[str] = set()
    removed: set[str] = set()
    for block in text.split("add_opt(common_arg(")[1:]:
        names = re.findall(r'"(-[^"]+)"', block.split("}", 1)[0])
        tail = block.split("));", 1)[0] if "));" in block else block
        examples = re.search(r"set_examples\(\{([^}]*)\}", tail)
        if examples and not re.search(r"LLAMA_EXAMPLE_(SERVER|COMMON)\b", examples.group(1)):
            continue  # options of other tools (llama-cli, ...); COMMON ones apply to every tool
        (removed if "arg_removed(" in tail else flags).update(names)
    kv_types = re.search(r"kv_cache_types = \{(.*?)\};", text, re.S).group(1)
    cache = [t.lower() for t in re.findall(r"GGML_TYPE_(\w+)", kv_types)]
    spec = (root / "common" / "speculative.cpp").read_text(encoding="utf-8")
    spec_types = sorted(set(re.findall(r'\{"([a-z0-9-]+)",\s*COMMON_SPECULATIVE_TYPE_', spec)))
    choices = {"-ctk": cache, "-ctv": cache, "--cache-type-k": cache, "--cache-type-v": cache}
    choices |= {"-fa": ["on", "off", "auto"], "--flash-attn": ["on", "off", "auto"]}
    choices |= {"--spec-type": spec_types, "-sm": ["none", "layer", "row", "tensor"]}
    return {"options": sorted(flags), "removed": sorted(removed - flags), "choices": choices}


def trtllm(serve_py: Path) -> dict:
    tree = parse(serve_py)
    serve = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "serve")
    flags: set[str] = set()
    choices: dict[str, list[str]] = {}
    for deco in serve.decorator_list:
        if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "option":
            names = [
                a.value for a in deco.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            ]
            flags |= set(names)
            for kw in deco.keywords:
                if kw.arg == "type" and isinstance(kw.value, ast.Call) and kw.value.args:
                    values = literal_strings(kw.value.args[0])
                    choices |= dict.fromkeys(names, values) if values else {}
    return {"options": sorted(flags), "removed": [], "choices": choices}


def vllm_argparse(argvs: list[list[str]]) -> dict:
    """The installed vLLM's own `vllm serve` parser (run with the Python that has vLLM); each of `argvs`
    (`vllm serve` arguments, the model first) is parsed with it, and a rejected one stops with its error."""
    from vllm.entrypoints.cli import serve
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = serve.make_arg_parser(FlexibleArgumentParser())
    for argv in argvs:
        parser.parse_args([*argv[1:], "--model", argv[0]])
    options: set[str] = set()
    choices: dict[str, list[str]] = {}
    for action in parser._actions:
        options |= set(action.option_strings)
        if action.choices and {"--quantization", "--kv-cache-dtype", "--dtype"} & set(action.option_strings):
            choices |= dict.fromkeys(action.option_strings, sorted(map(str, action.choices)))
    # --quantization takes any string at parse time; vLLM checks it against this list when it starts
    choices |= dict.fromkeys(("--quantization", "-q"), sorted(QUANTIZATION_METHODS))
    return {"options": sorted(options), "removed": [], "choices": choices}


EXTRACTORS = {"vllm": vllm, "sglang": sglang, "tgi": tgi, "llamacpp": llamacpp, "trtllm": trtllm}


def main(argv: list[str]) -> int:
    if argv == ["vllm-argparse"]:  # stdin: a JSON list of argument lists to parse (may be empty)
        print(json.dumps(vllm_argparse(json.loads(sys.stdin.read() or "[]"))))
        return 0
    if len(argv) != 4 or argv[0] not in EXTRACTORS:
        print(__doc__, file=sys.stderr)
        return 2
    engine, path, version, source = argv
    data = {"engine": engine, "version": version, "source": source, "generated_by": "tools/flagdata.py"}
    data |= EXTRACTORS[engine](Path(path))
    print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
