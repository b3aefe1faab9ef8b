"""GPU end-to-end: FASER greedy output equals no-speculation on FlashInfer and Triton,
the identity model accepts every draft, with and without the draft's CUDA graphs.

Run on a CUDA machine with ``scripts/gpu/run_gpu_tests.sh`` (installs the pinned
SGLang bundle first). bf16 greedy output can legitimately differ between batch
shapes when two logits are within rounding of each other, so bf16 comparisons
count only *non-tie* mismatches: at the first differing position the no-spec
server's top-2 log-probabilities (whose difference is the difference of the two
bf16 logits) must be more than TIE_ULPS bf16 units in the last place apart, or
FASER's token must not be the reference's runner-up, for the mismatch to count.
The unit is the bf16 spacing at the model's largest |logit| (measured in float32 on
the test prompts and their greedy continuations): the rounding step of the logits
being compared, not of the log-probabilities.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

from conftest import (
    TinyModels,
    build_tiny_models,
    catchup_gaps,
    read_trace,
    sampled_mix_with_bias,
    write_faser_config,
)
from faser_sglang import host_plan
from faser_sglang.bench.servers import launch
from faser_sglang.kv_reserve import MAX_FORCED_GAP
from faser_sglang.sched_timeline import TIMELINE_ENV

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

K_MAX = 4
TIE_ULPS = 2  # bf16 ULPs of the logits between the top-2 within which greedy may flip
BASE_FLAGS = (
    "--cuda-graph-backend-prefill", "disabled",  # saves ~70 s of capture per server
    # Every verify of 30 requests x (K_MAX + 1) tokens fits the decode graphs, so the
    # graph variants verify as decode rows (chunk_forward.py) on every step.
    "--cuda-graph-max-bs", "160",
    "--mem-fraction-static", "0.5",
    # The target's memory plan does not reserve the FASER draft's KV pool; a token
    # cap keeps both pools small (see README, known limitations).
    "--max-total-tokens", "200000",
)  # fmt: skip
VARIANTS = {
    # SGLang's CUDA RMSNorm has no float32 kernel, so GPU runs are bf16 (tie-checked).
    "triton-bf16-graphs": ("--attention-backend", "triton", "--dtype", "bfloat16"),
    "flashinfer-bf16-graphs": ("--attention-backend", "flashinfer", "--dtype", "bfloat16"),
    "flashinfer-bf16-eager": (
        "--attention-backend", "flashinfer", "--dtype", "bfloat16",
        "--cuda-graph-backend-decode", "disabled",
    ),
    # Lazy draft prefill: the draft reads each prompt at the request's first draft
    # (its catch-up feeds the whole sequence) instead of at the prefill.
    "flashinfer-bf16-graphs-lazy": ("--attention-backend", "flashinfer", "--dtype", "bfloat16"),
    # The draft (its catch-ups and chains) on Triton, the target on FlashInfer.
    "flashinfer-bf16-graphs-draft-triton": ("--attention-backend", "flashinfer", "--dtype", "bfloat16"),
    # The same, each step's chain queued at the end of the step before (draft_ahead.py).
    "flashinfer-bf16-graphs-draft-triton-ahead": ("--attention-backend", "flashinfer", "--dtype", "bfloat16"),
    # Prefills (the target's) and catch-ups (the draft's) planned from host lengths
    # (host_plan.py): every plan's pointers checked against SGLang's on the device, which
    # waits for the GPU at each plan; then as served, without the check. The reference
    # is stock SGLang's.
    "flashinfer-bf16-graphs-host-plan": ("--attention-backend", "flashinfer", "--dtype", "bfloat16"),
    "flashinfer-bf16-graphs-host-plan-async": ("--attention-backend", "flashinfer", "--dtype", "bfloat16"),
    # Prefill CUDA graphs as a stock launch has them on CUDA (SGLang 0.5.17's default
    # prefill backend, breakable), for both servers: FASER's target captures them as a
    # plain decoder's and replays them for its prefills.
    "flashinfer-bf16-graphs-prefill-graphs": (
        "--attention-backend", "flashinfer", "--dtype", "bfloat16", "--cuda-graph-backend-prefill", "breakable",
    ),
    # All of the last three at once, as the bursty A/B serves FASER-AD: the draft on Triton
    # drafting ahead, host plans and prefill graphs.
    "flashinfer-bf16-graphs-served": (
        "--attention-backend", "flashinfer", "--dtype", "bfloat16", "--cuda-graph-backend-prefill", "breakable",
    ),
}  # fmt: skip
PREFILL_GRAPH_LOG = re.compile(r"Prefill batch, .*cuda graph: True")  # SGLang's line for a prefill that replayed one
VARIANT_ENV = {
    "flashinfer-bf16-graphs-host-plan": {host_plan.ENV: host_plan.CHECK},
    "flashinfer-bf16-graphs-host-plan-async": {host_plan.ENV: "1"},
    "flashinfer-bf16-graphs-served": {host_plan.ENV: "1"},
}
CONFIGS = {  # FASER config per variant
    "flashinfer-bf16-graphs-lazy": {"draft_prefill": "lazy"},
    "flashinfer-bf16-graphs-draft-triton-ahead": {"draft_ahead": True},
    "flashinfer-bf16-graphs-served": {"draft_ahead": True},
}
TRITON_DRAFT = ("--speculative-draft-attention-backend", "triton")
FASER_FLAGS = {
    "flashinfer-bf16-graphs-draft-triton": TRITON_DRAFT,
    "flashinfer-bf16-graphs-draft-triton-ahead": TRITON_DRAFT,
    "flashinfer-bf16-graphs-served": TRITON_DRAFT,
}
PROMPTS = [
    "def foo(x):",
    "import os\n",
    "hello",
    "class A:\n    def __init__(self, value):\n        self.value = value\n",
    "x = [1, 2, 3]\nfor i in x:\n    print(i)\n" * 8,
    "print(",
    "while True:\n    ",
    "# A long comment about argument parsing and help text\n" * 20,
    "return",
    "from dataclasses import dataclass\n\n@dataclass\nclass Point:\n",
] * 3
GREEDY = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
RESULTS = Path(os.environ.get("FASER_GPU_RESULTS", "gpu_results.jsonl"))


@pytest.fixture(scope="session")
def gpu_models(tmp_path_factory) -> TinyModels:
    # FlashInfer kernels need head_dim >= 64: 256 hidden / 4 heads.
    return build_tiny_models(tmp_path_factory.mktemp("gpu-models"), hidden_size=256, intermediate_size=512)


def _post(url: str, payload: dict) -> dict:
    r = requests.post(url + "/generate", json=payload, timeout=600)
    r.raise_for_status()
    return r.json()


def _prompt_ids(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [tok(p)["input_ids"] for p in PROMPTS]


def _generate_all(url: str, prompt_ids: list[list[int]], params: dict) -> list[dict]:
    with ThreadPoolExecutor(len(prompt_ids)) as pool:
        return list(pool.map(lambda ids: _post(url, {"input_ids": ids, "sampling_params": params}), prompt_ids))


def _reference(url: str, prompt_ids: list[list[int]]) -> list[dict]:
    """Greedy no-spec outputs with the top-2 log-probs at every generated position."""
    params = dict(GREEDY)
    with ThreadPoolExecutor(len(prompt_ids)) as pool:
        return list(
            pool.map(
                lambda ids: _post(
                    url,
                    {"input_ids": ids, "sampling_params": params, "return_logprob": True, "top_logprobs_num": 2},
                ),
                prompt_ids,
            )
        )


def bf16_ulp(x: float) -> float:
    """Spacing of bf16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def is_near_tie(d: dict, logit_ulp: float) -> bool:
    """A divergence explained by bf16 rounding: the reference's top-2 are exactly tied,
    or FASER emitted the runner-up and the two are within TIE_ULPS logit ULPs."""
    return d["margin"] == 0.0 or (d["runner_up"] and d["margin"] <= TIE_ULPS * logit_ulp)


@pytest.fixture(scope="session")
def logit_ulp(gpu_models) -> float:
    """bf16 spacing at the target's largest |logit| over the test prompts and their
    48-token greedy continuations (transformers, float32, CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gpu_models.target))
    model = AutoModelForCausalLM.from_pretrained(str(gpu_models.target), dtype=torch.float32)
    largest = 0.0
    with torch.no_grad():
        for prompt in dict.fromkeys(PROMPTS):
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            seq = model.generate(ids, max_new_tokens=GREEDY["max_new_tokens"], do_sample=False)
            largest = max(largest, model(seq).logits.abs().max().item())
    return bf16_ulp(largest)


def _divergences(ref: list[dict], got: list[dict]) -> list[dict]:
    """For each mismatching request: where it diverged, the reference's top-2
    margin there and whether the other token was the reference's runner-up."""
    out = []
    for r, g in zip(ref, got):
        a, b = r["output_ids"], g["output_ids"]
        if a == b:
            continue
        j = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        top = r["meta_info"]["output_top_logprobs"][j]  # [[logprob, token_id, text], ...]
        out.append(
            {
                "position": j,
                "margin": round(float(top[0][0] - top[1][0]), 4),
                "top_logprob": round(float(top[0][0]), 4),
                "runner_up": b[j] == top[1][1],
            }
        )
    return out


def _record(row: dict) -> None:
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")


_REFERENCES: dict[tuple, list[dict]] = {}


def _no_spec_reference(target, flags: tuple, prompt_ids) -> list[dict]:
    """The stock no-spec server's greedy outputs with ``flags``, one server per set of
    flags in a session: variants that differ only in FASER's config or environment
    share it (a server launch with graph capture takes minutes of GPU time)."""
    key = (str(target), flags)
    if key not in _REFERENCES:
        with launch(target, flags) as server:
            _REFERENCES[key] = _reference(server.base_url, prompt_ids)
    return _REFERENCES[key]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_equals_no_spec(variant, gpu_models, logit_ulp, tmp_path):
    flags = (*BASE_FLAGS, *VARIANTS[variant])
    prompt_ids = _prompt_ids(gpu_models.target)
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", trace_path=str(trace), **CONFIGS.get(variant, {}))
    env.update(VARIANT_ENV.get(variant, {}))
    faser_args = (
        *flags,
        "--speculative-algorithm", "FASER",
        "--speculative-draft-model-path", str(gpu_models.draft),
        "--speculative-num-steps", str(K_MAX),
        *FASER_FLAGS.get(variant, ()),
    )  # fmt: skip
    ref = _no_spec_reference(gpu_models.target, flags, prompt_ids)
    with launch(gpu_models.target, faser_args, env=env) as fserver:
        got = _generate_all(fserver.base_url, prompt_ids, GREEDY)
    divergences = _divergences(ref, got)
    mismatched = len(divergences)
    real = sum(not is_near_tie(d, logit_ulp) for d in divergences)
    steps = read_trace(trace)
    accept = sum(sum(s["num_accepted"]) for s in steps) / max(1, sum(sum(s["draft_lens"]) for s in steps))
    forwards = Counter(s["verify_forward"] for s in steps)
    _record({"test": "greedy_equality", "variant": variant, "requests": len(PROMPTS),
             "mismatched": mismatched, "non_tie_mismatches": real, "logit_ulp": logit_ulp, "draft_accept_rate": round(accept, 3),
             "steps": len(steps), "mixed_length_steps": sum(len(set(s["draft_lens"])) > 1 for s in steps),
             "verify_forwards": dict(forwards), "divergences": divergences})  # fmt: skip
    assert real == 0
    # Steps that verify drafts take the variant's forward; steps without drafts are plain decodes.
    expected = "extend" if variant.endswith("eager") else "decode_rows"
    assert all(s["verify_forward"] == (expected if any(s["draft_lens"]) else "plain_decode") for s in steps)
    assert forwards[expected] > 0
    if CONFIGS.get(variant, {}).get("draft_prefill") == "lazy":
        assert steps[0]["draft_kv_lens"] == [0] * len(steps[0]["draft_kv_lens"])  # no draft prefill ran
    if CONFIGS.get(variant, {}).get("draft_ahead"):
        assert any(s.get("draft_steps") == "ahead" for s in steps)
    if host_plan.ENV in VARIANT_ENV.get(variant, {}):  # the plans did come from host lengths
        assert host_plan.FIRST_PLAN_LOG in fserver.log_path.read_text(errors="replace")
    if "--cuda-graph-backend-prefill" in VARIANTS[variant]:  # FASER's prefills did replay a graph
        assert PREFILL_GRAPH_LOG.search(fserver.log_path.read_text(errors="replace"))


def test_serving_compiles_no_index_kernel_nor_draft_extend(gpu_models, tmp_path):
    """Two Triton kernels a FASER server compiled inside its scheduler's loop compile no
    more while serving: the multi-step draft backend's index kernel when drafting ahead at
    odd batch sizes, where a row of a packed copy starts off a 16-byte boundary (the chain
    hands it aligned rows, tensors.aligned, whose variants graph capture compiled), and the
    draft's Triton extend attention, which every eager draft prefill runs (compiled at
    startup, kernel_warmup.warm_draft_extend_attention). Every Triton compile the
    scheduler timeline records while serving goes to the results file."""
    timeline = tmp_path / "timeline"
    env = write_faser_config(tmp_path / "faser.json", policy="fixed", draft_ahead=True)
    env[TIMELINE_ENV] = str(timeline)
    variant = "flashinfer-bf16-graphs-draft-triton-ahead"
    args = (
        *BASE_FLAGS, *VARIANTS[variant],
        "--speculative-algorithm", "FASER",
        "--speculative-draft-model-path", str(gpu_models.draft),
        "--speculative-num-steps", str(K_MAX),
        *FASER_FLAGS[variant],
    )  # fmt: skip
    prompt_ids = _prompt_ids(gpu_models.target)
    with launch(gpu_models.target, args, env=env) as server:
        log = server.log_tail(2_000_000)
        for n in (1, 3, 5, 7):  # one round per batch size, each drafting ahead over n rows
            _generate_all(server.base_url, prompt_ids[:n], {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True})
    assert re.search(r"compiled the draft's Triton extend attention for 1 kind", log)
    (path,) = timeline.glob("sched-*.jsonl")
    header, *records = read_trace(path)
    assert header["triton_compiles"]
    compiles = [r for r in records if r["fn"] == "triton_compile"]
    # The first prefill launches SGLang's KV index kernel first in this process (its
    # compile, or load from Triton's disk cache): none recorded means the hooks never ran.
    assert compiles, "the timeline recorded no Triton compile: Triton's compile hooks were not called"
    fields = ("kernel", "module", "ms", "spec", "key")
    recorded = [{f: r.get(f) for f in fields} for r in compiles]
    _record({"test": "serving_compiles", "variant": variant, "compiles": recorded})
    assert [r["spec"] for r in compiles if r["kernel"] == "generate_draft_decode_kv_indices"] == []
    assert [r["spec"] for r in compiles if (r["module"] or "").endswith(".extend_attention")] == []


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("policy", ["ema", "adaptive"])
def test_tp2_greedy_equals_no_spec(policy, gpu_models, logit_ulp, tmp_path):
    """--tp 2: both ranks must take the same per-request lengths and feed the same
    drafts (tp_sync.py); greedy output equals no-spec at TP=2, sampled requests in
    the same batches finish well-formed."""
    flags = (*BASE_FLAGS, *VARIANTS["flashinfer-bf16-graphs"], "--tp", "2")
    prompt_ids = _prompt_ids(gpu_models.target)
    trace = tmp_path / "trace.jsonl"
    env = write_faser_config(tmp_path / "faser.json", policy=policy, trace_path=str(trace))
    faser_args = (
        *flags,
        "--speculative-algorithm", "FASER",
        "--speculative-draft-model-path", str(gpu_models.draft),
        "--speculative-num-steps", str(K_MAX),
    )  # fmt: skip
    ref = _no_spec_reference(gpu_models.target, flags, prompt_ids)  # one server for both policies
    sampled = {"max_new_tokens": 48, "temperature": 0.8, "top_p": 0.9, "ignore_eos": True}
    with launch(gpu_models.target, faser_args, env=env) as fserver, ThreadPoolExecutor(2) as pool:
        sampled_outs = pool.submit(_generate_all, fserver.base_url, prompt_ids[:10], sampled)
        got = _generate_all(fserver.base_url, prompt_ids, GREEDY)
        sampled_outs = sampled_outs.result()
    divergences = _divergences(ref, got)
    real = sum(not is_near_tie(d, logit_ulp) for d in divergences)
    steps = read_trace(trace)
    _record({"test": "tp2_greedy_equality", "policy": policy, "requests": len(PROMPTS),
             "mismatched": len(divergences), "non_tie_mismatches": real, "logit_ulp": logit_ulp, "steps": len(steps),
             "mixed_length_steps": sum(len(set(s["draft_lens"])) > 1 for s in steps),
             "divergences": divergences})  # fmt: skip
    assert real == 0
    assert all(len(o["output_ids"]) == sampled["max_new_tokens"] for o in sampled_outs)


@pytest.mark.parametrize(
    "variant, policy, graph_bs",
    [
        ("flashinfer-bf16-graphs", "fixed", None),
        ("flashinfer-bf16-graphs", "random", None),
        ("flashinfer-bf16-graphs", "random", 8),
        ("triton-bf16-graphs", "random", None),
        ("flashinfer-bf16-graphs-draft-triton", "random", None),
        ("flashinfer-bf16-graphs-draft-triton-ahead", "fixed", None),
        ("flashinfer-bf16-graphs-draft-triton-ahead", "random", None),
    ],
)
def test_identity_model_accepts_every_draft(variant, policy, graph_bs, gpu_models, tmp_path):
    """Every draft is accepted: each catch-up ends with the request's bonus token and each
    draft step feeds the previous draft (the identity model's next token depends only on
    the token fed). "random" includes k = 0, so drafting steps catch up over
    plain-decode steps (gaps of several tokens), and mixes lengths in one chain. The
    draft steps replay one captured chain (draft_chain.py), which feeds the catch-up
    itself when no row lags more than MAX_FORCED_GAP tokens. With
    decode graphs of at most 8 rows a catch-up of 9-64 tokens replays them in pieces,
    and chains over more than 8 rows run eagerly. The FlashInfer servers with random
    lengths then serve sampling requests too (``_check_sampled_chains``). Drafting ahead,
    chains replay behind the accept from the device's lengths alone: nearly every step
    after a request's first draft (a plain step queues the next step's chain too); rows
    back after plain steps are caught up at the end of the step before."""
    trace = tmp_path / "trace.jsonl"
    config = CONFIGS.get(variant, {})
    env = write_faser_config(tmp_path / "faser.json", policy=policy, trace_path=str(trace), seed=7, **config)
    args = (
        *BASE_FLAGS, *VARIANTS[variant],
        "--speculative-algorithm", "FASER",
        "--speculative-draft-model-path", str(gpu_models.identity),
        "--speculative-num-steps", str(K_MAX),
        *(() if graph_bs is None else ("--cuda-graph-max-bs", str(graph_bs))),
        *FASER_FLAGS.get(variant, ()),
    )  # fmt: skip
    sampled = variant == "flashinfer-bf16-graphs" and policy == "random"
    with launch(gpu_models.identity, args, env=env) as server:
        outs = _generate_all(
            server.base_url,
            _prompt_ids(gpu_models.identity),
            {"max_new_tokens": 41, "temperature": 0, "ignore_eos": True},
        )
        sampled_outs = []
        if sampled:
            mix = sampled_mix_with_bias([o["output_ids"] for o in outs])
            sampled_outs = _generate_mixed(server.base_url, _prompt_ids(gpu_models.identity), mix, 41)
    steps = read_trace(trace)
    if sampled:  # the two rounds' steps apart, by their requests
        ids = {o["meta_info"]["id"] for o in sampled_outs}
        _check_sampled_chains([s for s in steps if ids & set(s["rids"])], sampled_outs, graph_bs)
        steps = [s for s in steps if not ids & set(s["rids"])]
    drafted = sum(sum(s["draft_lens"]) for s in steps)
    accepted = sum(sum(s["num_accepted"]) for s in steps)
    mean_len = sum(o["meta_info"]["spec_accept_length"] for o in outs) / len(outs)
    gaps = catchup_gaps(steps)
    pieces = max((s.get("catchup_forwards", 0) for s in steps), default=0)
    _record({"test": "identity_acceptance", "variant": variant, "policy": policy, "graph_bs": graph_bs,
             "drafted": drafted,
             "accepted": accepted, "mean_spec_accept_length": round(mean_len, 3),
             "max_catchup_gap": max(gaps, default=0),
             "max_catchup_forwards": pieces})  # fmt: skip
    how = Counter(s["draft_steps"] for s in steps if "draft_steps" in s)
    # Chains that fed the catch-up themselves (no catch-up forward of their own).
    fed = sum(1 for s in steps if s.get("draft_steps") in ("graph", "chain") and s["catchup_forwards"] == 0)
    _record({"test": "identity_draft_steps", "variant": variant, "policy": policy, "graph_bs": graph_bs, **how,
             "chains_fed_the_catchup": fed})  # fmt: skip
    assert drafted > 0 and accepted == drafted
    assert how["graph"] > 0 and how["loop"] == 0
    if config.get("draft_ahead"):
        # A step drafts for itself where the last one queued no chain (a prefill, or a
        # chain that could not run ahead); a row lagging more than MAX_FORCED_GAP tokens
        # then has a catch-up forward of its own, so chains rarely feed it.
        assert how["ahead"] > 0
        if policy == "random":  # a row lagging more than the chain feeds drafted ahead
            assert any(
                s.get("draft_steps") == "ahead" and max(catchup_gaps([s]), default=0) > MAX_FORCED_GAP for s in steps
            ), "no row was caught up ahead"
    else:
        assert fed > 0
    if graph_bs is not None:
        assert how["chain"] > 0, "no chain ran past the captured batch sizes"
    if policy == "random":
        assert max(gaps) >= 3
    if graph_bs is not None:
        assert pieces > 1, "no catch-up ran in pieces"


def _generate_mixed(url: str, prompt_ids: list[list[int]], mix: tuple[dict, ...], max_new_tokens: int) -> list[dict]:
    """All prompts at once, prompt i with sampling parameters mix[i % len(mix)]."""
    def one(i: int) -> dict:
        params = {**mix[i % len(mix)], "max_new_tokens": max_new_tokens, "ignore_eos": True}
        return _post(url, {"input_ids": prompt_ids[i], "sampling_params": params})

    with ThreadPoolExecutor(len(prompt_ids)) as pool:
        return list(pool.map(one, range(len(prompt_ids))))


def _check_sampled_chains(steps: list[dict], outs: list[dict], graph_bs) -> None:
    """Sampling, greedy and logit-biased requests in one batch, the identity model as its
    own draft: draft steps run as sampled chains replayed from their CUDA graphs (with
    ``graph_bs`` 8, steps of more drafting rows draft one forward at a time). Its q equals the
    target's p up to bf16 rounding, so nearly every draft passes rejection sampling, and
    only if each chain forward was fed the token the previous one drew (the identity
    model's next token depends on it alone) and the verify read the q the chain kept.
    On CPU in float32 the tiny target as its own draft accepts every one
    (test_e2e_faser.py)."""
    drafted = sum(sum(s["draft_lens"]) for s in steps)
    accepted = sum(sum(s["num_accepted"]) for s in steps)
    how = Counter(s["draft_steps"] for s in steps if "draft_steps" in s)
    _record({"test": "identity_sampled_chains", "graph_bs": graph_bs, "drafted": drafted, "accepted": accepted,
             **how})  # fmt: skip
    assert all(len(o["output_ids"]) == 41 for o in outs)
    assert drafted > 0 and accepted >= 0.9 * drafted
    assert how["graph"] > 0
    if graph_bs is None:  # every step fits the graphs
        assert how["loop"] == 0 and how["chain"] == 0
    else:
        assert how["loop"] > 0, "no sampled step past the sampled graphs drafted one forward at a time"
