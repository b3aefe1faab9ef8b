"""Seeded differential fuzzing: FASER against the same target without speculation, with
FASER's defaults and drafting ahead with random lengths.

Each seed generates random ``/generate`` requests (token-id and text prompts of 1..300
tokens, 1..64 new tokens, random ``ignore_eos``, stop strings, stop token ids,
logprobs, sampled requests with ``n > 1``) and sends them to both servers from
threads with random start delays, so requests join and leave FASER's continuous
batch at random points. Greedy completions (temperature 0, or ``top_k`` 1) must equal
no-spec's token for token, with logprobs within ``LOGPROB_TOL``; every completion
must obey its request's length and stop rules.

Case ``i`` of a seed depends only on (seed, i), so raising ``FASER_FUZZ_CASES`` (cases
per seed; default small for CI) extends a run without changing its first cases. A
failure prints one line per bad case: seed, case index and the exact request JSON.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from transformers import AutoTokenizer

from conftest import read_trace, write_faser_config
from fuzz_utils import (
    faser_flags,
    outputs_of,
    post_generate,
    reproducer,
    servers_together,
    well_formed_problems,
)
from server_utils import launch_server

pytestmark = pytest.mark.server

SEEDS = (0, 1, 2)
CASES_PER_SEED = int(os.environ.get("FASER_FUZZ_CASES", "8"))
K_MAX = 4
LOGPROB_TOL = 1e-3
MAX_START_DELAY_S = 3.0

# Fragments of random text prompts: code, whitespace, punctuation and non-ASCII.
TEXT_PIECES = (
    "def", "return", "self", "import", "class", "lambda", "for", "in", "if", "else",
    "value", "None", "x", "0", "42", "(", ")", ":", "=", "+", ",", "#", '"""',
    " ", "  ", "\n", "    ", "\t", "é", "日本", "🙂", "ß", "\\n",
)  # fmt: skip
# ASCII stop strings short enough to occur in random output.
STOP_STRINGS = ("e", "a", "s", "\n", " ", "(", "in", "se", "re", "on", "_", "ault")


@dataclass(frozen=True)
class FuzzCase:
    seed: int
    index: int
    payload: dict[str, Any]  # the exact /generate request
    delay: float  # seconds after the round starts

    @property
    def params(self) -> dict[str, Any]:
        return self.payload["sampling_params"]

    @property
    def deterministic(self) -> bool:
        """Greedy in SGLang's sense: temperature 0, or top_k 1 at any temperature."""
        return self.params["temperature"] == 0 or self.params.get("top_k") == 1

    def line(self, problem: str) -> str:
        return reproducer(self.seed, self.index, self.payload, problem)


class Vocabulary:
    """The target's tokenizer: text prompts of a chosen token length, and the decode
    SGLang's stop-string check uses."""

    def __init__(self, model_path: str) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.size = len(self.tokenizer)
        self.eos_ids = (self.tokenizer.eos_token_id,)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def random_text(self, rng: random.Random, num_tokens: int) -> str:
        pieces: list[str] = []
        ids: list[int] = []
        while len(ids) < num_tokens:
            pieces += [rng.choice(TEXT_PIECES) for _ in range(16)]
            ids = self.tokenizer.encode("".join(pieces), add_special_tokens=False)
        return self.tokenizer.decode(ids[:num_tokens])


def make_case(seed: int, index: int, vocab: Vocabulary) -> FuzzCase:
    """Case ``index`` of ``seed``: a random but valid request and its start delay."""
    rng = random.Random(f"faser-fuzz-{seed}-{index}")
    prompt_len = rng.choice((1, 2, rng.randint(3, 40), rng.randint(3, 300)))
    payload: dict[str, Any] = {}
    if rng.random() < 0.5:
        payload["input_ids"] = [rng.randrange(vocab.size) for _ in range(prompt_len)]
    else:
        payload["text"] = vocab.random_text(rng, prompt_len)
    params: dict[str, Any] = {
        "max_new_tokens": rng.choice((1, 2, 3, rng.randint(1, 64), rng.randint(32, 64))),
        "ignore_eos": rng.random() < 0.5,
        "temperature": 0,
    }
    if rng.random() < 0.4:
        params.update(
            temperature=round(rng.uniform(0.2, 1.5), 2),
            top_p=rng.choice((1.0, 0.9, 0.5)),
            top_k=rng.choice((-1, -1, 1, 5, 50)),
            min_p=rng.choice((0.0, 0.0, 0.05, 0.2)),
            n=rng.choice((1, 2, 3)),
        )
    if rng.random() < 0.35:
        params["stop"] = rng.sample(STOP_STRINGS, rng.randint(1, 3))
    if rng.random() < 0.35:
        params["stop_token_ids"] = rng.sample(range(vocab.size), rng.randint(1, 16))
    payload["sampling_params"] = params
    if rng.random() < 0.35:
        payload["return_logprob"] = True
        if rng.random() < 0.5:
            payload["top_logprobs_num"] = rng.randint(1, 5)
        if "input_ids" in payload and rng.random() < 0.5:
            payload["logprob_start_len"] = rng.randrange(prompt_len)
    return FuzzCase(seed, index, payload, delay=round(rng.uniform(0.0, MAX_START_DELAY_S), 2))


def run_round(base_url: str, cases: Sequence[FuzzCase]) -> list[tuple[int, Any]]:
    """Send every case from its own thread after its delay; (HTTP status, JSON body
    or text) per case, in case order."""
    results: list[tuple[int, Any]] = [(0, None)] * len(cases)
    start = time.monotonic()

    def send(i: int, case: FuzzCase) -> None:
        time.sleep(max(0.0, start + case.delay - time.monotonic()))
        try:
            response = post_generate(base_url, case.payload)
            body = response.json() if response.ok else response.text
            results[i] = (response.status_code, body)
        except Exception as e:  # noqa: BLE001 - any transport failure is a finding
            results[i] = (-1, repr(e))

    threads = [threading.Thread(target=send, args=(i, c)) for i, c in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) < LOGPROB_TOL)


def token_logprobs_match(got: list | None, ref: list | None) -> bool:
    """[[logprob, id, text], ...]: same ids, logprobs within tolerance."""
    if got is None or ref is None:
        return got is ref
    return len(got) == len(ref) and all(g[1] == r[1] and close(g[0], r[0]) for g, r in zip(got, ref))


def top_logprobs_match(got: list | None, ref: list | None) -> bool:
    """Per position, the same top entries with logprobs within tolerance; an id may
    differ only where it ties (within tolerance) with the last entry kept."""
    if got is None or ref is None:
        return got is ref
    return len(got) == len(ref) and all(_top_entries_match(g, r) for g, r in zip(got, ref))


def _top_entries_match(got: list | None, ref: list | None) -> bool:
    if got is None or ref is None:
        return got is ref
    if len(got) != len(ref) or not all(close(g[0], r[0]) for g, r in zip(got, ref)):
        return False
    ref_by_id = {r[1]: r[0] for r in ref}
    cut = ref[-1][0] if ref else None
    return all(close(g[0], ref_by_id.get(g[1], cut)) for g in got)


LOGPROB_KEYS: dict[str, Callable[[list | None, list | None], bool]] = {
    "output_token_logprobs": token_logprobs_match,
    "input_token_logprobs": token_logprobs_match,
    "output_top_logprobs": top_logprobs_match,
    "input_top_logprobs": top_logprobs_match,
}


def differences(case: FuzzCase, got: dict, ref: dict) -> list[str]:
    """How a deterministic FASER completion differs from no-spec's."""
    diffs = []
    g_ids, r_ids = got["output_ids"], ref["output_ids"]
    if g_ids != r_ids:
        first = next((i for i, (a, b) in enumerate(zip(g_ids, r_ids)) if a != b), min(len(g_ids), len(r_ids)))
        diffs.append(f"output_ids differ from index {first}: faser={g_ids} nospec={r_ids}")
    if got["meta_info"]["finish_reason"] != ref["meta_info"]["finish_reason"]:
        diffs.append(f"finish_reason {got['meta_info']['finish_reason']} != {ref['meta_info']['finish_reason']}")
    if got["text"] != ref["text"] and not diffs:
        diffs.append(f"text {got['text']!r} != {ref['text']!r}")
    if case.params["temperature"] == 0:  # logprobs of a top_k=1 sample use its temperature
        for key, match in LOGPROB_KEYS.items():
            if not match(got["meta_info"].get(key), ref["meta_info"].get(key)):
                diffs.append(f"{key} differ beyond {LOGPROB_TOL}")
    return diffs


def structural_problems(case: FuzzCase, got: tuple[int, Any], ref: tuple[int, Any], vocab: Vocabulary) -> list[str]:
    """Both servers answered, FASER with n completions that obey the request's rules."""
    (g_status, g_body), (r_status, r_body) = got, ref
    if r_status != 200:
        return [f"no-spec answered {r_status}: {str(r_body)[:300]} (invalid fuzz request)"]
    if g_status != 200:
        return [f"FASER answered {g_status}: {str(g_body)[:300]}"]
    g_outs = outputs_of(g_body)
    n = case.params.get("n", 1)
    if len(g_outs) != n:
        return [f"FASER returned {len(g_outs)} completions for n={n}"]
    problems = []
    for out in g_outs:
        problems += well_formed_problems(case.params, out, vocab.size, vocab.eos_ids, vocab.decode)
    return problems


def case_problems(case: FuzzCase, got: tuple[int, Any], ref: tuple[int, Any], vocab: Vocabulary) -> list[str]:
    problems = structural_problems(case, got, ref, vocab)
    if case.deterministic and answered(case, got, ref):
        for g, r in zip(outputs_of(got[1]), outputs_of(ref[1])):
            problems += differences(case, g, r)
    return problems


def answered(case: FuzzCase, got: tuple[int, Any], ref: tuple[int, Any]) -> bool:
    """Both servers answered 200 and FASER with the n completions asked for."""
    return got[0] == ref[0] == 200 and len(outputs_of(got[1])) == case.params.get("n", 1)


@pytest.fixture(scope="module")
def vocab(tiny_models) -> Vocabulary:
    return Vocabulary(str(tiny_models.target))


@pytest.fixture(scope="module", params=["default", "draft-ahead"])
def servers(request, tiny_models, tmp_path_factory):
    """(no-spec, FASER, FASER's step trace or None) on the same target. "draft-ahead":
    random lengths (k = 0 included) with each step's chain queued at the end of the step
    before, so rows back after plain steps are caught up there (draft_ahead.py)."""
    env, trace = None, None
    if request.param == "draft-ahead":
        work = tmp_path_factory.mktemp("fuzz-ahead")
        trace = work / "trace.jsonl"
        env = write_faser_config(work / "faser.json", policy="random", seed=3, draft_ahead=True, trace_path=str(trace))
    with servers_together(
        lambda: launch_server(tiny_models.target),
        lambda: launch_server(tiny_models.target, *faser_flags(tiny_models.draft, K_MAX), env=env),
    ) as pair:
        yield (*pair, trace)


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_faser_matches_no_speculation(seed: int, vocab: Vocabulary, servers) -> None:
    nospec, faser, _ = servers
    cases = [make_case(seed, i, vocab) for i in range(CASES_PER_SEED)]
    reference = run_round(nospec.base_url, cases)
    got = run_round(faser.base_url, cases)
    failures = [
        case.line(problem)
        for case, g, r in zip(cases, got, reference)
        for problem in case_problems(case, g, r, vocab)
    ]
    if failures:
        print("\n".join(failures))
    assert not failures, f"{len(failures)} problem(s):\n" + "\n".join(failures)


def test_fuzzed_traffic_verified_drafts_made_ahead(servers) -> None:
    """After its server's seeds (pytest runs a module fixture's tests param by param, in
    file order): with drafting ahead, the fuzzed traffic verified drafts made ahead, so
    the seeds above checked those steps against no-spec. (Rows caught up ahead are rare
    in this short traffic: tests/test_draft_ahead.py covers them.)"""
    *_, trace = servers
    if trace is None:
        pytest.skip("FASER's defaults do not draft ahead")
    how = Counter(s.get("draft_steps") for s in read_trace(trace))
    assert how["ahead"] > 0, how
