"""Task datasets on disk: parquet, jsonl or npz files with a JSON manifest (SPEC section 1).

`save_dataset(config, n, seed, split, out, fmt)` generates samples with `posym.core.tasks.generate` and
writes them atomically with a manifest next to them (`manifest_path`: OUT.manifest.json, holding the
task config, seed, split, format, versions and the `content_hash` of the ids); `load_dataset(path)`
reads any of the three formats back into (TaskConfig, Samples) and refuses a file whose ids do not
match the manifest's hash. Rows hold input_ids, answer, hops, chain (positions from the query to the
answer, no padding) and text.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from posym import io
from posym.configs import from_dict
from posym.core.tasks import SAMPLE_FIELDS, Samples, TaskConfig, check_int, concat, generate, iter_batches, texts
from posym.errors import PosymError
from posym.resources import SAMPLE_BYTES_PER_TOKEN, check_count, sequence_bytes


FORMATS = ("parquet", "jsonl", "npz")


def content_hash(samples: Samples) -> str:
    """sha256 of the input ids (int64, little-endian, row-major)."""
    return hashlib.sha256(np.ascontiguousarray(samples.input_ids, dtype="<i8").tobytes()).hexdigest()


def manifest_path(path: str | Path) -> Path:
    """Where the manifest of dataset `path` lives: `path` + ".manifest.json"."""
    path = Path(path)
    return path.with_name(path.name + ".manifest.json")


def _chain_lists(samples: Samples) -> list[list[int]]:
    return [row[: h + 1] for row, h in zip(samples.chain.tolist(), samples.hops.tolist())]


def save_dataset(config: TaskConfig, n: int, seed: int, split: str, out: str | Path,
                 fmt: str = "parquet", progress: Callable[[int], None] | None = None) -> Path:
    """Generate n samples and write them to `out` (parquet, jsonl or npz) plus its manifest.

    Rows: input_ids, answer, hops, chain (positions from the query to the answer, no padding)
    and text. `progress(k)` is called after each chunk of k samples. Both files are atomic.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_int("n", n, 0)
    # every sequence is held until the file is written (npz and the parquet table are one block)
    check_count("--extra-target", config.extra_target, SAMPLE_BYTES_PER_TOKEN, what="token of one sequence")
    check_count("--n", n, sequence_bytes(config), what=f"{config.seq_len}-token sequence")
    if fmt not in FORMATS:
        raise PosymError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    chunk = 50_000
    parts = []
    for part in iter_batches(config, chunk, seed, split, start=0, stop=n):
        parts.append(part)
        if progress:
            progress(len(part))
    samples = concat(parts) if parts else generate(config, 0, seed, split)
    out = Path(out)
    if fmt == "npz":
        with io.atomic_path(out) as tmp, open(tmp, "wb") as f:
            np.savez(f, **{name: getattr(samples, name) for name in SAMPLE_FIELDS})
    elif fmt == "jsonl":
        lines = [
            json.dumps({"input_ids": ids, "answer": a, "hops": h, "chain": c, "text": t})
            for ids, a, h, c, t in zip(samples.input_ids.tolist(), samples.answer.tolist(),
                                       samples.hops.tolist(), _chain_lists(samples),
                                       texts(config, samples.input_ids))
        ]
        io.write_text(out, "".join(line + "\n" for line in lines))
    else:
        L = config.seq_len
        offsets = np.concatenate([[0], np.cumsum(samples.hops + 1)]).astype(np.int32)
        chain_flat = samples.chain[samples.chain >= 0]  # row-major: each row's chain in order
        table = pa.table({
            "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(samples.input_ids.reshape(-1)), L),
            "answer": samples.answer,
            "hops": samples.hops,
            "chain": pa.ListArray.from_arrays(pa.array(offsets), pa.array(chain_flat)),
            "text": texts(config, samples.input_ids),
        })
        with io.atomic_path(out) as tmp:
            pq.write_table(table, tmp)
    meta = io.manifest(asdict(config), seed=seed, split=split, n=n, format=fmt,
                       task_config=asdict(config), content_hash=content_hash(samples))
    io.write_json(manifest_path(out), meta)
    return out


def _read_columns(path: Path, fmt: str) -> dict[str, np.ndarray]:
    """input_ids (flat), answer, hops and the concatenated chains from a parquet or jsonl file."""
    import pyarrow.parquet as pq

    if fmt == "jsonl":
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        cols = {k: [r[k] for r in rows] for k in ("input_ids", "answer", "hops")}
        flat_chain = [pos for r in rows for pos in r["chain"]]
    else:
        table = pq.read_table(path, columns=["input_ids", "answer", "hops", "chain"])
        cols = {k: table.column(k).combine_chunks() for k in ("input_ids", "answer", "hops")}
        cols["input_ids"] = cols["input_ids"].flatten()
        flat_chain = table.column("chain").combine_chunks().flatten()
    out = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}
    out["flat_chain"] = np.asarray(flat_chain, dtype=np.int64)
    return out


def load_dataset(path: str | Path) -> tuple[TaskConfig, Samples]:
    """Read a dataset written by `save_dataset`; its manifest gives the config and the format.

    The ids are checked against the manifest's content hash, so a damaged file is an error.
    """
    path = Path(path)
    mpath = manifest_path(path)
    if not path.is_file() or not mpath.is_file():
        raise PosymError(f"dataset {path} or its manifest {mpath.name} does not exist")
    try:
        meta = json.loads(mpath.read_text(encoding="utf-8"))
        config = from_dict(TaskConfig, meta["task_config"], where="task_config")
        fmt = meta["format"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise PosymError(f"manifest {mpath} is not a posym dataset manifest ({exc})") from None
    try:
        if fmt == "npz":
            with np.load(path, allow_pickle=False) as data:
                samples = Samples(**{name: data[name].astype(np.int64) for name in SAMPLE_FIELDS})
        else:
            cols = _read_columns(path, fmt)
            hops = cols["hops"]
            # row-major boolean assignment puts each row's chain in its first hops + 1 slots
            chain = np.full((len(hops), config.max_hops + 1), -1, dtype=np.int64)
            chain[np.arange(config.max_hops + 1) <= hops[:, None]] = cols["flat_chain"]
            samples = Samples(
                input_ids=cols["input_ids"].reshape(len(hops), config.seq_len),
                answer=cols["answer"],
                hops=hops,
                chain=chain,
                answer_pos=chain[np.arange(len(hops)), hops],
            )
    except (OSError, ValueError, KeyError, IndexError, json.JSONDecodeError) as exc:
        raise PosymError(f"cannot read dataset {path}: {exc}") from None
    if content_hash(samples) != meta.get("content_hash"):
        raise PosymError(f"dataset {path} does not match the content hash in its manifest")
    return config, samples
