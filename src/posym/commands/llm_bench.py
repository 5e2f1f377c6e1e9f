"""The Appendix H benchmark of 2605: 1-hop number/letter prompts, answer checkers, Table 3.

docs/method.md section 7. `bench_prompts` renders 1-hop number and letter puzzles (our instructions and three
worked examples) as text, a judge answers each one by the same rule, the first word of the reply
against the whole answer: the greedy continuation of a local model (`local_correct`, as many tokens
as the answer has plus one) or the reply of an OpenAI-compatible chat endpoint (`endpoint_correct`,
standard-library HTTP with retries and backoff; the API key is read from an environment variable and
never stored, logged or echoed). `run_bench` / `write_bench` collect accuracy per task, size and run
and write it beside the paper's Table 3 (`bench_table`, `plot_bench`); the paper's screening rule is
reported (`screening`), never applied. Models load through `posym.commands.llm_scores`.

Marked variant (`markers=True`, `posym llm-bench --markers on|both`): the same puzzles with every
target-window token tagged `@<slot>`, its place in the line counting from 0 (`n@0 h@1 ...`), the text
of `posym.core.tasks`' slot markers; one instruction sentence says what the tag means. The expected answer
stays the untagged token, so both variants are scored on the same answers, side by side.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from posym.core.tasks import reply_answer, same_answer
from posym.errors import PosymError
from posym.figures import save_figure, subplots
from posym.io import manifest, parse_json, write_json, write_parquet, write_text
from posym.models import LoadedModel, load, tokenize
from posym.parallel import cpu_workers, forked_map
from posym.prompts import Prompt, bench_prompts
from posym.runs import figure_file, output_file

BENCH_SIZES = (12, 16, 24, 32, 48, 64, 80, 100, 150, 200, 300)
# Table 3 of 2605 (accuracy number / letter) at target-window sizes 12, 32, 100, 300.
PAPER_TABLE3 = {
    "GPT-5.4": {12: (0.98, 0.96), 32: (0.45, 0.99), 100: (0.08, 0.85), 300: (0.06, 0.40)},
    "GPT-5.5": {12: (0.55, 0.87), 32: (0.23, 0.96), 100: (0.07, 0.66), 300: (0.04, 0.50)},
    "Claude Sonnet 3.7": {12: (0.40, 0.92), 32: (0.15, 0.88), 100: (0.06, 0.86), 300: (0.05, 0.80)},
}
SCREEN_TASK, SCREEN_SIZE, SCREEN_ACC = "letter", 16, 0.85


# ---- backends -----------------------------------------------------------------------------------


def answer_tokens(tokenizer, prompt: str, answer: str) -> list[int]:
    """Ids of the whole answer as the tokenizer splits `prompt + ' ' + answer` (e.g. " e" + "3" for "e3")."""
    head = tokenizer(prompt).input_ids
    full = tokenizer(f"{prompt} {answer}").input_ids
    if full[: len(head)] != head or len(full) == len(head):
        # The join merged across the boundary: fall back to the answer tokenized on its own.
        return tokenizer(f" {answer}", add_special_tokens=False).input_ids
    return full[len(head) :]


def greedy_reply(loaded: LoadedModel, text: str, max_new_tokens: int) -> str:
    """The model's greedy continuation of `text`, `max_new_tokens` tokens, decoded."""
    import torch

    ids = tokenize(loaded, text)  # [1, T]
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else loaded.tokenizer.eos_token_id
    with torch.no_grad():
        out = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )  # [1, T + new]
    return loaded.tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)


def local_correct(loaded: LoadedModel, prompt: Prompt) -> tuple[bool, str]:
    """Whole-answer judge of a local model, the endpoint's rule: greedy-decode as many tokens as the
    answer has plus one (so "e3x" for "e3" is caught), take the reply's first word, compare it with
    the answer (case-insensitive). Returns (correct, predicted word)."""
    n_tokens = len(answer_tokens(loaded.tokenizer, prompt.text, prompt.answer))
    predicted = reply_answer(greedy_reply(loaded, prompt.text, n_tokens + 1))
    return same_answer(predicted, prompt.answer), predicted


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
    """The key, without the surrounding white space a key file saved on Windows adds (CR LF). A key that
    still holds a character an HTTP header cannot carry (a line break, a control or non-ASCII character)
    is refused by position, never shown: http.client would put `Bearer <key>` in its traceback."""
    if endpoint.api_key_env is None:
        return None
    name = endpoint.api_key_env
    key = os.environ.get(name, "").strip() if "=" not in name and "\0" not in name else ""
    if not key:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]{0,63}", name):  # lower case, dashes, 64+ characters: maybe a key
            raise PosymError(
                f"--api-key-env takes the name of an environment variable (upper-case letters, digits, _), and "
                f"no variable of the {len(name)}-character name given is set (the name is not shown: it may be "
                "the key itself); export the key as e.g. OPENAI_API_KEY and pass --api-key-env OPENAI_API_KEY"
            )
        raise PosymError(f"environment variable {name} (named by --api-key-env) is not set")
    bad = next((k for k, c in enumerate(key) if not "!" <= c <= "~"), None)
    if bad is not None:
        raise PosymError(
            f"the API key in {endpoint.api_key_env} holds a character an HTTP header cannot carry (a "
            f"space, line break, control or non-ASCII character) at position {bad + 1} of {len(key)}; "
            "fix the key file it came from"
        )
    return key


def check_url(base_url: str) -> str:
    """`--base-url` checked before the first question: http(s), a host, a port in 1..65535. Returns the
    URL as error lines show it, without any user:password it carries."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(base_url)
        port = parts.port
    except ValueError as exc:  # e.g. "Port out of range 0-65535", an unclosed [ipv6
        raise PosymError(f"--base-url {shown_url(base_url)!r} is not a usable URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise PosymError(f"--base-url must start with http:// or https://, got {shown_url(base_url)!r}")
    if not parts.hostname:
        raise PosymError(f"--base-url {shown_url(base_url)!r} names no host")
    if port == 0:
        raise PosymError(f"--base-url {shown_url(base_url)!r}: port 0 is not a port an endpoint listens on")
    return shown_url(base_url)


def shown_url(url: str) -> str:
    """`url` as an error line or a manifest may show it: without the user:password of its authority, the
    value of every query parameter (`?api_key=...`, a common way to pass a token) as `***`, no fragment,
    cut to 200 characters.

    >>> shown_url("https://me:pw@host/v1?key=sk-123&x=1#frag")
    'https://host/v1?key=***&x=***'
    """
    scheme, sep, rest = url.partition("://")
    if sep:
        authority, slash, path = rest.partition("/")
        url = f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"
    url, _, _ = url.partition("#")
    url, mark, query = url.partition("?")
    if mark:
        url += "?" + "&".join(f"{item.partition('=')[0]}=***" for item in query.split("&"))
    return url[:200]


def url_secrets(url: str) -> list[str]:
    """What `url` may carry as a secret (its password and query values of 4 characters or more), for
    `_masked`: an endpoint's error may quote the request URL.

    >>> url_secrets("https://me:pw-long@host/v1?api_key=sk-123&x=1")
    ['pw-long', 'sk-123']
    """
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    values = [parts.password or "", *(v for _, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))]
    return [v for v in values if len(v) >= 4]


def completions_url(base_url: str) -> str:
    """The chat completions URL of `--base-url`: /chat/completions appended to its path, before any query.

    >>> completions_url("https://host/v1/?key=abc")
    'https://host/v1/chat/completions?key=abc'
    """
    import urllib.parse

    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions", fragment=""))


MAX_REPLY_BYTES = 64 * 2**20
"""Largest reply body read from an endpoint (the whole-reply timeout bounds the time as well)."""


def key_spellings(key: str) -> list[str]:
    r"""Every way a reply may spell `key`: as it is, JSON-escaped (`/` as `\/`, as PHP writes it; any
    character as `\u00XX`, as Go writes `<>&`) and URL-encoded (an error that quotes the request URL),
    longest first. A key of base64 characters (`/`, `+`) echoed in a JSON error body would otherwise pass
    the mask.

    >>> key_spellings("a/b")
    ['\\u0061\\u002f\\u0062', 'a\\u002fb', 'a%2Fb', 'a\\/b', 'a/b']
    """
    import urllib.parse

    escaped = json.dumps(key)[1:-1]  # printable ASCII only (`_api_key`): `"` and `\\` escaped
    spellings = {
        key,
        escaped,
        escaped.replace("/", "\\/"),
        urllib.parse.quote(key, safe=""),
        urllib.parse.quote_plus(key),
        "".join(f"\\u{ord(c):04x}" for c in key),
        "".join(c if c.isalnum() else f"\\u{ord(c):04x}" for c in key),
    }
    return sorted(spellings, key=lambda s: (-len(s), s))


KEY_RUN = 8
"""The shortest stretch of the API key that `_masked` masks wherever a reply holds it (a third of a
longer key): an endpoint echoing the key with a character changed, cut, or starred in the middle
(`sk-abc...xyz`) must not print the rest."""


def _masked(text: str, key: str | tuple[str, ...] | None, limit: int | None = 200) -> str:
    """`text` with every spelling of the API key (`key_spellings`) replaced, then every stretch of
    `KEY_RUN` or more characters of the key (a near-complete echo), then cut to `limit` characters (in
    that order: a key that straddles the cut would otherwise survive it half).

    >>> _masked("bad key sk-abcdefghijklmnopqrstuvwx! (sk-abcd...wxyz)", "sk-abcdefghijklmnopqrstuvwxyz")
    'bad key ***! (sk-abcd...wxyz)'
    """
    if isinstance(key, tuple):  # several secrets (the key, the URL's query values): each in turn
        for one in key:
            text = _masked(text, one, None)
        return text if limit is None else text[:limit]
    for spelling in key_spellings(key) if key else ():
        text = re.sub(re.escape(spelling), "***", text, flags=re.IGNORECASE)  # %2f as %2F, \\u002F as \\u002f
    if key:
        run = max(min(KEY_RUN, len(key)), len(key) // 3)
        lower, hidden = text.lower(), [False] * len(text)
        for start in range(len(key) - run + 1):
            piece = key[start : start + run].lower()
            at = lower.find(piece)
            while at >= 0:
                hidden[at : at + run] = [True] * run
                at = lower.find(piece, at + 1)
        text = "".join(
            "***" if hide and (k == 0 or not hidden[k - 1]) else "" if hide else c
            for k, (c, hide) in enumerate(zip(text, hidden))
        )
    return text if limit is None else text[:limit]


def _connection(url: str, timeout_s: float):
    """(connection, request target, extra request headers) for `url`, through the proxy the environment
    names for its scheme (HTTP_PROXY / HTTPS_PROXY, unless NO_PROXY lists the host), as urllib and
    requests do: plain HTTP asks the proxy for the absolute URL, HTTPS tunnels through it (CONNECT) so
    TLS still ends at the endpoint. A proxy's user:password becomes its Proxy-Authorization header (on
    the CONNECT for HTTPS, on the request itself for plain HTTP)."""
    import base64
    import http.client
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return kind(parts.hostname, parts.port, timeout=timeout_s), target, {}
    via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    auth = {}
    if via.username is not None:
        token = f"{urllib.parse.unquote(via.username)}:{urllib.parse.unquote(via.password or '')}"
        auth = {"Proxy-Authorization": "Basic " + base64.b64encode(token.encode()).decode()}
    connection = kind(via.hostname, via.port or (443 if via.scheme == "https" else 80), timeout=timeout_s)
    if parts.scheme == "https":
        connection.set_tunnel(parts.hostname, parts.port, headers=auth)
        return connection, target, {}
    return connection, url, auth


def _post(url: str, body: bytes, headers: dict, timeout_s: float) -> tuple[int, str, bytes]:
    """POST `body`, return (status, reason, reply body). The whole exchange (connect, headers, body) must
    end within `timeout_s`: a timer shuts the socket down at the deadline, so a server that trickles
    bytes cannot stretch one request (a per-read socket timeout would restart at every byte)."""
    import http.client
    import socket
    import threading

    connection, target, proxy_headers = _connection(url, timeout_s)
    expired, sockets = threading.Event(), []  # the socket itself: a closing reply detaches it from the connection

    def expire() -> None:
        expired.set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout_s, expire)
    timer.start()
    try:
        connection.connect()
        sockets.append(connection.sock)
        if expired.is_set():
            raise TimeoutError
        connection.request("POST", target, body, {**headers, **proxy_headers})
        reply = connection.getresponse()
        data = reply.read(MAX_REPLY_BYTES)
        if expired.is_set():  # the shutdown ended the read early: what came is only part of the reply
            raise TimeoutError
        return reply.status, reply.reason, data
    except (OSError, ValueError, http.client.HTTPException) as exc:  # TimeoutError is an OSError
        if expired.is_set():
            raise TimeoutError(f"no whole reply within {timeout_s:g} s") from None
        raise OSError(str(exc) or type(exc).__name__) from None
    finally:
        timer.cancel()
        connection.close()


def reply_content(payload) -> str:
    """The text of an OpenAI-style chat completion: `content` as a string, a number, or a list of parts
    ({"type": "text", "text": ...} or plain strings); anything else raises ValueError."""
    content = payload["choices"][0]["message"]["content"]
    if content is None:
        return ""
    if isinstance(content, (str, int, float)) and not isinstance(content, bool):
        return str(content)
    if isinstance(content, list):
        texts = [
            part if isinstance(part, str) else part.get("text") for part in content if isinstance(part, (str, dict))
        ]
        return "".join(t for t in texts if isinstance(t, str))
    raise ValueError(f"content of type {type(content).__name__}")


def chat(endpoint: Endpoint, content: str) -> str:
    """One greedy chat completion; retries transient failures, then raises a PosymError without the key."""
    url = completions_url(endpoint.base_url)
    key = _api_key(endpoint)
    secrets = (*([key] if key else []), *url_secrets(endpoint.base_url))
    body = json.dumps(
        {
            "model": endpoint.model_name,
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": endpoint.max_tokens,
        }
    ).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    last = ""
    for attempt in range(endpoint.retries + 1):
        if attempt:
            time.sleep(endpoint.backoff_s * 2 ** (attempt - 1))
        try:
            status, reason, data = _post(url, body, headers, endpoint.timeout_s)
        except (OSError, TimeoutError) as exc:
            last = f"no reply ({_masked(str(exc), secrets)})"
            continue
        if status != 200:  # the reason phrase is the server's text too: masked like the body
            last = _masked(f"HTTP {status} {reason}: {data.decode('utf-8', 'replace')}", secrets, 240)
            if status not in (408, 429) and status < 500:
                break  # a client error (bad key, bad model name) will not go away by retrying
            continue
        try:  # the bounded reader: a reply nested 100,000 deep is a bad reply, not a RecursionError
            content = reply_content(parse_json(data, "the reply"))
        except (PosymError, KeyError, IndexError, TypeError, AttributeError, ValueError):
            last = "the reply is not an OpenAI-style chat completion"
            break
        return _masked(content, secrets, None)  # an endpoint echoing the key gets it masked
    raise PosymError(f"endpoint {shown_url(url)} failed after {attempt + 1} attempt(s): {last}")


def endpoint_correct(endpoint: Endpoint, prompt: Prompt) -> tuple[bool, str]:
    """Ask the endpoint and compare its first word with the answer (case-insensitive)."""
    predicted = reply_answer(chat(endpoint, prompt.text))
    return same_answer(predicted, prompt.answer), predicted


# ---- benchmark (Appendix H) ---------------------------------------------------------------------


def run_bench(
    judge: Callable[[Prompt], tuple[bool, str]],
    *,
    tasks: Iterable[str] = ("number", "letter"),
    sizes: Iterable[int] = BENCH_SIZES,
    runs: int = 5,
    n: int = 20,
    markers: Iterable[bool] = (False,),
    progress: Callable[[int], None] | None = None,
    workers: int = 1,
):
    """One row per question: task, size, variant ("plain" or "marked", one per `markers` value), run,
    index, answer, predicted, correct. Run r uses seed r, so both variants ask the same puzzles.
    workers > 1 splits the questions over forked one-thread processes (`posym.parallel.forked_map`, for a
    local model on the CPU: the rows are the same up to float rounding, in the same order)."""
    import pandas as pd

    asked = [
        ({"task": task, "size": size, "variant": VARIANTS[bool(marked)], "run": run, "index": index}, prompt)
        for task in tasks
        for size in sizes
        for marked in markers
        for run in range(runs)
        for index, prompt in enumerate(bench_prompts(task, size, n, seed=run, markers=marked))
    ]
    judged = forked_map(judge, [prompt for _, prompt in asked], workers=workers, progress=progress)
    rows = [
        {**where, "answer": prompt.answer, "predicted": predicted, "correct": bool(correct)}
        for (where, prompt), (correct, predicted) in zip(asked, judged)
    ]
    return pd.DataFrame(rows)


VARIANTS = {False: "plain", True: "marked"}
"""Prompt variant name by `markers` value."""
MARKER_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}
"""`posym llm-bench --markers` values and the variants they run."""


def bench_summary(frame):
    """Accuracy per (task, size, variant): mean and sample std (ddof 1: NaN for one run) over runs, runs and
    questions per run."""
    keys = ["task", "size", "variant"]
    per_run = frame.groupby([*keys, "run"])["correct"].agg(acc="mean", questions="size").reset_index()
    out = per_run.groupby(keys).agg(
        acc_mean=("acc", "mean"),
        acc_std=("acc", lambda a: float(a.std(ddof=1))),
        runs=("run", "count"),
        per_run=("questions", "first"),
    )
    return out.reset_index()


def screening(summary) -> dict:
    """The paper's model filter (>= 85% on the plain letter task at size 16), reported, never applied."""
    hit = summary[(summary.task == SCREEN_TASK) & (summary["size"] == SCREEN_SIZE) & (summary.variant == "plain")]
    acc = float(hit.acc_mean.iloc[0]) if len(hit) else None
    return {
        "rule": f"acc >= {SCREEN_ACC} on the {SCREEN_TASK} task at size {SCREEN_SIZE}",
        "accuracy": acc,
        "passes": None if acc is None else acc >= SCREEN_ACC,
    }


def bench_table(summary, label: str) -> str:
    """Markdown Table 3: our accuracy (mean +- sample std over runs; the mean alone for one run) per prompt
    variant beside the paper's models (plain prompts only), number / letter."""
    cell = {
        (r.task, r.size, r.variant): f"{r.acc_mean:.2f}" + ("" if math.isnan(r.acc_std) else f" ± {r.acc_std:.2f}")
        for r in summary.itertuples()
    }
    models = list(PAPER_TABLE3)
    head = f"| size | variant | {label} number | {label} letter | " + " | ".join(f"{m} (paper) n / l" for m in models)
    lines = [head + " |", "|" + " --- |" * (4 + len(models))]
    variants = [v for v in VARIANTS.values() if v in set(summary.variant)]
    for size in sorted(set(summary["size"])):
        for variant in variants:
            paper = [PAPER_TABLE3[m].get(size) if variant == "plain" else None for m in models]
            paper_cells = [f"{p[0]:.2f} / {p[1]:.2f}" if p else "" for p in paper]
            lines.append(
                f"| {size} | {variant} | {cell.get(('number', size, variant), '')} | "
                f"{cell.get(('letter', size, variant), '')} | " + " | ".join(paper_cells) + " |"
            )
    screen = screening(summary)
    verdict = (
        "not measured"
        if screen["passes"] is None
        else (f"{screen['accuracy']:.2f}, {'passes' if screen['passes'] else 'fails'}")
    )
    lines.append(f"\nScreening rule of the paper ({screen['rule']}): {verdict} (reported, not applied).")
    return "\n".join(lines) + "\n"


def plot_bench(summary, label: str):
    """Accuracy vs target-window size per task, ours (per prompt variant) with std bars, the paper's
    models dashed."""
    fig, axes = subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for k, (ax, task) in enumerate(zip(axes, ("number", "letter"))):
        for variant, ours in summary[summary.task == task].sort_values("size").groupby("variant", sort=False):
            ax.errorbar(
                ours["size"],
                ours.acc_mean,
                yerr=ours.acc_std,
                marker="o",
                capsize=3,
                label=label if variant == "plain" else f"{label} ({variant})",
            )
        for model, table in PAPER_TABLE3.items():
            sizes = sorted(table)
            ax.plot(sizes, [table[s][k] for s in sizes], "--", marker="x", alpha=0.7, label=f"{model} (paper)")
        ax.set(xscale="log", xlabel="target-window size", title=f"{task} task (1 hop)", ylim=(-0.02, 1.02))
        ticks = sorted(set(summary["size"]) | {12, 32, 100, 300})
        ax.set_xticks(ticks, labels=[str(t) for t in ticks], fontsize=7)
        ax.minorticks_off()
    axes[0].set_ylabel("accuracy")
    axes[1].legend(fontsize=8)
    return fig


# ---- command drivers ----------------------------------------------------------------------------


def make_judge(
    model_dir,
    *,
    base_url=None,
    model_name=None,
    api_key_env=None,
    timeout_s=60.0,
    retries=3,
    device="auto",
    dtype="float32",
    allow_pickle=False,
    workers: int = 0,
) -> tuple[Callable, str, int]:
    """The answer checker of llm-bench, a label and the processes to ask in: a local model (`workers`
    forked one-thread processes on the CPU, 0 one per CPU; `posym.parallel.cpu_workers`), or an endpoint
    (exactly one; asked from this process)."""
    if (model_dir is None) == (base_url is None):
        raise PosymError("give either a local MODEL_DIR or --base-url (with --model-name), not both or neither")
    if base_url is not None:
        if not model_name:
            raise PosymError("--base-url needs --model-name (the model the endpoint should run)")
        check_url(base_url)
        if not (isinstance(retries, int) and 0 <= retries <= 100):
            raise PosymError(f"--retries must lie in 0..100, got {retries}")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 86400):  # also refuses nan
            raise PosymError(f"--timeout must be a number of seconds in (0, 86400], got {timeout_s}")
        endpoint = Endpoint(base_url, model_name, api_key_env, timeout_s=timeout_s, retries=retries)
        _api_key(endpoint)  # fail before the first question if the variable is missing
        return (lambda prompt: endpoint_correct(endpoint, prompt)), model_name.replace("/", "_"), 1
    loaded = load(model_dir, device=device, dtype=dtype, allow_pickle=allow_pickle)
    if not loaded.has_tokenizer:
        raise PosymError(f"{loaded.name} has no tokenizer; llm-bench asks its questions as text")
    return (lambda prompt: local_correct(loaded, prompt)), loaded.name, cpu_workers(workers, loaded.model)


def write_bench(
    judge,
    out_dir,
    *,
    label: str,
    tasks,
    sizes,
    runs: int,
    n: int,
    settings: dict,
    markers: Iterable[bool] = (False,),
    progress=None,
    workers: int = 1,
) -> str:
    """Run the benchmark and write bench.parquet, summary.parquet, table.md, bench.png/svg, manifest.json."""
    if runs < 1 or n < 1:
        raise PosymError(f"--runs and --n must be at least 1, got {runs} and {n}")
    out_dir = Path(out_dir)
    frame = run_bench(
        judge, tasks=tasks, sizes=sizes, runs=runs, n=n, markers=markers, progress=progress, workers=workers
    )
    summary = bench_summary(frame)
    table = bench_table(summary, label)
    write_parquet(output_file(out_dir, "llm-bench", "bench"), frame)
    write_parquet(output_file(out_dir, "llm-bench", "summary"), summary)
    write_text(output_file(out_dir, "llm-bench", "table"), table)
    save_figure(plot_bench(summary, label), figure_file(out_dir, "llm-bench", "bench"))
    write_json(
        output_file(out_dir, "llm-bench", "manifest"), manifest(settings, seed=None, screening=screening(summary))
    )
    return table
