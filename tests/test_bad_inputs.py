"""Misconfigurations and malformed requests against FASER, each with its expected outcome.

Startup: a configuration FASER cannot serve is refused before the server serves, with
a message naming the problem (the cases of ``test_startup_errors.py`` are not repeated
here). Every startup case runs with ``--skip-server-warmup``, so "refused" means the
launch itself failed, not that a warmup request happened to crash the server.

Requests: a malformed request gets an HTTP 4xx, and the server answers a normal
request right after it. Requests for features FASER cannot honour (penalties,
grammars, ``min_new_tokens``) are refused with a 4xx or honoured, never silently
ignored.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from conftest import TinyModels
from faser_sglang.bench.servers import Server
from fuzz_utils import faser_flags, post_generate
from server_utils import launch_server

pytestmark = pytest.mark.server

K_MAX = 4
STARTUP_PARALLELISM = 3
NORMAL = {"text": "def main():", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}

# ---------------------------------------------------------------------------
# Startup
# ---------------------------------------------------------------------------

DraftFactory = Callable[[TinyModels, Path], Path]


def _draft_without_config(models: TinyModels, tmp: Path) -> Path:
    """The draft's directory with every file but ``config.json``."""
    dst = tmp / "draft-without-config"
    shutil.copytree(models.draft, dst)
    (dst / "config.json").unlink()
    return dst


@dataclass(frozen=True)
class StartupCase:
    """A launch of FASER that must be refused with a log naming the problem.

    ``config`` is the FASER_CONFIG file text (None: no file; ``CONFIG_IS_A_DIRECTORY``:
    point FASER_CONFIG at a directory). ``expect`` strings must all appear in the
    refusal; ``{draft}`` in them stands for the draft path used.
    """

    id: str
    expect: tuple[str, ...]
    args: tuple[str, ...] = ()
    config: str | None = None
    config_suffix: str = ".json"
    draft: DraftFactory | None = None


CONFIG_IS_A_DIRECTORY = "<directory>"

STARTUP_CASES = (
    StartupCase("config-number-given-as-string", ("FASER config 'ema_alpha' must be a finite number", "'0.3'"),
                config='{"ema_alpha": "0.3"}'),
    StartupCase("config-negative-rate", ("'prior_accept_rate' must be in [0.0, 1.0]",),
                config='{"prior_accept_rate": -0.1}'),
    StartupCase("config-huge-value", ("'min_token_value' must be in [0.0, 1.0)",),
                config='{"min_token_value": 1e308}'),
    StartupCase("config-nan-json", ("'ema_alpha' must be a finite number", "nan"),
                config='{"ema_alpha": NaN}'),
    StartupCase("config-policy-typo", ("FASER config 'policy' must be one of", "'emma'"),
                config='{"policy": "emma"}'),
    StartupCase("config-seed-not-integer", ("FASER config 'seed' must be an integer",),
                config='{"seed": 1.5}'),
    StartupCase("config-trace-path-unwritable", ("trace_path", "/nonexistent-dir/trace.jsonl"),
                config='{"trace_path": "/nonexistent-dir/trace.jsonl"}'),
    StartupCase("config-toml-syntax-error", ("cannot parse",),
                config='policy = "ema\n', config_suffix=".toml"),
    StartupCase("config-json-syntax-error", ("cannot parse",),
                config='{"policy": "ema",}'),
    StartupCase("config-top-level-not-object", ("top level must be a table/object",),
                config="[1, 2]"),
    StartupCase("config-toml-section", ("unknown key(s) ['faser']",),
                config='[faser]\npolicy = "ema"\n', config_suffix=".toml"),
    StartupCase("config-path-is-a-directory", ("does not name a file",),
                config=CONFIG_IS_A_DIRECTORY),
    StartupCase("draft-path-missing", ("{draft}",),
                draft=lambda models, tmp: tmp / "no-such-draft"),
    StartupCase("draft-without-config-json", ("{draft}", "config.json"),
                draft=_draft_without_config),
    StartupCase("k-max-not-an-integer", ("--speculative-num-steps", "invalid int value: 'four'"),
                args=("--speculative-num-steps", "four")),
    StartupCase("dp-attention", ("FASER does not support --enable-dp-attention",),
                args=("--enable-dp-attention",)),
    StartupCase("pipeline-parallelism", ("FASER does not support pipeline parallelism",),
                args=("--pp-size", "2")),
    StartupCase("speculative-adaptive", ("--speculative-adaptive", "FASER chooses per-request lengths itself"),
                args=("--speculative-adaptive",)),
    StartupCase("prefill-backend-unsupported", ("FASER does not support --attention-backend torch_native",),
                args=("--prefill-attention-backend", "torch_native")),
    # On this CPU host a paged KV pool cannot serve at all: SGLang's paged allocator
    # is a Triton kernel (no-spec fails the same way), so FASER never runs a step.
    StartupCase("page-size-16-on-cpu", ("mem_cache/allocator/paged.py", "0 active drivers"),
                args=("--page-size", "16")),
)  # fmt: skip


@dataclass(frozen=True)
class StartupOutcome:
    refused: bool
    log: str
    draft: Path


def _launch_case(case: StartupCase, models: TinyModels, tmp: Path) -> StartupOutcome:
    tmp.mkdir(parents=True, exist_ok=True)
    draft = case.draft(models, tmp) if case.draft else models.draft
    env: dict[str, str] = {}
    if case.config == CONFIG_IS_A_DIRECTORY:
        env["FASER_CONFIG"] = str(tmp)
    elif case.config is not None:
        config = tmp / f"faser{case.config_suffix}"
        config.write_text(case.config)
        env["FASER_CONFIG"] = str(config)
    args = (*faser_flags(draft, K_MAX), *case.args, "--skip-server-warmup")
    try:
        server = launch_server(models.target, *args, env=env, timeout=300)
    except RuntimeError as e:
        return StartupOutcome(refused=True, log=str(e), draft=draft)
    with server:
        return StartupOutcome(refused=False, log=server.log_tail(20000), draft=draft)


@pytest.fixture(scope="module")
def startup_outcomes(request, tiny_models, tmp_path_factory) -> dict[str, StartupOutcome]:
    """Launch every selected startup case, a few at a time (each is a separate
    server process), and keep each outcome for its test."""
    selected = {
        item.callspec.params["case"].id
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_startup_case" and hasattr(item, "callspec")
    }
    cases = [c for c in STARTUP_CASES if c.id in selected]
    root = tmp_path_factory.mktemp("startup")
    with ThreadPoolExecutor(max_workers=STARTUP_PARALLELISM) as pool:
        outcomes = pool.map(lambda c: _launch_case(c, tiny_models, root / c.id), cases)
        return {c.id: o for c, o in zip(cases, outcomes)}


@pytest.mark.parametrize("case", STARTUP_CASES, ids=[c.id for c in STARTUP_CASES])
def test_startup_case(case: StartupCase, startup_outcomes: dict[str, StartupOutcome]) -> None:
    outcome = startup_outcomes[case.id]
    assert outcome.refused, (
        f"FASER started ({case.id}: args={case.args}, config={case.config!r}); "
        f"expected a refusal naming {case.expect}"
    )
    missing = [e for e in (s.format(draft=outcome.draft) for s in case.expect) if e not in outcome.log]
    assert not missing, f"refusal does not mention {missing}; log tail:\n{outcome.log[-3000:]}"


# ---------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------

# Asked for K_MAX + 5 verify tokens: FASER sets K_MAX + 1 with a warning and serves.
INCONSISTENT_DRAFT_TOKENS = ("--speculative-num-draft-tokens", str(K_MAX + 5))


class RevivingServer:
    """A FASER server that is started again after a case killed it, so that one crash
    fails only its own case and the next case meets a fresh server."""

    def __init__(self, start: Callable[[], Server]) -> None:
        self._start = start
        self._server: Server | None = start()

    def get(self) -> Server:
        if self._server is None or self._server.process.poll() is not None:
            if self._server is not None:
                self._server.close()
            self._server = self._start()
        return self._server

    def discard(self) -> None:
        """Kill the current server (it stopped serving); the next ``get`` starts one."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def close(self) -> None:
        self.discard()


@pytest.fixture(scope="module")
def faser(tiny_models) -> Iterator[RevivingServer]:
    server = RevivingServer(
        lambda: launch_server(tiny_models.target, *faser_flags(tiny_models.draft, K_MAX), *INCONSISTENT_DRAFT_TOKENS)
    )
    yield server
    server.close()


def _serves_normally(server: Server) -> bool:
    try:
        r = post_generate(server.base_url, NORMAL, timeout=120)
    except requests.RequestException:
        return False
    return r.status_code == 200 and len(r.json()["output_ids"]) == 8


def test_inconsistent_num_draft_tokens_is_adjusted_with_a_warning(faser: RevivingServer) -> None:
    server = faser.get()
    log = server.log_path.read_text(errors="replace")
    assert f"--speculative-num-draft-tokens {K_MAX + 5} is set to {K_MAX + 1}" in log
    assert _serves_normally(server)


@dataclass(frozen=True)
class RequestCase:
    """A malformed request: ``body`` is sent as JSON, or as raw bytes when ``raw``."""

    id: str
    body: Any
    raw: bool = False
    endpoint: str = "/generate"


def _gen(sampling: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A /generate body: prompt "hi" unless a prompt field is given."""
    body: dict[str, Any] = {"text": "hi"} if not ({"text", "input_ids"} & fields.keys()) else {}
    body.update(fields)
    body["sampling_params"] = {"max_new_tokens": 4, **(sampling or {})}
    return body


REQUEST_CASES = (
    RequestCase("body-not-json", "{not json", raw=True),
    RequestCase("body-nan-literal", '{"text": "hi", "sampling_params": {"temperature": NaN}}', raw=True),
    RequestCase("body-is-a-list", [1, 2, 3]),
    RequestCase("no-prompt", {"sampling_params": {"max_new_tokens": 4}}),
    RequestCase("sampling-params-not-an-object", {"text": "hi", "sampling_params": [1]}),
    RequestCase("max-new-tokens-a-string", _gen({"max_new_tokens": "ten"})),
    RequestCase("temperature-a-string", _gen({"temperature": "hot"})),
    RequestCase("unknown-sampling-param", _gen({"bogus": 1})),
    RequestCase("max-new-tokens-negative", _gen({"max_new_tokens": -5})),
    RequestCase("temperature-negative", _gen({"temperature": -1})),
    RequestCase("top-p-zero", _gen({"top_p": 0})),
    RequestCase("top-p-above-one", _gen({"top_p": 1.5})),
    RequestCase("top-k-below-minus-one", _gen({"top_k": -7})),
    RequestCase("top-k-zero", _gen({"top_k": 0})),
    RequestCase("min-p-above-one", _gen({"min_p": 2})),
    RequestCase("min-new-tokens-above-max", _gen({"min_new_tokens": 10, "max_new_tokens": 2})),
    RequestCase("n-zero", _gen({"n": 0, "temperature": 0.8})),
    RequestCase("n-negative", _gen({"n": -1, "temperature": 0.8})),
    RequestCase("stop-a-number", _gen({"stop": 5})),
    RequestCase("stop-token-ids-strings", _gen({"stop_token_ids": ["a"]})),
    RequestCase("logit-bias-out-of-vocab", _gen({"logit_bias": {"99999": 1.0}})),
    RequestCase("empty-text", _gen(text="")),
    RequestCase("empty-input-ids", _gen(input_ids=[])),
    RequestCase("prompt-longer-than-context", _gen(input_ids=[5] * 3000)),
    RequestCase("prompt-plus-max-new-over-context", _gen({"max_new_tokens": 100}, input_ids=[5] * 2040)),
    RequestCase("max-new-tokens-huge", _gen({"max_new_tokens": 10**9})),
    RequestCase("logprob-start-len-beyond-prompt", _gen(return_logprob=True, logprob_start_len=1000)),
    RequestCase("openai-completion-max-tokens-negative",
                {"model": "m", "prompt": "hi", "max_tokens": -1}, endpoint="/v1/completions"),
    RequestCase("openai-chat-messages-not-a-list",
                {"model": "m", "messages": "hi", "max_tokens": 4}, endpoint="/v1/chat/completions"),
    # Without FASER's request guard each of these takes the whole SGLang 0.5.17 server down.
    RequestCase("input-id-out-of-vocab", _gen(input_ids=[1, 99999])),
    RequestCase("input-id-negative", _gen(input_ids=[1, -3])),
    RequestCase("logprob-start-len-negative", _gen(return_logprob=True, logprob_start_len=-5)),
    RequestCase("top-logprobs-num-above-vocab", _gen(return_logprob=True, top_logprobs_num=100000)),
)  # fmt: skip


def _send(server: Server, case: RequestCase) -> tuple[int, str]:
    url = server.base_url + case.endpoint
    try:
        if case.raw:
            r = requests.post(url, data=case.body, headers={"Content-Type": "application/json"}, timeout=120)
        else:
            r = requests.post(url, json=case.body, timeout=120)
    except requests.RequestException as e:
        return -1, f"no HTTP answer: {e!r}"
    return r.status_code, r.text[:300]


@pytest.mark.parametrize("case", REQUEST_CASES, ids=[c.id for c in REQUEST_CASES])
def test_malformed_request_gets_4xx_and_server_keeps_serving(case: RequestCase, faser: RevivingServer) -> None:
    """Sent twice: the second time its prompt is in the radix cache, a different path."""
    server = faser.get()
    answers = [_send(server, case) for _ in range(2)]
    serving = _serves_normally(server)
    if not serving:
        faser.discard()
    bad = [(status, text) for status, text in answers if not 400 <= status < 500]
    assert not bad, f"{case.id}: expected HTTP 4xx twice, got {bad}"
    assert serving, f"{case.id}: the server stopped serving after the request"


# Requests FASER cannot serve losslessly: refuse them, or honour them.

PENALTIES = ({"repetition_penalty": 1.5}, {"frequency_penalty": 1.5}, {"presence_penalty": 1.5})
GREEDY_24 = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("penalty", PENALTIES, ids=[next(iter(p)) for p in PENALTIES])
def test_penalty_is_refused_or_honoured(penalty: dict[str, float], faser: RevivingServer) -> None:
    """An unpenalised greedy output that repeats tokens must change under a strong
    penalty; a 200 with the unpenalised tokens means the penalty was ignored."""
    server = faser.get()
    plain = post_generate(server.base_url, {"text": "def foo(x):", "sampling_params": GREEDY_24}).json()
    ids = plain["output_ids"]
    assert len(set(ids)) < len(ids), "precondition: the unpenalised output repeats a token"
    r = post_generate(server.base_url, {"text": "def foo(x):", "sampling_params": {**GREEDY_24, **penalty}})
    if 400 <= r.status_code < 500:
        return
    assert r.status_code == 200, r.text[:300]
    assert r.json()["output_ids"] != ids, f"{penalty} was accepted and silently ignored"


def test_min_new_tokens_is_refused_or_honoured(faser: RevivingServer) -> None:
    """Stopping on the second greedy token with ``min_new_tokens`` 6 must not stop
    before 6 tokens (SGLang masks stop tokens until then)."""
    server = faser.get()
    greedy = {"max_new_tokens": 24, "temperature": 0}
    ids = post_generate(server.base_url, {"text": "def foo(x):", "sampling_params": greedy}).json()["output_ids"]
    stop = ids[1]
    assert stop not in ids[:1], "precondition: the stop token first appears at index 1"
    params = {**greedy, "stop_token_ids": [stop], "min_new_tokens": 6}
    r = post_generate(server.base_url, {"text": "def foo(x):", "sampling_params": params})
    if 400 <= r.status_code < 500:
        return
    assert r.status_code == 200, r.text[:300]
    got = r.json()["output_ids"]
    assert len(got) >= 6, f"min_new_tokens=6 ignored: stopped after {len(got)} tokens {got}"


GRAMMARS = ({"regex": "[a-z]+"}, {"json_schema": '{"type": "string"}'})


@pytest.mark.parametrize("grammar", GRAMMARS, ids=[next(iter(g)) for g in GRAMMARS])
def test_grammar_request_is_refused(grammar: dict[str, str], faser: RevivingServer) -> None:
    """FASER drafts and verifies without grammar masks (README: not supported), so a
    constrained request must get a 4xx rather than unconstrained output or a crash."""
    server = faser.get()
    status, text = _send(server, RequestCase("grammar", _gen(grammar)))
    serving = _serves_normally(server)
    if not serving:
        faser.discard()
    assert 400 <= status < 500, f"{grammar}: expected HTTP 4xx, got {status}: {text}"
    assert serving, f"{grammar}: the server stopped serving after the request"
