"""GPU differential fuzzing: the CPU fuzzer's seeded cases (test_fuzz_differential.py:
random prompts and lengths, greedy and sampled parameters, n > 1, stop strings and
token ids, ignore_eos, logprobs, random arrival) against bf16 FlashInfer servers with
decode CUDA graphs, many more of them.

Every FASER answer must be well formed (status, n completions, length and stop rules).
Deterministic completions must equal no-spec's token for token, except where bf16
rounding flips a near-tie (test_gpu_faser.is_near_tie): the servers batch the randomly
arriving requests differently, and bf16 decoding is not batch-invariant. To judge
that, the no-spec round asks for the top-2 log-probabilities of every deterministic
case (this does not change its tokens). FASER_GPU_FUZZ_SEEDS and FASER_GPU_FUZZ_CASES
size the run; a failure prints one reproducer line per problem.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import pytest
import torch

from fuzz_utils import faser_flags, outputs_of
from test_fuzz_differential import FuzzCase, Vocabulary, answered, make_case, run_round, structural_problems
from gpu.test_gpu_faser import BASE_FLAGS, RESULTS, VARIANTS, gpu_models, is_near_tie, logit_ulp  # noqa: F401 - fixtures

from faser_sglang.bench.servers import launch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SEEDS = tuple(range(int(os.environ.get("FASER_GPU_FUZZ_SEEDS", "6"))))
CASES_PER_SEED = int(os.environ.get("FASER_GPU_FUZZ_CASES", "48"))
K_MAX = 4
FLAGS = (*BASE_FLAGS, *VARIANTS["flashinfer-bf16-graphs"])


def with_top2(case: FuzzCase) -> FuzzCase:
    """The no-spec request of a deterministic case also returns its top-2 log-probs.
    A top_k = 1 case is sent with temperature 0 (the same argmax token): SGLang reports
    log-probs of logits / T in a batch that is not all greedy, and the near-tie rule
    needs the margin in logit units."""
    if not case.deterministic:
        return case
    params = {**case.params, "temperature": 0}
    payload = {**case.payload, "sampling_params": params, "return_logprob": True}
    payload["top_logprobs_num"] = max(2, int(case.payload.get("top_logprobs_num", 0)))
    return replace(case, payload=payload)


def divergence(got: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any] | None:
    """None if FASER's tokens equal no-spec's; else where they split and whether it is
    a near-tie candidate (the reference's top-2 margin there, FASER's token its runner-up)."""
    a, b = ref["output_ids"], got["output_ids"]
    if a == b:
        return None
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is None:  # one is a prefix of the other: a stop or length difference, never a tie
        return {"position": min(len(a), len(b)), "margin": float("inf"), "runner_up": False}
    tops = ref["meta_info"].get("output_top_logprobs") or []
    if j >= len(tops) or len(tops[j]) < 2:  # no top-2 to judge by: never a tie
        return {"position": j, "margin": float("inf"), "runner_up": False}
    top = tops[j]  # [[logprob, token_id, text], ...]
    return {"position": j, "margin": round(float(top[0][0] - top[1][0]), 4), "runner_up": b[j] == top[1][1]}


def test_gpu_fuzz_faser_matches_no_speculation(gpu_models, logit_ulp) -> None:  # noqa: F811
    vocab = Vocabulary(str(gpu_models.target))
    rounds = {seed: [make_case(seed, i, vocab) for i in range(CASES_PER_SEED)] for seed in SEEDS}
    with launch(gpu_models.target, FLAGS) as server:
        reference = {seed: run_round(server.base_url, [with_top2(c) for c in cases]) for seed, cases in rounds.items()}
    with launch(gpu_models.target, (*FLAGS, *faser_flags(gpu_models.draft, K_MAX))) as server:
        got = {seed: run_round(server.base_url, cases) for seed, cases in rounds.items()}

    failures: list[str] = []
    identical = ties = compared = 0
    for seed, cases in rounds.items():
        for case, g, r in zip(cases, got[seed], reference[seed]):
            failures += [case.line(p) for p in structural_problems(case, g, r, vocab)]
            if not (case.deterministic and answered(case, g, r)):
                continue
            for g_out, r_out in zip(outputs_of(g[1]), outputs_of(r[1])):
                compared += 1
                d = divergence(g_out, r_out)
                if d is None:
                    identical += 1
                    reason = (g_out["meta_info"]["finish_reason"], r_out["meta_info"]["finish_reason"])
                    if reason[0] != reason[1] or g_out["text"] != r_out["text"]:
                        failures.append(case.line(f"same tokens, different finish_reason or text: {reason}"))
                elif is_near_tie(d, logit_ulp):
                    ties += 1
                else:
                    failures.append(case.line(f"greedy output differs from no-spec beyond a bf16 near-tie: {d}"))
    with RESULTS.open("a") as f:
        row = {"test": "gpu_fuzz", "seeds": len(SEEDS), "cases": len(SEEDS) * CASES_PER_SEED,
               "deterministic_completions": compared, "identical": identical, "near_tie_divergences": ties,
               "problems": len(failures), "logit_ulp": logit_ulp}  # fmt: skip
        f.write(json.dumps(row) + "\n")
    if failures:
        print("\n".join(failures))
    assert not failures, f"{len(failures)} problem(s):\n" + "\n".join(failures[:50])
