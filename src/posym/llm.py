"""Real Hugging Face models: loading, prompt sets, head scores and the Appendix H benchmark.

SPEC section 7. `load_model` opens a local causal-LM directory (RoPE models only, safetensors unless
the user opts in), the prompt builders render the binding task of arXiv 2511.11579 and the 1-hop
number/letter tasks of Appendix H as text for the model's own tokenizer, `score_prompts` runs the
exact head scores of `posym.scores` on them, and `run_bench` measures Appendix H accuracy on a local
model or on any OpenAI-compatible chat endpoint (standard-library HTTP, retries, the key never logged).
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from posym.errors import PosymError
from posym.figures import pyplot, save_figure

# Model types whose Hugging Face implementation applies rotary embeddings inside attention.
ROPE_MODEL_TYPES = ("gptj", "gpt_neox", "llama", "mistral", "qwen2")
# Files from which AutoTokenizer can build a tokenizer (fast JSON, SentencePiece, GPT-2 BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
BENCH_SIZES = (12, 16, 24, 32, 48, 64, 80, 100, 150, 200, 300)
# Table 3 of 2605 (accuracy number / letter) at target-window sizes 12, 32, 100, 300.
PAPER_TABLE3 = {
    "GPT-5.4": {12: (0.98, 0.96), 32: (0.45, 0.99), 100: (0.08, 0.85), 300: (0.06, 0.40)},
    "GPT-5.5": {12: (0.55, 0.87), 32: (0.23, 0.96), 100: (0.07, 0.66), 300: (0.04, 0.50)},
    "Claude Sonnet 3.7": {12: (0.40, 0.92), 32: (0.15, 0.88), 100: (0.06, 0.86), 300: (0.05, 0.80)},
}
SCREEN_TASK, SCREEN_SIZE, SCREEN_ACC = "letter", 16, 0.85


# ---- loading ------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    """A causal LM ready for scoring: eager attention, eval mode, on its device."""

    model: Any
    tokenizer: Any
    name: str
    model_type: str
    max_positions: int
    device: str


def resolve_device(device: str) -> str:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a PosymError."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise PosymError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PosymError("--device cuda was asked for but torch sees no CUDA GPU")
    return device


def check_model_dir(model_dir: str | os.PathLike, *, allow_pickle: bool = False) -> dict:
    """Validate a model directory without loading weights; return its config.json as a dict."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise PosymError(f"{path} is not a Hugging Face model directory (no config.json)")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PosymError(f"{path / 'config.json'} is not valid JSON: {exc}") from None
    model_type = config.get("model_type")
    if model_type not in ROPE_MODEL_TYPES:
        raise PosymError(
            f"{path} holds a {model_type!r} model, which posym cannot score: head scores need rotary "
            f"position embeddings (RoPE) in one of {', '.join(ROPE_MODEL_TYPES)}"
        )
    if not any(path.glob("*.safetensors")):
        if not any(path.glob("*.bin")):
            raise PosymError(f"{path} has no weights (no *.safetensors file)")
        if not allow_pickle:
            raise PosymError(
                f"{path} only has pickle weights (*.bin); unpickling can run arbitrary code, so posym "
                "reads safetensors only: convert the weights, or pass --allow-pickle if you trust the file"
            )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise PosymError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return config


def load_model(
    model_dir: str | os.PathLike, *, device: str = "auto", dtype: str = "float32", allow_pickle: bool = False
) -> LoadedModel:
    """Load a local RoPE causal LM and its tokenizer with eager attention (so scores can read it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise PosymError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    config = check_model_dir(model_dir, allow_pickle=allow_pickle)
    device = resolve_device(device)
    safetensors = any(Path(model_dir).glob("*.safetensors"))
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise PosymError(f"cannot load the tokenizer of {model_dir}: {str(exc).splitlines()[0]}") from None
    # weights_only=True: even with --allow-pickle, torch's restricted unpickler refuses code objects.
    from posym.model import from_pretrained

    model = from_pretrained(AutoModelForCausalLM, model_dir, dtype=dtypes[dtype], attn_implementation="eager",
                            use_safetensors=safetensors, weights_only=True)
    model.eval().to(device)
    max_positions = getattr(model.config, "max_position_embeddings", None) or config.get("n_positions")
    return LoadedModel(model, tokenizer, Path(model_dir).name, config["model_type"], int(max_positions), device)


def encode(loaded: LoadedModel, text: str):
    """Token ids of `text` as a [1, T] tensor on the model's device; too long or too short is an error."""
    import torch

    ids = loaded.tokenizer(text).input_ids
    if len(ids) > loaded.max_positions:
        raise PosymError(
            f"a prompt has {len(ids)} tokens but {loaded.name} has only {loaded.max_positions} positions"
        )
    if len(ids) < 3:
        raise PosymError(f"a prompt needs at least 3 tokens to swap two keys before the query: {text!r}")
    return torch.tensor([ids], device=loaded.device)  # [1, T]


# ---- prompts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, the expected continuation and where to query it."""

    text: str
    answer: str | None = None
    focus: str | None = None  # substring whose LAST occurrence's final token is the 'name' query
    meta: dict = field(default_factory=dict)


NAMES = ("Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack", "Laura", "Mark")
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown")


def binding_prompts(n: int, *, n_facts: int = 4, seed: int = 0) -> list[Prompt]:
    """Entity-attribute binding prompts of 2511: 'Alice likes red. ... What colour does Alice like? Alice likes'."""
    if not 2 <= n_facts <= min(len(NAMES), len(COLOURS)):
        raise PosymError(f"n_facts must be between 2 and {min(len(NAMES), len(COLOURS))}, got {n_facts}")
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        names, colours = rng.sample(NAMES, n_facts), rng.sample(COLOURS, n_facts)
        asked = rng.randrange(n_facts)
        facts = " ".join(f"{a} likes {c}." for a, c in zip(names, colours))
        text = f"{facts} What colour does {names[asked]} like? {names[asked]} likes"
        prompts.append(Prompt(text, colours[asked], names[asked], {"set": "binding", "index": i}))
    return prompts


INSTRUCTIONS = {
    "number": (
        "Each puzzle below is one line of tokens separated by spaces. The first {target} tokens are "
        "symbols, the next {pretarget} are whole numbers, and the final token is a whole number n. "
        "Start at the final token, step n tokens to the left, and give the symbol you reach. "
        "Reply with that symbol and nothing else."
    ),
    "letter": (
        "Each puzzle below is one line of tokens separated by spaces. The first {target} tokens are a "
        "letter followed by a digit, and every later token is a pair of letters. Read the second letter "
        "of the final token, find the one earlier token that begins with that letter, and give that "
        "token. Reply with that token and nothing else."
    ),
}


def bench_prompts(task: str, size: int, n: int, *, seed: int = 0) -> list[Prompt]:
    """1-hop Appendix H prompts (our wording): instructions, three worked examples, then the puzzle.

    `size` is the target-window size; the pre-target window keeps the paper's 8 tokens. Puzzles
    come from the test split and worked examples from the train split, both of `seed` (= run).
    """
    from posym.tasks import decode, generate, task_config

    if task not in INSTRUCTIONS:
        raise PosymError(f"task must be number or letter, got {task!r}")
    extra = {"int_range": size + 8} if task == "number" else {}
    config = task_config(task, target_size=size, max_hops=1, **extra)
    puzzles = generate(config, n, seed, "test")
    examples = generate(config, 3 * n, seed, "train")
    head = INSTRUCTIONS[task].format(target=size, pretarget=config.pretarget_size)
    prompts = []
    for i in range(n):
        shots = [f"Example {k + 1}: {decode(config, examples.input_ids[3 * i + k])}\n"
                 f"Answer: {decode(config, examples.answer[3 * i + k: 3 * i + k + 1])}" for k in range(3)]
        body = "\n\n".join([head, *shots, f"Puzzle: {decode(config, puzzles.input_ids[i])}\nAnswer:"])
        answer = decode(config, puzzles.answer[i: i + 1])
        prompts.append(Prompt(body, answer, None, {"set": task, "size": size, "index": i}))
    return prompts

def read_jsonl(path: str | os.PathLike) -> list[Prompt]:
    """Prompts from a JSONL file: one object per line with "text" and optional "answer" and "focus"."""
    path = Path(path)
    if not path.is_file():
        raise PosymError(f"prompt file {path} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PosymError(f"{path} line {number} is not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise PosymError(f'{path} line {number} must be an object with a "text" string')
        unknown = sorted(set(obj) - {"text", "answer", "focus"})
        if unknown:
            raise PosymError(f"{path} line {number} has unknown key {unknown[0]!r} (text, answer, focus)")
        prompts.append(Prompt(obj["text"], obj.get("answer"), obj.get("focus"), {"set": path.name, "index": number}))
    if not prompts:
        raise PosymError(f"prompt file {path} holds no prompts")
    return prompts


def query_position(loaded: LoadedModel, prompt: Prompt, query: str) -> int:
    """Token index scored as the query: 'last' token, or the final token of the prompt's focus ('name')."""
    if query == "last":
        return len(loaded.tokenizer(prompt.text).input_ids) - 1
    if query != "name":
        raise PosymError(f"query must be 'last' or 'name', got {query!r}")
    if not prompt.focus or prompt.focus not in prompt.text:
        raise PosymError("--query name needs prompts with a focus name (the binding set, or a JSONL 'focus')")
    if not loaded.tokenizer.is_fast:
        raise PosymError("--query name needs a fast tokenizer (tokenizer.json) to map characters to tokens")
    last_char = prompt.text.rindex(prompt.focus) + len(prompt.focus) - 1
    return loaded.tokenizer(prompt.text).char_to_token(last_char)


# ---- backends -----------------------------------------------------------------------------------


def answer_token(tokenizer, prompt: str, answer: str) -> int:
    """Id of the answer's first token as the tokenizer splits `prompt + ' ' + answer`."""
    head = tokenizer(prompt).input_ids
    full = tokenizer(f"{prompt} {answer}").input_ids
    if full[: len(head)] != head or len(full) == len(head):
        # The join merged across the boundary: fall back to the answer tokenized on its own.
        return tokenizer(f" {answer}", add_special_tokens=False).input_ids[0]
    return full[len(head)]


def local_correct(loaded: LoadedModel, prompt: Prompt) -> tuple[bool, str]:
    """Greedy next token of a local model vs the answer's first token: (correct, predicted text)."""
    import torch

    ids = encode(loaded, prompt.text)  # [1, T]
    with torch.no_grad():
        logits = loaded.model(input_ids=ids).logits[0, -1]  # [vocab]
    predicted = int(logits.argmax())
    return predicted == answer_token(loaded.tokenizer, prompt.text, prompt.answer), loaded.tokenizer.decode([predicted])


@dataclass
class Endpoint:
    """An OpenAI-compatible chat/completions endpoint."""

    base_url: str
    """Base URL up to the version, e.g. https://api.openai.com/v1 (posym appends /chat/completions)."""
    model_name: str
    """The "model" field sent with every request."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key itself is never stored)."""
    timeout_s: float = 60.0
    """Seconds to wait for one HTTP reply before counting the attempt as failed."""
    retries: int = 3
    """Extra attempts after a timeout, a connection error or an HTTP 408/429/5xx reply."""
    backoff_s: float = 1.0
    """Wait before retry k is backoff_s * 2**k seconds."""
    max_tokens: int = 16
    """Reply length cap: the answer is one token, reasoning is off."""


def _api_key(endpoint: Endpoint) -> str | None:
    if endpoint.api_key_env is None:
        return None
    key = os.environ.get(endpoint.api_key_env)
    if not key:
        raise PosymError(f"environment variable {endpoint.api_key_env} (named by --api-key-env) is not set")
    return key


def chat(endpoint: Endpoint, content: str) -> str:
    """One greedy chat completion; retries transient failures, then raises a PosymError without the key."""
    url = endpoint.base_url.rstrip("/") + "/chat/completions"
    key = _api_key(endpoint)
    body = json.dumps({
        "model": endpoint.model_name, "messages": [{"role": "user", "content": content}],
        "temperature": 0, "max_tokens": endpoint.max_tokens,
    }).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    last = ""
    for attempt in range(endpoint.retries + 1):
        if attempt:
            time.sleep(endpoint.backoff_s * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=endpoint.timeout_s) as reply:
                payload = json.loads(reply.read().decode("utf-8"))
            return payload["choices"][0]["message"]["content"] or ""
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:200]
            last = f"HTTP {exc.code} {exc.reason}: {detail.replace(key, '***') if key else detail}"
            if exc.code not in (408, 429) and exc.code < 500:
                break  # a client error (bad key, bad model name) will not go away by retrying
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            last = f"no reply ({getattr(exc, 'reason', exc)})"
        except (ValueError, KeyError, IndexError, TypeError):
            last = "the reply is not an OpenAI-style chat completion"
            break
    raise PosymError(f"endpoint {url} failed after {attempt + 1} attempt(s): {last}")


def reply_answer(reply: str) -> str:
    """The first word of a chat reply, without surrounding punctuation or quotes."""
    words = reply.split()
    return words[0].strip(".,;:!?\"'`*()[]") if words else ""


def endpoint_correct(endpoint: Endpoint, prompt: Prompt) -> tuple[bool, str]:
    """Ask the endpoint and compare its first word with the answer (case-insensitive)."""
    predicted = reply_answer(chat(endpoint, prompt.text))
    return predicted.lower() == prompt.answer.lower(), predicted


# ---- benchmark (Appendix H) ---------------------------------------------------------------------


def run_bench(
    judge: Callable[[Prompt], tuple[bool, str]],
    *,
    tasks: Iterable[str] = ("number", "letter"),
    sizes: Iterable[int] = BENCH_SIZES,
    runs: int = 5,
    n: int = 20,
    progress: Callable[[int], None] | None = None,
):
    """One row per question: task, size, run, index, answer, predicted, correct. Run r uses seed r."""
    import pandas as pd

    rows = []
    for task in tasks:
        for size in sizes:
            for run in range(runs):
                for index, prompt in enumerate(bench_prompts(task, size, n, seed=run)):
                    correct, predicted = judge(prompt)
                    rows.append({"task": task, "size": size, "run": run, "index": index,
                                 "answer": prompt.answer, "predicted": predicted, "correct": bool(correct)})
                    if progress:
                        progress(1)
    return pd.DataFrame(rows)


def bench_summary(frame):
    """Accuracy per (task, size): mean and population std over runs, runs and questions per run."""
    per_run = frame.groupby(["task", "size", "run"])["correct"].agg(acc="mean", questions="size").reset_index()
    out = per_run.groupby(["task", "size"]).agg(
        acc_mean=("acc", "mean"), acc_std=("acc", lambda a: float(a.std(ddof=0))),
        runs=("run", "count"), per_run=("questions", "first"),
    )
    return out.reset_index()


def screening(summary) -> dict:
    """The paper's model filter (>= 85% on the letter task at size 16), reported, never applied."""
    hit = summary[(summary.task == SCREEN_TASK) & (summary["size"] == SCREEN_SIZE)]
    acc = float(hit.acc_mean.iloc[0]) if len(hit) else None
    return {"rule": f"acc >= {SCREEN_ACC} on the {SCREEN_TASK} task at size {SCREEN_SIZE}",
            "accuracy": acc, "passes": None if acc is None else acc >= SCREEN_ACC}


def bench_table(summary, label: str) -> str:
    """Markdown Table 3: our accuracy (mean +- std) beside the paper's models, number / letter."""
    cell = {(r.task, r.size): f"{r.acc_mean:.2f} ± {r.acc_std:.2f}" for r in summary.itertuples()}
    models = list(PAPER_TABLE3)
    head = f"| size | {label} number | {label} letter | " + " | ".join(f"{m} (paper) n / l" for m in models)
    lines = [head + " |", "|" + " --- |" * (3 + len(models))]
    for size in sorted(set(summary["size"])):
        paper = [PAPER_TABLE3[m].get(size) for m in models]
        paper_cells = [f"{p[0]:.2f} / {p[1]:.2f}" if p else "" for p in paper]
        lines.append(f"| {size} | {cell.get(('number', size), '')} | {cell.get(('letter', size), '')} | "
                     + " | ".join(paper_cells) + " |")
    screen = screening(summary)
    verdict = "not measured" if screen["passes"] is None else (
        f"{screen['accuracy']:.2f}, {'passes' if screen['passes'] else 'fails'}")
    lines.append(f"\nScreening rule of the paper ({screen['rule']}): {verdict} (reported, not applied).")
    return "\n".join(lines) + "\n"


# ---- figures ------------------------------------------------------------------------------------


def plot_bench(summary, label: str, stem: str | os.PathLike) -> list[Path]:
    """Accuracy vs target-window size per task, ours with std bars, the paper's models dashed."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for k, (ax, task) in enumerate(zip(axes, ("number", "letter"))):
        ours = summary[summary.task == task].sort_values("size")
        ax.errorbar(ours["size"], ours.acc_mean, yerr=ours.acc_std, marker="o", capsize=3, label=label)
        for model, table in PAPER_TABLE3.items():
            sizes = sorted(table)
            ax.plot(sizes, [table[s][k] for s in sizes], "--", marker="x", alpha=0.7, label=f"{model} (paper)")
        ax.set(xscale="log", xlabel="target-window size", title=f"{task} task (1 hop)", ylim=(-0.02, 1.02))
        ticks = sorted(set(summary["size"]) | {12, 32, 100, 300})
        ax.set_xticks(ticks, labels=[str(t) for t in ticks], fontsize=7)
        ax.minorticks_off()
    axes[0].set_ylabel("accuracy")
    axes[1].legend(fontsize=8)
    return save_figure(fig, stem)


def layer_summary(heads) -> tuple[Any, float]:
    """Per-layer medians of the head scores, and Pearson r between the s_pos and s_sym maps over heads.

    `heads` has one row per (layer, head) with prompt-mean s_pos and s_sym (posym.scores.summarize).
    r is NaN when either map is constant (e.g. every head exactly uniform).
    """
    layers = heads.groupby("layer").agg(
        median_s_pos=("s_pos", "median"), median_s_sym=("s_sym", "median"), heads=("head", "count")
    ).reset_index()
    constant = heads.s_pos.nunique() < 2 or heads.s_sym.nunique() < 2
    r = float("nan") if constant else float(heads.s_pos.corr(heads.s_sym))
    return layers, r


def plot_heads(heads, r: float, stem: str | os.PathLike) -> list[Path]:
    """Layer x head heatmaps of s_pos and s_sym, and the positional-symbolic plane (one dot per head)."""
    import numpy as np

    plt = pyplot()
    n_layers, n_heads = int(heads.layer.max()) + 1, int(heads["head"].max()) + 1
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    for ax, key in zip(axes, ("s_pos", "s_sym")):
        grid = np.full((n_layers, n_heads), np.nan)  # [layers, heads]
        grid[heads.layer.to_numpy(), heads["head"].to_numpy()] = heads[key].to_numpy()
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=1)
        ax.set(xlabel="head", ylabel="layer", title=key)
        fig.colorbar(image, ax=ax)
    dots = axes[2].scatter(heads.s_pos, heads.s_sym, c=heads.layer, cmap="plasma", s=14)
    axes[2].plot([0, 1], [1, 0], ":", color="grey")
    axes[2].set(xlabel="s_pos", ylabel="s_sym", title=f"heads (Pearson r = {r:.2f})", xlim=(-0.05, 1.05),
                ylim=(-0.05, 1.05))
    fig.colorbar(dots, ax=axes[2], label="layer")
    return save_figure(fig, stem)


# ---- command drivers ----------------------------------------------------------------------------


def parse_list(text: str, kind: type) -> list:
    """'a,b,c' -> [kind(a), kind(b), kind(c)]; a bad item is a PosymError."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        values = [kind(item) for item in items]
    except ValueError:
        raise PosymError(f"cannot read {text!r} as a comma-separated list of {kind.__name__} values") from None
    if not values:
        raise PosymError("an empty list was given")
    return values


def parse_heads(text: str | None) -> list[tuple[int, int]]:
    """'0.1,5.3' -> [(0, 1), (5, 3)] (layer.head pairs)."""
    if not text:
        return []
    heads = []
    for item in parse_list(text, str):
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            raise PosymError(f"--heads wants LAYER.HEAD items like 3.1, got {item!r}")
        heads.append((int(layer), int(head)))
    return heads


def _heads_by_layer(heads: list[tuple[int, int]]) -> dict[int, list[int]]:
    """(layer, head) pairs -> {layer: [heads]} in ascending order."""
    out: dict[int, list[int]] = {}
    for layer, head in sorted(set(heads)):
        out.setdefault(layer, []).append(head)
    return out


def prompt_set(name: str, *, text: str | None = None, n: int = 20, size: int = 12, seed: int = 0) -> list[Prompt]:
    """--text, a built-in set (binding, number, letter) or a JSONL file, as Prompts."""
    if text is not None:
        return [Prompt(text, meta={"set": "text", "index": 0})]
    if n < 1:
        raise PosymError(f"--n must be at least 1, got {n}")
    if name == "binding":
        return binding_prompts(n, seed=seed)
    if name in INSTRUCTIONS:
        return bench_prompts(name, size, n, seed=seed)
    if name.endswith(".jsonl") or Path(name).is_file():
        return read_jsonl(name)
    raise PosymError(f"--prompts must be binding, number, letter or a JSONL file, got {name!r}")


def make_judge(model_dir, *, base_url=None, model_name=None, api_key_env=None, timeout_s=60.0, retries=3,
               device="auto", dtype="float32", allow_pickle=False) -> tuple[Callable, str]:
    """The answer checker of llm-bench and a label: a local model, or an endpoint (exactly one)."""
    if (model_dir is None) == (base_url is None):
        raise PosymError("give either a local MODEL_DIR or --base-url (with --model-name), not both or neither")
    if base_url is not None:
        if not model_name:
            raise PosymError("--base-url needs --model-name (the model the endpoint should run)")
        if not base_url.startswith(("http://", "https://")):
            raise PosymError(f"--base-url must start with http:// or https://, got {base_url!r}")
        endpoint = Endpoint(base_url, model_name, api_key_env, timeout_s=timeout_s, retries=retries)
        _api_key(endpoint)  # fail before the first question if the variable is missing
        return (lambda prompt: endpoint_correct(endpoint, prompt)), model_name.replace("/", "_")
    loaded = load_model(model_dir, device=device, dtype=dtype, allow_pickle=allow_pickle)
    return (lambda prompt: local_correct(loaded, prompt)), loaded.name


def write_bench(judge, out_dir, *, label: str, tasks, sizes, runs: int, n: int, settings: dict,
                progress=None) -> str:
    """Run the benchmark and write bench.parquet, summary.parquet, table.md, bench.png/svg, manifest.json."""
    from posym.io import manifest, write_json, write_parquet, write_text

    if runs < 1 or n < 1:
        raise PosymError(f"--runs and --n must be at least 1, got {runs} and {n}")
    out_dir = Path(out_dir)
    frame = run_bench(judge, tasks=tasks, sizes=sizes, runs=runs, n=n, progress=progress)
    summary = bench_summary(frame)
    table = bench_table(summary, label)
    write_parquet(out_dir / "bench.parquet", frame)
    write_parquet(out_dir / "summary.parquet", summary)
    write_text(out_dir / "table.md", table)
    plot_bench(summary, label, out_dir / "bench")
    write_json(out_dir / "manifest.json", manifest(settings, seed=None, screening=screening(summary)))
    return table


def plot_planes(planes, stem: str | os.PathLike) -> list[Path]:
    """Per chosen head: s_pos and s_sym of every RoPE plane vs frequency ID (x = 0: position-free dims)."""
    plt = pyplot()
    chosen = list(planes.groupby(["layer", "head"]))
    fig, axes = plt.subplots(len(chosen), 1, figsize=(8, 2.6 * len(chosen)), squeeze=False)
    for ax, ((layer, head), rows) in zip(axes[:, 0], chosen):
        rows = rows.sort_values("frequency_id")
        ax.plot(rows.frequency_id, rows.s_pos, "o-", ms=3, label="s_pos")
        ax.plot(rows.frequency_id, rows.s_sym, "s-", ms=3, label="s_sym")
        ax.set(title=f"layer {layer} head {head}", ylabel="score", ylim=(-0.05, 1.05))
    axes[-1, 0].set_xlabel("frequency ID (1 = fastest plane; 0 = non-rotary dims)")
    axes[0, 0].legend(fontsize=8)
    return save_figure(fig, stem)


def write_scores(loaded: LoadedModel, prompts: list[Prompt], out_dir, *, query: str = "last",
                 heads: list[tuple[int, int]] = (), tau: float = 1e-4, settings: dict, progress=None) -> dict:
    """Score every head on `prompts` and write scores/heads/layers(/planes).parquet, figures, summary.json.

    Files: scores.parquet (prompt, query, layer, head, s_pos, s_sym, entropy, n_swaps), heads.parquet
    (prompt means and labels, posym.scores.summarize), layers.parquet (per-layer medians),
    planes.parquet (prompt-mean per-plane scores of --heads), heads.png/svg, planes.png/svg,
    summary.json (manifest, Pearson r, per-layer medians). Returns the summary dict.
    """
    import pandas as pd

    from posym.geometry import plane_scores
    from posym.io import manifest, write_json, write_parquet
    from posym.scores import score_model, summarize

    config = loaded.model.config
    for layer, head in heads:
        if not (layer < config.num_hidden_layers and head < config.num_attention_heads):
            raise PosymError(f"--heads {layer}.{head} does not exist: the model has {config.num_hidden_layers} "
                             f"layers of {config.num_attention_heads} heads")
    ids = [encode(loaded, p.text)[0] for p in prompts]  # checks every length before any work
    queries = [[query_position(loaded, p, query)] for p in prompts]
    frame = score_model(loaded.model, ids, queries, tau=tau, progress=progress)
    head_means = summarize(frame)
    layers, r = layer_summary(head_means)
    out_dir = Path(out_dir)
    write_parquet(out_dir / "scores.parquet", frame)
    write_parquet(out_dir / "heads.parquet", head_means)
    write_parquet(out_dir / "layers.parquet", layers)
    plot_heads(head_means, r, out_dir / "heads")
    if heads:
        # one pass per chosen layer scores all of its chosen heads (posym.geometry's channel engine)
        per_prompt = pd.concat([plane_scores(loaded.model, ids, queries, layers=[layer], heads=chosen, tau=tau)
                                for layer, chosen in _heads_by_layer(heads).items()])
        planes = per_prompt.groupby(["layer", "head", "channel", "frequency_id"], as_index=False)[
            ["s_pos", "s_sym", "max_logit"]].mean()
        write_parquet(out_dir / "planes.parquet", planes)
        plot_planes(planes, out_dir / "planes")
    summary = {**manifest(settings, seed=settings.get("seed")), "model_type": loaded.model_type,
               "prompts": len(prompts), "pearson_r": r, "layers": layers.to_dict("records")}
    write_json(out_dir / "summary.json", summary)
    return summary
