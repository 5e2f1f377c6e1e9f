"""`posym kv-policy`: a head-aware KV-cache policy (`posym.core.kvpolicy`) from any head table, written
in DuoAttention's format (issue 53).

The output directory holds
- full_attention_heads.tsv   one line per layer, one column per KV head: 1 = full cache, 0 = sink + recent
                             window (DuoAttention's attention pattern; its loader, thresholded at 0.5,
                             reads exactly this mask);
- config.json                DuoAttention's sink_size and recent_size, and under "posym" what made the
                             policy: the policy, the streaming fraction asked and got, the kept-KV fraction
                             at a few prompt lengths, the table or grid it ranked, the seed, versions.

The head table is any Parquet or CSV table with one row per (layer, head): `posym score`'s, `posym
llm-scores`' heads.parquet, `posym atlas`'s atlas.parquet; one holding several prompt sets or variants is
filtered to one with COLUMN=VALUE conditions (`filter_table`; `--where variant=sink-free`). The KV table is a layer x KV-head grid such as DuoAttention's own
full_attention_heads.tsv ('duo' ranks by it).
"""

from __future__ import annotations

import os
from pathlib import Path

from posym import io, models
from posym.core import kvpolicy
from posym.errors import PosymError
from posym.runs import output_file

LENGTHS = (1024, 4096, 16384)
"""Prompt lengths at which config.json records the kept-KV fraction (issue 53's 1k-16k tokens)."""
"""The entries `posym kv-policy` writes in its output directory (posym.cli.options.OUTPUTS["kv-policy"])."""


def read_head_table(path: str | os.PathLike):
    """A head table (pandas): a Parquet file, or a CSV / TSV file (by its suffix), with layer and head columns."""
    import pandas as pd

    path = Path(path)
    if path.suffix.lower() in (".csv", ".tsv"):
        if not path.is_file():
            raise PosymError(f"{io.quote(path)} is not a file")
        try:
            table = pd.read_csv(path, sep="\t" if path.suffix.lower() == ".tsv" else ",")
        except (ValueError, pd.errors.ParserError) as exc:
            raise PosymError(f"{io.quote(path)} is not a readable table: {exc}") from None
    else:
        table = io.read_parquet(path)
    missing = {"layer", "head"} - set(table.columns)
    if missing:
        raise PosymError(f"{io.quote(path)} has no {', '.join(sorted(missing))} column: not a head table")
    return table


def filter_table(table, where: list[str], *, option: str = "--where"):
    """The rows of `table` where every COLUMN=VALUE of `where` holds (values compared as text), e.g.
    variant=sink-free for an llm-study heads table that holds the plain and the sink-free scores."""
    for condition in where:
        column, sep, value = condition.partition("=")
        if not sep or not column:
            raise PosymError(f"{option} takes COLUMN=VALUE, got {condition!r}")
        if column not in table.columns:
            raise PosymError(f"{option} {condition}: the head table has no {column!r} column")
        table = table[table[column].astype(str) == value]
        if table.empty:
            raise PosymError(f"{option} {condition}: no row of the head table is left")
    return table


def model_config(spec: str | os.PathLike):
    """The transformers config of a model spec: read alone from a Hugging Face directory, else from the
    loaded model (a GGUF file, an embedded model, a posym run)."""
    source = models.resolve(spec)
    if source.kind == "hf":
        from transformers import AutoConfig

        models.check_model_dir(source.path)
        return models.pretrained(AutoConfig, source.path)  # posym's one from_pretrained: no remote code, no network
    return models.load(spec).model.config


def write_kv_policy(
    config,
    out: str | os.PathLike,
    *,
    policy: str,
    streaming: float,
    table_path: str | os.PathLike | None = None,
    kv_table: str | os.PathLike | None = None,
    sink: int = kvpolicy.SINK,
    recent: int = kvpolicy.RECENT,
    seed: int = 0,
    match: str = "layer",
    where: list[str] = (),
    settings: dict | None = None,
) -> dict:
    """Build the policy for a model's transformers `config` and write OUTPUTS into `out` (created);
    returns config.json's "posym" record. where: COLUMN=VALUE filters of the head table (`filter_table`)."""
    if kv_table is not None and policy not in ("duo", "random"):
        raise PosymError(f"--kv-table is DuoAttention's grid, read by the duo policy (and random), not {policy!r}")
    table = filter_table(read_head_table(table_path), list(where)) if table_path is not None else None
    if where and table_path is None:
        raise PosymError("--where filters the head table: give one with --table")
    grid = io.read_kv_table(kv_table) if kv_table is not None else None
    built = kvpolicy.policy_from_table(
        policy,
        config,
        streaming,
        table=table,
        grid=grid,
        sink=sink,
        recent=recent,
        seed=seed,
        reference="duo" if grid is not None and table is None else "posym",
        match=match,
    )
    record = {
        "policy": policy,
        "streaming_asked": streaming,
        "streaming_fraction": built.streaming_fraction,
        "full_kv_heads": int(built.full.sum()),
        "kv_heads": int(built.full.size),
        "layers": built.n_layers,
        "query_heads": built.n_heads,
        "layer_windows": list(built.windows),
        "kept_fraction": {str(n): built.kept_fraction(n) for n in LENGTHS},
        "table": str(table_path) if table_path is not None else None,
        "where": list(where),
        "kv_table": str(kv_table) if kv_table is not None else None,
        "seed": seed,
        "match": match if policy == "random" else None,
        **(settings or {}),
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    io.write_text(output_file(out, "kv-policy", "full_attention_heads"), io.format_grid(built.full, as_bool=True))
    io.write_json(
        output_file(out, "kv-policy", "config"),
        {"sink_size": sink, "recent_size": recent, "posym": {**record, **io.manifest(record, seed=seed)}},
    )
    return record
