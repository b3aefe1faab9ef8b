"""Where a scheduler process spends its main loop's time, from py-spy raw stacks.

    python scripts/spy_summary.py spy-<pid>.txt[.gz] [...] [--exclude SUBSTRING ...] [--within SUBSTRING]...

(with spy-<pid>.cmd beside each).
Reads py-spy's ``--format raw`` output (one line per distinct stack, ``frame;frame;...
count``, outermost frame first; recorded with ``--idle``, so a host waiting for the GPU
is counted where it waits) and keeps the stacks under SGLang's event loop: the
scheduler's main thread, not its helper threads. Prints, per file, the functions'
inclusive and self shares of those samples (markdown), the contender named from the
server command line in the ``.cmd`` file beside it. ``--exclude`` drops the stacks
with a frame that contains any of the given strings (e.g. ``_do_compile JitSpec.build``:
a fresh machine's first kernel compiles, which run inside the loop). ``--within`` keeps
only the stacks with a frame that contains each string given (one per ``--within``),
from the first frame that contains the last of them inward, and shares out their
samples: where a function's time goes (``--within _prefill --within
forward_batch_generation``: a FASER server's target prefill; ``--within _execute_extend``:
any server's eager EXTEND forwards).
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter
from pathlib import Path

from faser_sglang.sched_timeline import server_label

LOOP = "event_loop"  # Scheduler.event_loop_overlap / Scheduler.event_loop_normal
FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:)]+)(?::\d+)?\)$")


def function_name(frame: str) -> str:
    """``run_batch (/x/sglang/srt/managers/scheduler.py:3563)`` -> ``run_batch (scheduler.py)``."""
    m = FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    return f"{m['func']} ({Path(m['file']).name})"


def loop_stacks(
    text: str, exclude: tuple[str, ...] = (), within: tuple[str, ...] = ()
) -> list[tuple[list[str], int]]:
    """The stacks under the event loop, each from the loop's frame inward (or, with
    ``within``, from the first frame that contains its last string, in the stacks that
    have a frame with each), with its count."""
    out = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or any(x in stack for x in exclude):
            continue
        frames = [function_name(f) for f in stack.split(";")]
        start = next((i for i, f in enumerate(frames) if f.split(" ")[0].rsplit(".", 1)[-1].startswith(LOOP)), None)
        if start is None or not all(any(w in f for f in frames) for w in within):
            continue
        if within:
            start = next(i for i, f in enumerate(frames) if within[-1] in f)
        out.append((frames[start:], int(count)))
    return out


def shares(stacks: list[tuple[list[str], int]]) -> tuple[int, Counter, Counter]:
    """(total samples, inclusive samples per function, self samples per function)."""
    total, inclusive, own = 0, Counter(), Counter()
    for frames, count in stacks:
        total += count
        for name in set(frames):
            inclusive[name] += count
        own[frames[-1]] += count
    return total, inclusive, own


def contender(cmd: str) -> str:
    algorithm = re.search(r"--speculative-algorithm (\S+)", cmd)
    steps = re.search(r"--speculative-num-steps (\d+)", cmd)
    return server_label(algorithm and algorithm[1], steps and int(steps[1]))


def report(path: Path, exclude: tuple[str, ...] = (), within: tuple[str, ...] = (), top: int = 25) -> str:
    cmd_file = path.parent / (path.name.removesuffix(".gz").removesuffix(".txt") + ".cmd")
    name = contender(cmd_file.read_text()) if cmd_file.exists() else "?"
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        total, inclusive, own = shares(loop_stacks(f.read(), exclude, within))
    where = f" within {' > '.join(within)}" if within else ""
    lines = [f"### {path.name}: {name}, {total} event-loop samples{where}", ""]
    if not total:
        return "\n".join(lines)
    lines += ["| function | inclusive % | self % |", "|---|---|---|"]
    for func, n in inclusive.most_common(top):
        lines.append(f"| {func} | {100 * n / total:.1f} | {100 * own[func] / total:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--exclude", nargs="*", default=[])
    parser.add_argument("--within", action="append", default=[])
    args = parser.parse_args()
    print("\n\n".join(report(p, tuple(args.exclude), tuple(args.within)) for p in args.files))
