"""FASER through real SGLang on CPU: lossless greedy output, acceptance, every interface.

Each server is a real ``python -m sglang.launch_server`` with FASER registered by its
plugin entry point (no test-only code path in the product).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import openai
import pytest
import requests

from conftest import (
    PROMPTS,
    assert_tokens_follow_target,
    catchup_gaps,
    generate_sampled_mix,
    ids,
    load_script,
    read_trace,
    write_faser_config,
)
from faser_sglang.sched_timeline import TIMELINE_ENV
from fuzz_utils import faser_flags
from server_utils import abort_streams_and_wait_for_free_kv, generate, launch_server, used_kv_tokens

pytestmark = pytest.mark.server

K_MAX = 4

GREEDY = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}


def launch_faser(target, draft, env: dict[str, str], *extra_args: str):
    """A FASER server on CPU with K_MAX; ``extra_args`` follow (later flags win)."""
    return launch_server(target, *faser_flags(draft, K_MAX), *extra_args, env=env)


@pytest.fixture(scope="module")
def timelines(tmp_path_factory):
    """Each module server records its scheduler loop's host timeline here (sched_timeline.py)."""
    return tmp_path_factory.mktemp("timelines")


@pytest.fixture(scope="module")
def nospec(tiny_models, timelines):
    with launch_server(tiny_models.target, env={TIMELINE_ENV: str(timelines / "nospec")}) as server:
        yield server


@pytest.fixture(scope="module")
def faser_trace(tmp_path_factory):
    return tmp_path_factory.mktemp("faser") / "trace.jsonl"


@pytest.fixture(scope="module")
def faser(tiny_models, faser_trace, tmp_path_factory, timelines):
    env = write_faser_config(tmp_path_factory.mktemp("cfg") / "faser.json", trace_path=str(faser_trace))
    env[TIMELINE_ENV] = str(timelines / "faser")
    with launch_faser(tiny_models.target, tiny_models.draft, env) as server:
        yield server


def test_greedy_equals_no_speculation_with_varying_lengths(nospec, faser, faser_trace):
    reference = ids(generate(nospec.base_url, PROMPTS, GREEDY))
    got = generate(faser.base_url, PROMPTS, GREEDY)
    assert ids(got) == reference
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in got)

    steps = read_trace(faser_trace)
    assert any(len(s["rids"]) > 1 for s in steps), "requests never shared a batch"
    mixed = [s for s in steps if len(set(s["draft_lens"])) > 1]
    assert mixed, "per-request draft lengths never differed inside one batch"
    assert all(0 <= k <= K_MAX for s in steps for k in s["draft_lens"])
    assert all(0 <= a <= k for s in steps for a, k in zip(s["num_accepted"], s["draft_lens"]))
    assert "overlap schedule=True" in faser.log_tail(2_000_000)  # SGLang's default schedule


def test_kv_memory_plan_counts_the_draft_pool(faser):
    """The shared KV pool's plan divides the budget by the target's and the draft's KV
    bytes per token (memory_plan.py): the kit's tiny Llamas hold K and V of 2 layers x 2
    KV heads x head dim 16 in float32, 512 bytes each; the draft's pool matches."""
    log = faser.log_tail(2_000_000)
    assert "FASER memory plan: 1024 KV bytes per token (target 512 + draft 512)" in log
    assert "FASER memory plan: the" not in log  # no warning about either pool


def test_scheduler_timeline_records_both_servers(nospec, faser, timelines):
    """FASER_SCHED_TIMELINE traces any server's scheduler loop, FASER's and no-spec's."""
    generate(nospec.base_url, PROMPTS[:4], GREEDY)
    generate(faser.base_url, PROMPTS[:4], GREEDY)
    script = load_script("sched_timeline")
    for name, algorithm in (("nospec", None), ("faser", "FASER")):
        (path,) = (timelines / name).glob("sched-*.jsonl")
        header = read_trace(path)[0]
        assert header["header"] and header["speculative_algorithm"] == algorithm and header["overlap"]
        assert header["triton_compiles"]  # the scheduler set Triton's compile hooks
        timeline = script.load(path)
        # A CPU server launches no Triton kernel, so it records only the hooked calls.
        assert {r["fn"] for r in timeline.records} == set(script.CALLS)
        stats = script.iteration_stats(timeline.records)
        assert {"prefill", "decode"} <= set(stats)
        assert all(it["run_batch"] + it["process_batch_result"] <= it["iteration"] for it in stats["decode"])
        # The target's forward runs inside the launch of every prefill.
        assert all(0 < it["target_forward"] <= it["run_batch"] for it in stats["prefill"])
        launches = [r for r in timeline.records if r["fn"] == "run_batch" and r["mode"] == "prefill"]
        assert all(r["tokens"] > 0 and r["bs"] > 0 for r in launches)
    assert "| faser k4 (" in script.table([script.load(p) for p in script.files([timelines / "faser"])])


def test_synchronous_schedule_is_lossless(nospec, tiny_models, tmp_path):
    """With ``--disable-overlap-schedule`` the same worker settles each step's acceptance
    before the next one: greedy output equals no speculation, sampled output follows
    the target, and every step's acceptance is in the trace."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy="random", trace_path=str(trace), seed=11)
    reference = ids(generate(nospec.base_url, PROMPTS, GREEDY))
    with launch_faser(tiny_models.target, tiny_models.draft, env, "--disable-overlap-schedule") as server:
        assert ids(generate(server.base_url, PROMPTS, GREEDY)) == reference
        assert_second_token_follows_target(tiny_models, server.base_url)
        assert "overlap schedule=False" in server.log_tail(2_000_000)
    steps = read_trace(trace)
    assert any(any(s["draft_lens"]) for s in steps)
    assert all(0 <= a <= k for s in steps for a, k in zip(s["num_accepted"], s["draft_lens"]))
    # Synchronously each step starts after the last one ended (scripts/check_costs.py
    # reads the gaps between them as the work outside decode steps).
    assert all(b["ended"] - b["seconds"] >= a["ended"] - 1e-3 for a, b in zip(steps, steps[1:]))


def test_mixed_sampling_params_in_one_batch(nospec, faser):
    greedy_prompts = PROMPTS[:4]
    reference = ids(generate(nospec.base_url, greedy_prompts, GREEDY))
    sampled = [
        {"max_new_tokens": 24, "temperature": 0.8, "ignore_eos": True},
        {"max_new_tokens": 24, "temperature": 1.3, "top_p": 0.9, "ignore_eos": True},
        {"max_new_tokens": 24, "temperature": 1.0, "top_k": 5, "min_p": 0.05, "ignore_eos": True},
    ]
    results: dict[str, list] = {}

    def run(name, prompts, params):
        results[name] = generate(faser.base_url, prompts, params)

    threads = [threading.Thread(target=run, args=("greedy", greedy_prompts, GREEDY))]
    threads += [
        threading.Thread(target=run, args=(f"s{i}", PROMPTS[4:8], p)) for i, p in enumerate(sampled)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ids(results["greedy"]) == reference
    for i in range(len(sampled)):
        assert all(len(o["output_ids"]) == 24 for o in results[f"s{i}"])


def test_greedy_with_a_logit_bias_equals_no_speculation(nospec, faser):
    """A logit bias that bans the reference's most frequent token and favours another:
    FASER's drafts, verify and acceptance all take the argmax of the biased logits,
    as SGLang's sampler does, so output equals no-spec's with the same bias (and
    differs from the unbiased output, or the bias tested nothing)."""
    plain = ids(generate(nospec.base_url, PROMPTS, GREEDY))
    frequent = Counter(t for out in plain for t in out).most_common(2)
    bias = {str(frequent[0][0]): -100.0, str(frequent[1][0]): 2.0}
    params = {**GREEDY, "logit_bias": bias}
    reference = ids(generate(nospec.base_url, PROMPTS, params))
    assert reference != plain
    assert ids(generate(faser.base_url, PROMPTS, params)) == reference


def test_sampled_tokens_follow_target_distribution(tiny_models, faser):
    assert_second_token_follows_target(tiny_models, faser.base_url)


def assert_second_token_follows_target(tiny_models, base_url: str) -> None:
    """Chi-square on the second generated token (produced by a verify step) against
    the target's exact distribution computed with transformers."""
    assert_tokens_follow_target(tiny_models, base_url, positions=(1,))


def test_identity_model_as_its_own_draft_accepts_every_token(tiny_models, tmp_path):
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy="fixed", trace_path=str(trace))
    with launch_faser(tiny_models.identity, tiny_models.identity, env) as server:
        outs = generate(server.base_url, PROMPTS[:6], {"max_new_tokens": 21, "temperature": 0, "ignore_eos": True})
    assert all(len(o["output_ids"]) == 21 for o in outs)
    steps = read_trace(trace)
    assert sum(sum(s["draft_lens"]) for s in steps) > 0
    assert all(s["num_accepted"] == s["draft_lens"] for s in steps)
    # Every draft is accepted, so a step emits k + 1 tokens with k = K_MAX, capped so the
    # limit is reached in a one-token step (cap_to_remaining): after the prefill token,
    # steps emit 5, 5, 5, 4, 1 -> 21 tokens in 5 verify steps.
    assert all(o["meta_info"]["spec_verify_ct"] == 5 for o in outs)
    assert all(o["meta_info"]["spec_accept_length"] == pytest.approx(21 / 5) for o in outs)


@pytest.mark.parametrize(
    "chunk_forward, server_args, chain",
    [
        ("extend", (), True),
        ("decode_rows", (), True),
        ("decode_rows", ("--max-running-requests", "2"), True),
        ("decode_rows", (), False),
    ],
    ids=["extend", "decode_rows", "decode_row_pieces", "one_forward_per_draft_step"],
)
def test_self_draft_accepts_every_token_after_plain_decode_steps(
    tiny_models, tmp_path, chunk_forward, server_args, chain
):
    """The tiny target as its own draft, random lengths with k = 0 included: a request's
    drafting step after plain decodes catches its draft up over several committed
    tokens. Its greedy drafts equal the target's greedy tokens iff the draft's KV holds
    the exact prefix at the right positions (attention reads every token, RoPE every
    position), so every draft is accepted iff every catch-up (after a prefill, after
    plain decodes, after partial accepts) feeds the right tokens at the right positions
    and every draft step after it feeds the previous draft at the next position
    (float32: no near-ties at this size). Lossless alone cannot show this: a wrong
    catch-up costs acceptance, not output. With two decode rows per forward
    (--max-running-requests 2) catch-ups run in pieces of two tokens. The draft steps
    run as one chain (draft_chain.py: eager on CPU), which feeds the catch-up itself
    when no row lags more than MAX_FORCED_GAP tokens, or one forward per step with
    draft_chain off; rows with shorter lengths ride the chain to the longest."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(
        tmp_path / "faser.json",
        policy="random",
        chunk_forward=chunk_forward,
        trace_path=str(trace),
        seed=7,
        draft_chain=chain,
    )
    with launch_faser(tiny_models.target, tiny_models.target, env, *server_args) as server:
        generate(server.base_url, PROMPTS, {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True})
    steps = read_trace(trace)
    gaps = catchup_gaps(steps)
    assert sum(sum(s["draft_lens"]) for s in steps) > 0
    assert max(gaps) >= 3, "no catch-up spanned plain decode steps"
    assert all(s["num_accepted"] == s["draft_lens"] for s in steps)
    if server_args:
        assert any(s.get("catchup_forwards", 0) > 1 for s in steps), "no catch-up ran in pieces"
    how = Counter(s["draft_steps"] for s in steps if "draft_steps" in s)
    if chain:
        assert how["chain"] > 0 and how["graph"] == 0
        chains = [s for s in steps if s.get("draft_steps") == "chain"]
        # Mixed lengths in one chain: some row stopped short of the step's longest.
        assert any(len({k for k in s["draft_lens"] if k}) > 1 for s in chains)
        # Chains that fed the catch-up themselves, one with rows lagging 0 and 1 tokens
        # (a row stopped short of the longest keeps its KV through its last draft), and
        # chains after a catch-up of their own (after plain decodes).
        fed = [s for s in chains if s["catchup_forwards"] == 0]
        assert any(set(catchup_gaps([s])) == {0, 1} for s in fed)
        assert any(s["catchup_forwards"] > 0 for s in chains)
    else:
        assert how["chain"] == 0 and how["loop"] > 0


def test_sampled_self_draft_chain_accepts_every_token(tiny_models, tmp_path):
    """The tiny target as its own draft, sampling, greedy and logit-biased requests in
    one batch, random lengths: a sampled draft d ~ q passes with probability
    min(1, p(d) / q(d)), which is 1 only if the chain's q is the target's own transform
    of the same logits (bias, temperature, top-k, top-p, min-p) at the right positions,
    after the chain fed each draw to the next forward, and a biased greedy draft passes
    only if the chain took the argmax of the biased logits. So every draft is accepted
    iff the sampled chain feeds and keeps what it drew. No step drafts one forward at a
    time: sampled and biased steps chain."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy="random", trace_path=str(trace), seed=11)
    with launch_faser(tiny_models.target, tiny_models.target, env) as server:
        results = generate_sampled_mix(server.base_url)
    assert all(len(r["output_ids"]) == 40 for r in results)
    steps = read_trace(trace)
    assert sum(sum(s["draft_lens"]) for s in steps) > 0
    assert all(s["num_accepted"] == s["draft_lens"] for s in steps)
    how = Counter(s["draft_steps"] for s in steps if "draft_steps" in s)
    assert how["chain"] > 0 and how["loop"] == 0


def test_sampled_chain_tokens_follow_target_distribution(tiny_models, tmp_path):
    """A fixed policy drafts K_max tokens in the first verify step of a request that
    has K_max + 2 or more to go, so generated tokens 1..3 are a sampled chain's drafts,
    each accepted or replaced by rejection sampling against the chain's q: each follows
    the target's marginal."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy="fixed", trace_path=str(trace), seed=5)
    with launch_faser(tiny_models.target, tiny_models.draft, env) as server:
        assert_tokens_follow_target(tiny_models, server.base_url, positions=(1, 2, 3), max_new_tokens=K_MAX + 3)
    steps = read_trace(trace)
    chained = sum(s["draft_lens"].count(K_MAX) for s in steps if s.get("draft_steps") == "chain")
    assert chained >= 8 * 50, "first verify steps did not chain K_max drafts"
    assert not any(s.get("draft_steps") == "loop" for s in steps)
    accepted = sum(sum(s["num_accepted"]) for s in steps)
    assert 0 < accepted < sum(sum(s["draft_lens"]) for s in steps), "the draft should be neither exact nor useless"


def test_frontend_program_with_fork(nospec, faser):
    import sglang as sgl

    @sgl.function
    def program(s, topic):
        s += "# " + topic + "\ndef "
        s += sgl.gen("name", max_tokens=8, temperature=0)
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"\n# variant {i}\n"
            f += sgl.gen("body", max_tokens=12, temperature=0)
        s["bodies"] = [f["body"] for f in forks]

    def run(url):
        state = program.run(topic="parse arguments", backend=sgl.RuntimeEndpoint(url))
        return state["name"], state["bodies"]

    assert run(faser.base_url) == run(nospec.base_url)


def test_openai_client(nospec, faser, tiny_models):
    def both(url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        comp = client.completions.create(
            model=str(tiny_models.target), prompt="def main():", max_tokens=16, temperature=0
        )
        chat = client.chat.completions.create(
            model=str(tiny_models.target),
            messages=[{"role": "user", "content": "write a loop"}],
            max_tokens=16,
            temperature=0,
        )
        return comp.choices[0].text, chat.choices[0].message.content

    assert both(faser.base_url) == both(nospec.base_url)


def test_malformed_requests_get_4xx_and_server_keeps_serving(faser):
    url = faser.base_url + "/generate"
    bad = [
        {"text": "hi", "sampling_params": {"temperature": -1}},
        {"text": "hi", "sampling_params": {"top_p": 0}},
        {"text": "hi", "sampling_params": {"max_new_tokens": -5}},
        {"text": "hi", "sampling_params": {"top_k": -7}},
    ]
    for payload in bad:
        r = requests.post(url, json=payload, timeout=60)
        assert 400 <= r.status_code < 500, (payload, r.status_code, r.text)
    r = requests.post(url, data="{not json", headers={"Content-Type": "application/json"}, timeout=60)
    assert 400 <= r.status_code < 500
    assert len(generate(faser.base_url, ["ok"], GREEDY)[0]["output_ids"]) == 32


def test_abort_frees_kv(faser):
    deadline = time.monotonic() + 60
    while used_kv_tokens(faser.base_url) != 0:
        assert time.monotonic() < deadline, "KV not free before the test"
        time.sleep(0.5)
    abort_streams_and_wait_for_free_kv(faser.base_url, PROMPTS[3])
    assert len(generate(faser.base_url, ["after abort"], GREEDY)[0]["output_ids"]) == 32


@pytest.mark.parametrize(
    "policy, extra",
    [("adaptive", {}), ("adaptive", {"step_calibration": True}), ("random", {})],
    ids=["adaptive", "adaptive-calibrated", "random"],
)
def test_greedy_equality_holds_for_every_length_policy(nospec, tiny_models, tmp_path, policy, extra):
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy=policy, trace_path=str(trace), seed=7, **extra)
    reference = ids(generate(nospec.base_url, PROMPTS, GREEDY))
    with launch_faser(tiny_models.target, tiny_models.draft, env) as server:
        assert ids(generate(server.base_url, PROMPTS, GREEDY)) == reference
        log = server.log_tail(200_000)
    steps = read_trace(trace)
    assert steps and all(0 <= k <= K_MAX for s in steps for k in s["draft_lens"])
    assert all("draft_kv_lens" in s and "draft_seconds" in s for s in steps)
    if policy == "adaptive":
        assert "analytical" in log.lower()  # no cost file: the fallback is announced


def test_decode_rows_verify_and_catch_up_are_lossless(nospec, tiny_models, tmp_path):
    """The verify and the draft catch-up as one decode row per chunk token (the CUDA
    graph path on GPUs, forced here): greedy output equals no speculation and sampled
    output follows the target. The random policy leaves draft KV gaps of several
    tokens, so catch-up chunks longer than one token occur. Room for 256 decode rows
    (50 requests x (K_MAX + 1) verify tokens at most): every step uses them."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(
        tmp_path / "faser.json", policy="random", chunk_forward="decode_rows", trace_path=str(trace), seed=3
    )
    reference = ids(generate(nospec.base_url, PROMPTS, GREEDY))
    with launch_faser(tiny_models.target, tiny_models.draft, env, "--max-running-requests", "256") as server:
        assert ids(generate(server.base_url, PROMPTS, GREEDY)) == reference
        assert_second_token_follows_target(tiny_models, server.base_url)
    steps = read_trace(trace)
    gaps = catchup_gaps(steps)
    assert max(gaps) >= 2, "no catch-up fed more than one committed token"
    assert any(len(set(s["draft_lens"])) > 1 for s in steps)
    assert all(s["verify_forward"] == ("decode_rows" if any(s["draft_lens"]) else "plain_decode") for s in steps)
    assert any(s["verify_forward"] == "decode_rows" for s in steps)


def test_lazy_draft_prefill_catches_up_from_the_first_token(nospec, tiny_models, tmp_path):
    """With draft_prefill = "lazy" the draft skips prefills; a request's first draft
    catches up over its whole sequence. The identity pair shows the catch-up ends with
    the bonus token (every draft accepted); the tiny pair with random lengths
    (some requests start drafting many steps in) is lossless: greedy output equals no
    speculation and sampled output follows the target."""
    trace = tmp_path / "identity.jsonl"
    env = write_faser_config(tmp_path / "identity.json", policy="fixed", draft_prefill="lazy", trace_path=str(trace))
    with launch_faser(tiny_models.identity, tiny_models.identity, env) as server:
        generate(server.base_url, PROMPTS[:6], {"max_new_tokens": 13, "temperature": 0, "ignore_eos": True})
    steps = read_trace(trace)
    first = {}
    for s in steps:
        for rid, d, k in zip(s["rids"], s["draft_kv_lens"], s["draft_lens"]):
            first.setdefault(rid, (d, k))
    # The server's own health-check generations ask for one token: the prefill emits it,
    # and under the overlap schedule the decode step launched before that result was
    # processed still carries them (capped to k = 0; SGLang discards its output).
    first = {rid: dk for rid, dk in first.items() if not rid.startswith("HEALTH_CHECK")}
    assert len(first) >= 6 and all(d == 0 and k > 0 for d, k in first.values())
    assert all(s["num_accepted"] == s["draft_lens"] for s in steps)

    trace = tmp_path / "random.jsonl"
    env = write_faser_config(tmp_path / "random.json", policy="random", draft_prefill="lazy", trace_path=str(trace), seed=5)
    reference = ids(generate(nospec.base_url, PROMPTS, GREEDY))
    with launch_faser(tiny_models.target, tiny_models.draft, env) as server:
        assert ids(generate(server.base_url, PROMPTS, GREEDY)) == reference
        assert_second_token_follows_target(tiny_models, server.base_url)
    late = [n for s in read_trace(trace) for n, d, k in zip(s["seq_lens"], s["draft_kv_lens"], s["draft_lens"])
            if d == 0 and k > 0]  # fmt: skip
    assert late, "no request caught up from the first token"


def test_steps_without_drafts_are_plain_decode_steps(nospec, tiny_models, tmp_path):
    """A policy that never drafts (ema with min_token_value 0.999 keeps every k_i at 0):
    every step is a plain decode through SGLang's model worker and sampler. Greedy
    output equals no speculation, sampled output follows the target, and a request
    asking for logprobs still gets them (such a batch verifies through the general path)."""
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy="ema", min_token_value=0.999, trace_path=str(trace))
    reference = ids(generate(nospec.base_url, PROMPTS, GREEDY))
    with launch_faser(tiny_models.target, tiny_models.draft, env) as server:
        assert ids(generate(server.base_url, PROMPTS, GREEDY)) == reference
        assert_second_token_follows_target(tiny_models, server.base_url)
        plain_steps = len(read_trace(trace))
        with_logprobs = generate(
            server.base_url, PROMPTS[:2], {**GREEDY, "max_new_tokens": 8}, extra={"return_logprob": True}
        )
    assert ids(with_logprobs) == [r[:8] for r in reference[:2]]
    assert all(len(o["meta_info"]["output_token_logprobs"]) == 8 for o in with_logprobs)
    steps = read_trace(trace)
    assert all(k == 0 for s in steps for k in s["draft_lens"])
    assert {s["verify_forward"] for s in steps[:plain_steps]} == {"plain_decode"}
    assert steps[plain_steps:] and all(s["verify_forward"] != "plain_decode" for s in steps[plain_steps:])
