"""Task datasets on disk: parquet, jsonl or npz files with a JSON manifest (docs/method.md section 1).

`save_dataset(config, n, seed, split, out, fmt)` generates samples with `posym.core.tasks.generate` and
writes them atomically, streamed chunk by chunk (memory bounded whatever n; n checked against the free
disk space first), with a manifest next to them (`manifest_path`: OUT.manifest.json, holding the
task config, seed, split, format, versions and the `content_hash` of the ids); `load_dataset(path)`
reads any of the three formats back into (TaskConfig, Samples) and refuses a file whose ids do not
match the manifest's hash. Rows hold input_ids, answer, hops, chain (positions from the query to the
answer, no padding) and text.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from posym import io
from posym.configs import from_dict
from posym.core.tasks import (
    SAMPLE_FIELDS,
    Samples,
    TaskConfig,
    check_int,
    generate,
    iter_batches,
    texts,
)
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


CHUNK_BYTES = 64 * 2**20
"""Memory one chunk of generated rows may take while `save_dataset` writes it (the rows of a file are
streamed chunk by chunk, so `posym data --n` needs this much memory whatever n is)."""


def row_bytes(config: TaskConfig, fmt: str) -> int:
    """Bytes one row takes on disk at least, in format `fmt`: npz exactly twice its five int64 fields
    (spooled, then archived), jsonl at least two characters per id and per token of the text plus the
    keys, Parquet (compressed) at least two bits per token. `posym data` refuses an n whose rows would
    not fit the free disk space."""
    L, H = config.seq_len, config.max_hops
    return {"npz": 2 * 8 * (L + H + 4), "jsonl": 4 * L + 60}.get(fmt, L // 4 + 1)


def save_dataset(
    config: TaskConfig,
    n: int,
    seed: int,
    split: str,
    out: str | Path,
    fmt: str = "parquet",
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Generate n samples and write them to `out` (parquet, jsonl or npz) plus its manifest.

    Rows: input_ids, answer, hops, chain (positions from the query to the answer, no padding)
    and text. The rows are generated and written chunk by chunk (`CHUNK_BYTES` each), so memory stays
    bounded whatever n is; an n whose rows would not fit the free disk space (`row_bytes`) is refused
    before anything is written. `progress(k)` is called after each chunk of k samples. Both files are
    atomic.
    """
    check_int("n", n, 0)
    if fmt not in FORMATS:
        raise PosymError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    out = Path(out)
    # one sequence must fit in memory; all of them on the disk
    check_count("--extra-target", config.extra_target, SAMPLE_BYTES_PER_TOKEN, what="token of one sequence")
    check_count("--n", n, row_bytes(config, fmt), what=f"{config.seq_len}-token {fmt} row", disk=out.parent)
    chunk = max(1, CHUNK_BYTES // sequence_bytes(config))
    digest = hashlib.sha256()  # content_hash of all rows, fed chunk by chunk (row-major ids)

    def chunks() -> Iterator[Samples]:
        for part in iter_batches(config, chunk, seed, split, start=0, stop=n):
            digest.update(np.ascontiguousarray(part.input_ids, dtype="<i8").tobytes())
            yield part
            if progress:
                progress(len(part))

    with io.atomic_path(out) as tmp:
        {"npz": _write_npz, "jsonl": _write_jsonl, "parquet": _write_parquet}[fmt](
            config, n, chunks() if n else iter([generate(config, 0, seed, split)]), tmp
        )
    meta = io.manifest(
        asdict(config),
        seed=seed,
        split=split,
        n=n,
        format=fmt,
        task_config=asdict(config),
        content_hash=digest.hexdigest(),
    )
    io.write_json(manifest_path(out), meta)
    return out


def _write_jsonl(config: TaskConfig, n: int, parts: Iterable[Samples], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for samples in parts:
            f.write(
                "".join(
                    json.dumps({"input_ids": ids, "answer": a, "hops": h, "chain": c, "text": t}) + "\n"
                    for ids, a, h, c, t in zip(
                        samples.input_ids.tolist(),
                        samples.answer.tolist(),
                        samples.hops.tolist(),
                        _chain_lists(samples),
                        texts(config, samples.input_ids),
                    )
                )
            )


def _write_parquet(config: TaskConfig, n: int, parts: Iterable[Samples], path: Path) -> None:
    """One row group per chunk, all under the schema of the first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, f = None, open(path, "wb")
    try:
        for samples in parts:
            offsets = np.concatenate([[0], np.cumsum(samples.hops + 1)]).astype(np.int32)
            chain_flat = samples.chain[samples.chain >= 0]  # row-major: each row's chain in order
            table = pa.table(
                {
                    "input_ids": pa.FixedSizeListArray.from_arrays(
                        pa.array(samples.input_ids.reshape(-1)), config.seq_len
                    ),
                    "answer": samples.answer,
                    "hops": samples.hops,
                    "chain": pa.ListArray.from_arrays(pa.array(offsets), pa.array(chain_flat)),
                    "text": texts(config, samples.input_ids),
                }
            )
            writer = writer or pq.ParquetWriter(f, table.schema)
            writer.write_table(table)
    finally:
        try:
            if writer is not None:
                writer.close()
        finally:
            f.close()


def _write_npz(config: TaskConfig, n: int, parts: Iterable[Samples], path: Path) -> None:
    """What `np.savez` writes (one stored .npy per field), streamed: each chunk's fields go to unnamed
    temporaries beside the output (gone with the process, whatever happens), then into the archive."""
    import tempfile
    import zipfile

    spools = {name: tempfile.TemporaryFile(dir=path.parent) for name in SAMPLE_FIELDS}
    try:
        first = {}
        for samples in parts:
            for name in SAMPLE_FIELDS:
                array = getattr(samples, name)
                first.setdefault(name, array)
                spools[name].write(np.ascontiguousarray(array).tobytes())
        with open(path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name in SAMPLE_FIELDS:
                header = {
                    "descr": np.lib.format.dtype_to_descr(first[name].dtype),
                    "fortran_order": False,
                    "shape": (n, *first[name].shape[1:]),
                }
                with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array_header_1_0(entry, header)  # np.save's header for these shapes
                    spool = spools[name]
                    spool.seek(0)
                    shutil.copyfileobj(spool, entry, 2**20)
    finally:
        for spool in spools.values():
            spool.close()


def _read_columns(path: Path, fmt: str) -> dict[str, np.ndarray]:
    """input_ids (flat), answer, hops and the concatenated chains from a parquet or jsonl file."""
    if fmt == "jsonl":
        with open(path, encoding="utf-8") as f:
            rows = [io.parse_json(line, f"{path} line {k}") for k, line in enumerate(f, 1) if line.strip()]
        cols = {k: [r[k] for r in rows] for k in ("input_ids", "answer", "hops")}
        flat_chain = [pos for r in rows for pos in r["chain"]]
    else:
        table = io.read_parquet(path, arrow=True, columns=["input_ids", "answer", "hops", "chain"])
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
        meta = io.read_json(mpath)
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
