"""Replay the Adaptive Drafter against a profiled cost model with synthetic acceptance.

    python scripts/simulate_policy.py --costs costs.json [--accept 0.61 0.54 0.64 0.55] \\
        [--accept-spread 0.13] [--bad-accept 0.3 --bad-steps 100] [--batch-sizes 1 4 16 64] [--steps 3000] \\
        [--prompt-tokens 100 400] [--eager-prefill] [--catchup-horizon 16] \\
        [--catchup-piece-tokens 128] [--max-verify-tokens 128] [--fixed-lengths 1 3 5] \\
        [--ramp START END GROW [--ramp-warm-steps 600] [--ramp-hold-steps 100]] \
        [--drafting-overhead-ms 3 [--step-calibration]] [--chained] [--oracle]

No GPU and no server: the real policy object (acceptance windows, pooled prior,
allocator) chooses every step's lengths; drafts are accepted at random with the given
per-position conditional probabilities (the last one repeats), each request's
shifted by its own offset drawn from N(0, --accept-spread) (requests differ: on
HumanEval the 13.5B pair's per-request first-draft acceptance has a spread of 0.13
beyond sampling noise, measured with STANDALONE k = 1), and for the first
--bad-steps steps --bad-accept instead, unshifted (an unlucky start); each request decodes
--output-tokens tokens and is replaced by a new one at once, so the batch stays at
the batch size. Draft KV follows the worker's rules: a request that drafts k catches
up and feeds all but its last draft (its draft KV then covers min(L + k, the new
committed length)); one that does not lags; a new request starts with no draft KV
(lazy prefill, the adaptive default) or with its prompt (--eager-prefill). A catch-up
runs as one draft forward per --catchup-piece-tokens tokens (the draft's largest
decode CUDA graph, --cuda-graph-max-bs; 0: always one forward), at most
MAX_CATCHUP_PIECES, as the worker runs it, and a step's verify tokens stay within
--max-verify-tokens (the target's largest decode CUDA graph; 0: no cap), as the
worker asks of the allocator; near the end of its answer a request drafts at most
its tokens left less 2 (policy.draft_caps), as the worker caps it.

For each batch size it prints the share of steps in which anyone drafted, the mean
drafts per step over the last quarter of the run, and the cost model's throughput of
the chosen lengths (emitted tokens over the predicted time of every step, catch-ups
charged in full) against plain decoding at the same batch size. Beside it, the best of
--fixed-lengths: the same run (same seed, so the same requests and acceptance draws)
with every request drafting that one length every step whatever the load, as the
A/B's STANDALONE contenders do (not shortened to --max-verify-tokens, as FASER's fixed
policy would be), priced by the same cost model, and the adaptive policy's throughput
against it: the A/B's bar "1.2x the best fixed length" read at one batch size. What it
shows is the policy's behaviour under the cost model (does it draft where drafting pays,
recover from a bad start, stay off where it does not pay, how far it can beat a fixed
length at a load), not a measured speed.

--drafting-overhead-ms makes every drafting step (adaptive and fixed) take that much
longer than the cost model predicts, as the scheduler's loop does on the GPU when a step
publishes its lengths only after its accept; the speed-ups are then against the true
times. --step-calibration turns on the policy's ``step_calibration``, which measures that
excess from the simulated step times and prices it (adaptive/calibration.py).

--chained prices (and has the policy choose for) draft steps run as one chain, as a
server with ``draft_chain`` runs them: every drafting request runs to the
step's longest draft, one step more when one of them lags (cost_model.py), and its
draft KV then covers min(L + that longest draft, the new committed length).

--oracle hands the policy every request's true per-position acceptance (shift included)
in place of its acceptance windows: the same allocator with perfect estimates, so its
gap to the default run is what estimating acceptance costs.

With --ramp it also replays a burst: --ramp-warm-steps steps at START requests, then GROW
more requests every step up to END, then --ramp-hold-steps steps at END, and prints the
ramp and the hold apart against plain decoding of the same batches and against the best
fixed length. New requests join with no draft KV (unless --eager-prefill), so a ramp
shows what the policy's catch-up charge (spread over --catchup-horizon steps, a bet
that the request keeps drafting) costs when the batch outgrows drafting within a few
steps.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from faser_sglang.config import FaserConfig
from faser_sglang.spec_worker.adaptive import AdaptiveDrafterPolicy, CostModel, read_cost_entries
from faser_sglang.spec_worker.policy import StepContext, draft_caps


@dataclass(frozen=True)
class SimResult:
    batch_size: int
    drafting_steps: float  # share of steps in which any request drafted
    late_drafts: float  # mean sum of k_i per step over the last quarter of the run
    speedup: float  # modelled tokens/s of the chosen lengths / plain decoding's


@dataclass(frozen=True)
class StepOutcome:
    tokens: int  # emitted: accepted drafts plus one per request
    seconds: float  # the cost model's time of the chosen lengths
    plain_seconds: float  # ... of a plain decode of the same batch
    drafts: int  # sum of k_i
    requests: int


class SimulatedServer:
    """The simulated server: live requests (replaced as they finish, new ones joining
    when the batch grows), their acceptance draws and the policy's state across steps."""

    def __init__(
        self,
        cost: CostModel,
        config: FaserConfig,
        *,
        accept: Sequence[float],
        bad_accept: Sequence[float],
        bad_steps: int,
        k_max: int,
        prompt_tokens: tuple[int, int],
        output_tokens: int,
        eager_prefill: bool,
        seed: int,
        accept_spread: float = 0.0,
        piece_tokens: Optional[int] = None,
        max_verify_tokens: Optional[int] = None,
        fixed_length: Optional[int] = None,  # every request drafts this instead of the adaptive choice
        drafting_overhead: float = 0.0,  # seconds every drafting step takes beyond the cost model
        chained: bool = False,  # draft steps as one chain (draft_chain): every drafting row runs to m
        oracle: bool = False,  # the policy sees every request's true acceptance instead of estimating it
    ):
        self.cost, self.k_max, self.fixed_length = cost, k_max, fixed_length
        self.accept, self.bad_accept, self.bad_steps = accept, bad_accept, bad_steps
        self.prompt_tokens, self.output_tokens, self.eager_prefill = prompt_tokens, output_tokens, eager_prefill
        self.accept_spread, self.piece_tokens, self.max_verify_tokens = accept_spread, piece_tokens, max_verify_tokens
        self.rng = random.Random(seed)
        self.policy = AdaptiveDrafterPolicy(config, cost) if fixed_length is None else None  # None: fixed
        if oracle and self.policy is not None:
            self.policy.acceptance = TrueAcceptance(self)
        self.live: dict[str, list[int]] = {}  # rid -> [committed tokens, draft KV tokens, tokens left]
        self.offset: dict[str, float] = {}  # rid -> its shift of every acceptance probability
        self.next_id = 0
        self.steps = 0
        self.drafting_overhead = drafting_overhead
        self.chained = chained
        self.clock = 0.0  # simulated seconds: when the next step starts (step_calibration times it)

    def step(self, batch_size: int) -> StepOutcome:
        """One decode step of ``batch_size`` requests (new ones join to make it up)."""
        rng, live, policy = self.rng, self.live, self.policy
        while len(live) < batch_size:
            prompt = rng.randint(*self.prompt_tokens)
            live[f"r{self.next_id}"] = [prompt, prompt if self.eager_prefill else 0, self.output_tokens]
            self.offset[f"r{self.next_id}"] = rng.gauss(0.0, self.accept_spread) if self.accept_spread else 0.0
            self.next_id += 1
        rids = list(live)
        seq_lens = tuple(live[r][0] for r in rids)
        remaining = tuple(live[r][2] - 1 for r in rids)  # besides the bonus token
        context = StepContext(
            seq_lens, tuple(live[r][1] for r in rids), self.max_verify_tokens, self.piece_tokens, remaining,
            self.chained,
        )
        # Capped near max_new_tokens as the worker caps them (worker.cap_to_remaining).
        chosen = [self.fixed_length] * len(rids) if policy is None else policy.choose(rids, self.k_max, context)
        lengths = [min(k, cap) for k, cap in zip(chosen, draft_caps(remaining, self.k_max))]
        if policy is not None:
            policy.step_began(self.clock, lengths, context)
        probs, shift = self.acceptance()
        accepted = [_accepted(rng, k, probs, shift.get(r, 0.0)) for r, k in zip(rids, lengths)]
        if policy is not None:
            policy.observe(rids, lengths, accepted)
        outcome = StepOutcome(
            tokens=sum(accepted) + len(rids),
            seconds=self.cost.step_time(lengths, seq_lens, context.catchup_tokens(), self.piece_tokens, self.chained)
            + (self.drafting_overhead if any(lengths) else 0.0),
            plain_seconds=self.cost.no_draft_time(seq_lens),
            drafts=sum(lengths),
            requests=len(rids),
        )
        deepest = max(lengths, default=0)
        for rid, k, a in zip(rids, lengths, accepted):
            state = live[rid]
            if k:
                # Caught up and fed its drafts but the last: min(L + k, new committed length),
                # in a chain every drafting row's to the deepest (draft.py, FaserDraftState.draft_kv_lens).
                fed = deepest if self.chained and deepest > 1 else k
                state[1] = state[0] + min(fed, a + 1)
            state[0] += a + 1
            state[2] -= a + 1
            if state[2] <= 0:
                if policy is not None:
                    policy.forget(rid)
                del live[rid], self.offset[rid]
        self.steps += 1
        self.clock += outcome.seconds
        return outcome

    def acceptance(self) -> tuple[Sequence[float], dict[str, float]]:
        """This step's per-position acceptance and each request's shift of it (none
        during the bad start, which is the same for everyone)."""
        if self.steps < self.bad_steps:
            return self.bad_accept, {}
        return self.accept, self.offset


class TrueAcceptance:
    """``AcceptanceWindows`` in the shape the policy reads it, answering with every
    request's true acceptance (``--oracle``): what perfect estimates would choose."""

    def __init__(self, server: SimulatedServer) -> None:
        self.server = server

    def gains(self, rids: Sequence[str], k_max: int) -> np.ndarray:
        """[bs, k_max] g[i, j] = P(drafts 0..j of request i accepted)."""
        probs, shift = self.server.acceptance()
        alpha = np.array([[_alpha(probs, j, shift.get(r, 0.0)) for j in range(k_max)] for r in rids])
        return np.cumprod(alpha.reshape(len(rids), k_max), axis=1)

    def observe(self, rids: Sequence[str], draft_lens: Sequence[int], num_accepted: Sequence[int]) -> None:
        pass  # nothing to learn

    def forget(self, rid: str) -> None:
        pass


def simulate(cost: CostModel, config: FaserConfig, batch_size: int, *, steps: int, **server) -> SimResult:
    """``steps`` steps at a constant ``batch_size`` (``server``: SimulatedServer's keywords)."""
    sim = SimulatedServer(cost, config, **server)
    drafting, late, tokens, seconds, plain_seconds = 0, 0, 0, 0.0, 0.0
    for step in range(steps):
        out = sim.step(batch_size)
        tokens += out.tokens
        seconds += out.seconds
        plain_seconds += out.plain_seconds
        drafting += out.drafts > 0
        late += out.drafts if step >= steps * 3 // 4 else 0
    return SimResult(
        batch_size=batch_size,
        drafting_steps=drafting / steps,
        late_drafts=late / (steps - steps * 3 // 4),
        speedup=(tokens / seconds) / (steps * batch_size / plain_seconds),
    )


@dataclass(frozen=True)
class Segment:
    steps: int
    drafts: int  # sum of k_i over the segment
    speedup: float  # modelled tokens/s over the segment / plain decoding's of the same batches


def simulate_ramp(
    cost: CostModel, config: FaserConfig, *, start: int, end: int, grow: int, warm_steps: int, hold_steps: int,
    **server,
) -> dict[str, Segment]:  # fmt: skip
    """A burst: ``warm_steps`` at ``start`` requests, then ``grow`` more every step up
    to ``end``, then ``hold_steps`` at ``end``. Returns the "ramp" and "hold" segments
    (plain decoding's time is that of the same batches, so a segment's speed-up says
    what the chosen lengths cost or gained against not drafting there)."""
    sim = SimulatedServer(cost, config, **server)
    for _ in range(warm_steps):
        sim.step(start)
    schedule = {"ramp": range(start + grow, end + grow, grow), "hold": [end] * hold_steps}
    out = {}
    for name, sizes in schedule.items():
        steps = [sim.step(min(bs, end)) for bs in sizes]
        tokens, seconds = sum(s.tokens for s in steps), sum(s.seconds for s in steps)
        plain = sum(s.requests for s in steps) / sum(s.plain_seconds for s in steps)
        out[name] = Segment(len(steps), sum(s.drafts for s in steps), (tokens / seconds) / plain)
    return out


def _accepted(rng: random.Random, k: int, probs: Sequence[float], offset: float = 0.0) -> int:
    """Accepted prefix of k drafts: draft j survives with probs[min(j, last)] + offset,
    kept within [0, 1]."""
    for j in range(k):
        if rng.random() >= _alpha(probs, j, offset):
            return j
    return k


def _alpha(probs: Sequence[float], j: int, offset: float) -> float:
    """P(draft j accepted | drafts before it accepted): probs[min(j, last)] + offset, within [0, 1]."""
    return min(max(probs[min(j, len(probs) - 1)] + offset, 0.0), 1.0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--costs", type=Path, required=True, help="cost file from scripts/profile_costs.py")
    p.add_argument("--key", type=int, default=0, help="which entry of the cost file (default: the first)")
    p.add_argument("--accept", type=float, nargs="+", default=[0.61, 0.54, 0.64, 0.55])
    p.add_argument("--accept-spread", type=float, default=0.0, help="sd of each request's acceptance shift")
    p.add_argument("--bad-accept", type=float, nargs="+", default=[0.3])
    p.add_argument("--bad-steps", type=int, default=0)
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 4, 16, 64])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--k-max", type=int, default=7)
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=[100, 400], metavar=("MIN", "MAX"))
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--eager-prefill", action="store_true")
    p.add_argument("--catchup-horizon", type=int, default=FaserConfig.catchup_horizon)
    p.add_argument("--catchup-piece-tokens", type=int, default=128, help="0: a catch-up is one forward")
    p.add_argument("--max-verify-tokens", type=int, default=128, help="0: no cap")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fixed-lengths", type=int, nargs="*", default=[1, 3, 5], help="fixed lengths to compare against")
    p.add_argument("--ramp", type=int, nargs=3, default=None, metavar=("START", "END", "GROW"),
                   help="also a burst: START requests, then GROW more per step up to END")
    p.add_argument("--ramp-warm-steps", type=int, default=600, help="steps at START before the burst")
    p.add_argument("--ramp-hold-steps", type=int, default=100, help="steps at END after it")
    p.add_argument(
        "--drafting-overhead-ms", type=float, default=0.0,
        help="every drafting step takes this much longer than the cost model predicts (adaptive and fixed runs)",
    )  # fmt: skip
    p.add_argument("--step-calibration", action="store_true", help="the policy prices that overhead as it measures it")
    p.add_argument(
        "--chained", action="store_true",
        help="draft steps run as one chain (draft_chain): every drafting row runs to the longest",
    )  # fmt: skip
    p.add_argument(
        "--oracle", action="store_true",
        help="the policy sees each request's true acceptance: what perfect acceptance estimates would reach",
    )  # fmt: skip
    args = p.parse_args(argv)

    entries = list(read_cost_entries(args.costs)[0].items())
    key, cost = entries[args.key]
    config = FaserConfig(
        policy="adaptive", catchup_horizon=args.catchup_horizon, step_calibration=args.step_calibration
    )
    print(f"cost model: {key}")
    fixed = [k for k in args.fixed_lengths if k > 0]
    if any(k > args.k_max for k in fixed):
        p.error(f"--fixed-lengths {fixed} must be at most --k-max {args.k_max}")
    server = dict(
        accept=args.accept, bad_accept=args.bad_accept, bad_steps=args.bad_steps, k_max=args.k_max,
        prompt_tokens=tuple(args.prompt_tokens), output_tokens=args.output_tokens, eager_prefill=args.eager_prefill,
        seed=args.seed, accept_spread=args.accept_spread, piece_tokens=args.catchup_piece_tokens or None,
        max_verify_tokens=args.max_verify_tokens or None, drafting_overhead=args.drafting_overhead_ms / 1e3,
        chained=args.chained, oracle=args.oracle,
    )  # fmt: skip
    if args.batch_sizes:
        print(
            "| batch size | steps with drafts | drafts per step (last quarter) | modelled speed-up vs plain"
            + (" | best fixed length (speed-up vs plain) | adaptive vs best fixed |" if fixed else " |")
        )
        print("|---|---|---|---|" + ("---|---|" if fixed else ""))
    for bs in tqdm(args.batch_sizes, desc="simulating", unit="batch size", leave=False):
        run = partial(simulate, cost, config, bs, steps=args.steps, **server)
        r = run()
        row = f"| {r.batch_size} | {r.drafting_steps:.1%} | {r.late_drafts:.2f} | {r.speedup:.3f}x |"
        if fixed:
            k, best = max(((k, run(fixed_length=k).speedup) for k in fixed), key=lambda kb: kb[1])
            row += f" k{k} ({best:.3f}x) | {r.speedup / best:.3f}x |"
        print(row)
    if args.ramp is not None:
        start, end, grow = args.ramp
        if not (1 <= start < end and grow >= 1):
            p.error(f"--ramp {start} {end} {grow}: needs 1 <= START < END and GROW >= 1")
        ramp = partial(
            simulate_ramp, cost, config, start=start, end=end, grow=grow, warm_steps=args.ramp_warm_steps,
            hold_steps=args.ramp_hold_steps, **server,
        )  # fmt: skip
        adaptive = ramp()
        others = {k: ramp(fixed_length=k) for k in tqdm(fixed, desc="fixed lengths", leave=False)}
        print(f"\nburst: {start} -> {end} requests, {grow} more per step")
        print(
            "| segment | steps | drafts | modelled speed-up vs plain"
            + (" | best fixed length (speed-up vs plain) | adaptive vs best fixed |" if fixed else " |")
        )
        print("|---|---|---|---|" + ("---|---|" if fixed else ""))
        for name, seg in adaptive.items():
            row = f"| {name} | {seg.steps} | {seg.drafts} | {seg.speedup:.3f}x |"
            if fixed:
                k, best = max(((k, o[name].speedup) for k, o in others.items()), key=lambda kb: kb[1])
                row += f" k{k} ({best:.3f}x) | {seg.speedup / best:.3f}x |"
            print(row)

if __name__ == "__main__":
    main()
