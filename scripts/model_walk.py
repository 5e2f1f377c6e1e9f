"""Follow a model through `posym.models.load`, module by module: the walk of issue 54.

Under `sys.setprofile`, every call of a posym function during one `posym.models.load(spec)` is seen. A
*visit* to a module begins when a function of it is called from a function of another posym module (the
caller is the nearest posym frame on the stack: frames of other packages, transformers' and torch's, are
looked through) and ends when that call returns; the first call of the load is the first visit. The walk
is the visits in order, each at its depth below `load`. A module is *re-entered on the way down* when it
has a second visit.

The rule (issue 54's acceptance): no module is re-entered, except the shared modules under every step
(`SHARED`: posym.io's bounded readers and atomic writers, transformers' one `from_pretrained` call in
posym.models.weights, posym.configs, the names of posym.runs, posym.errors, and the core's pure functions
and config dataclasses), which several steps may call, and which never lead into a module that is not
shared itself (checked too): the steps of a load (posym.models' spec, checkpoints, files, cache, loader)
and the floor's checks (posym.resources) are each visited once, in the order of a load.

    python scripts/model_walk.py            # a tiny Hugging Face directory, a GGUF stand-in (first load,
                                            # a later process's load from the dequantized copy) and a
                                            # posym run, each loaded once in a temporary directory (~15 s)
    python scripts/model_walk.py --json     # the same as JSON

The GGUF stand-in is a real GGUF header (2 blocks, the tensors `posym.models.files` checks) whose
dequantization, transformers' reader, is replaced by the tiny Llama of the Hugging Face directory: the
walk through posym is the one of any GGUF file; only transformers' work inside the reader is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import posym  # noqa: E402

PACKAGE = Path(posym.__file__).resolve().parent
SHARED = ("posym.io", "posym.models.weights", "posym.configs", "posym.runs", "posym.errors", "posym.core")
"""Modules (and packages) every step may call (they read and write files, build configs, name paths, raise
errors, compute) and that call no step: their visits are counted, not held to one."""


def shared(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in SHARED)


def module_of(file: str) -> str | None:
    """posym.models.files for .../posym/models/files.py; None outside the package."""
    path = Path(file)
    if not path.is_absolute() or PACKAGE not in path.parents:
        return None
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def walk(load, *args, **kwargs) -> tuple[object, list[tuple[str, int]]]:
    """(what `load(*args, **kwargs)` returns, its walk: (module, depth) of every visit, in order)."""
    visits: list[tuple[str, int]] = []
    stack: list[str] = []  # the module of every posym frame on the stack
    frames: set[int] = set()  # ids of the posym frames pushed (a frame's return pops only its own push)
    modules: dict[str, str | None] = {}

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        file = frame.f_code.co_filename
        if file not in modules:
            modules[file] = module_of(file)
        module = modules[file]
        if module is None:
            return
        if event == "call":
            if not stack or stack[-1] != module:
                visits.append((module, sum(1 for k, m in enumerate(stack) if k == 0 or stack[k - 1] != m)))
            stack.append(module)
            frames.add(id(frame))
        elif id(frame) in frames:
            frames.discard(id(frame))
            stack.pop()

    sys.setprofile(profile)
    try:
        result = load(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return result, visits


def summary(visits: list[tuple[str, int]]) -> dict:
    """Visits per module, the modules re-entered (outside SHARED), and the shared modules' visits that led
    into a module that is not shared."""
    counts: dict[str, int] = {}
    for module, _ in visits:
        counts[module] = counts.get(module, 0) + 1
    reentered = sorted(m for m, n in counts.items() if n > 1 and not shared(m))
    below_shared = []
    for k, (module, depth) in enumerate(visits):
        if shared(module):
            for inner, inner_depth in visits[k + 1 :]:
                if inner_depth <= depth:
                    break
                if not shared(inner):
                    below_shared.append(f"{module} -> {inner}")
    return {
        "visits": len(visits),
        "modules": counts,
        "reentered": reentered,
        "below_shared": below_shared,
        "walk": [f"{depth}:{module}" for module, depth in visits],
    }


def stand_in_gguf(path: Path, hf_dir: Path) -> Path:
    """A GGUF header file of a 2-block llama that `posym.models.files` accepts (the tensors it checks,
    zeros), whose reading `fake_reader` replaces with the tiny Llama of `hf_dir`."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(32)
    writer.add_head_count(4)
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    for block in range(2):
        writer.add_tensor(f"blk.{block}.attn_q.weight", np.zeros((32, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fake_reader(hf_dir: Path):
    """What replaces transformers' GGUF reading for the stand-in: (the model reader, the tokenizer reader)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def read_model(path, dtype, attn_implementation):
        return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype, attn_implementation=attn_implementation)

    def read_tokenizer(path):
        return AutoTokenizer.from_pretrained(hf_dir)

    return read_model, read_tokenizer


def walks(root: Path) -> dict[str, dict]:
    """The walk of a load of each kind of spec, in `root` (a temporary directory): a Hugging Face
    directory, a GGUF file's first load (it writes the dequantized copy), a later process's load of it
    (from the copy), and a posym run."""
    from tiny_llms import save_model, tokenizer
    from tiny_runs import train_tiny

    from posym import models

    cache = getattr(models, "cache", models)  # the layout before issue 54: one module, posym/models.py

    hf_dir = save_model(root / "llama", "llama", tokenizer())
    gguf_file = stand_in_gguf(root / "m.gguf", hf_dir)
    run = train_tiny(root / "runs", steps=2, every=2, eval_size=8)
    found = {"hf": summary(walk(models.load, hf_dir)[1])}

    saved = {name: getattr(cache, name) for name in ("_read_gguf", "_read_gguf_tokenizer")}
    environ = os.environ.get(models.CACHE_ENV)
    cache._read_gguf, cache._read_gguf_tokenizer = fake_reader(hf_dir)
    os.environ[models.CACHE_ENV] = str(root / "cache")
    try:
        for name in ("gguf first load", "gguf from its copy"):
            for held in ("_GGUF_MODELS", "_GGUF_TOKENIZERS", "_ENTRIES"):  # a new process: nothing read yet
                getattr(cache, held).clear()
            found[name] = summary(walk(models.load, gguf_file)[1])
    finally:
        for name, value in saved.items():
            setattr(cache, name, value)
        if environ is None:
            os.environ.pop(models.CACHE_ENV, None)
        else:
            os.environ[models.CACHE_ENV] = environ
    found["posym run"] = summary(walk(models.load, run)[1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the walks as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        found = walks(Path(tmp))
    if args.json:
        print(json.dumps(found, indent=1))
        return
    for name, result in found.items():
        print(f"== {name}: {result['visits']} visits")
        for step in result["walk"]:
            depth, module = step.split(":")
            print(f"  {'  ' * int(depth)}{module}")
        once = [m for m, n in result["modules"].items() if n == 1]
        steps = [m for m in once if not shared(m)]
        print(f"  steps, each visited once: {', '.join(steps)}")
        print(f"  shared (visits): { ({m: n for m, n in result['modules'].items() if shared(m)}) }")
        below = result["below_shared"] or "none"
        print(f"  re-entered: {result['reentered'] or 'none'}; a step below a shared module: {below}")


if __name__ == "__main__":
    main()
