"""How long a server's scheduler takes between prefill batches, from its log.

    python scripts/prefill_gaps.py server.log [server.log ...]

SGLang logs a prefill batch when it has processed the batch's result (its first
tokens), with ``#new-token`` and ``input throughput`` = new tokens / seconds since the
previous prefill's log line; their ratio is that interval. Between two prefills with
nothing in between it is one scheduler iteration: on the overlap schedule the host's
work for the next batch plus its wait for this one's forward. Prints, per log, the
interval's percentiles (markdown); the low percentiles are the back-to-back prefills.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

LINE = re.compile(r"Prefill batch.*#new-token: (\d+).*input throughput \(token/s\): ([\d.]+)")


def intervals_ms(text: str) -> list[float]:
    """Milliseconds from each prefill's log line to the previous one's (first line left out)."""
    out = []
    for new_tokens, throughput in LINE.findall(text):
        if float(throughput) > 0:
            out.append(1e3 * int(new_tokens) / float(throughput))
    return out[1:]


def table(logs: list[Path]) -> str:
    rows = ["| log | prefills | p5 ms | p10 ms | p25 ms | p50 ms |", "|---|---|---|---|---|---|"]
    for log in logs:
        ms = intervals_ms(log.read_text(errors="replace"))
        if len(ms) < 20:
            rows.append(f"| {log.name} | {len(ms)} | - | - | - | - |")
            continue
        q = statistics.quantiles(ms, n=20)
        rows.append(f"| {log.name} | {len(ms)} | {q[0]:.1f} | {q[1]:.1f} | {q[4]:.1f} | {statistics.median(ms):.1f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table([Path(a) for a in sys.argv[1:]]))
