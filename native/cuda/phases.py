"""Where a prefill's compute time goes: CUDA events around each phase of each layer on the compute
stream, read once the prompt is done (`fermium bench prefill --phases`).

`LayerRunner` wraps what it enqueues as `with clock("deltanet scan"):`, adds the FLOPs of the GEMMs
inside (`clock.flops(n)`), and times host-side work as `with clock.host("tile build"):`. The default
`NULL_CLOCK` creates no event and syncs nothing. Phases do not nest, so on the one stream they run
one after another: a prompt's span (the first phase's start to the last phase's end) is the phases'
time plus the gaps between one phase's end and the next one's start, where the stream sat idle
because the host had not yet enqueued more. A phase's own time includes the launch gaps inside it;
"copy wait" is the stream waiting on a streamed chunk's copy event.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

IDLE = "stream idle, waiting on the host"
_NOTHING = nullcontext()


class NullClock:
    """Phases off: every call is a no-op."""

    def __call__(self, name: str, flops: float = 0.0):
        return _NOTHING

    def host(self, name: str):
        return _NOTHING

    def flops(self, n: float) -> None:
        pass

    def take(self) -> None:
        return None


NULL_CLOCK = NullClock()


class PhaseClock:
    def __init__(self, cuda, stream):
        self.cuda, self.s = cuda, stream
        self.spans: list = []                 # [name, start event, end event, flops], in stream order
        self.hosts: dict = {}                 # name -> [seconds, calls]
        self.open = None

    @contextmanager
    def __call__(self, name: str, flops: float = 0.0):
        start = self.cuda.Event()
        start.record(self.s)
        self.open = span = [name, start, None, float(flops)]
        try:
            yield
        finally:
            span[2] = self.cuda.Event()
            span[2].record(self.s)
            self.spans.append(span)
            self.open = None

    @contextmanager
    def host(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            acc = self.hosts.setdefault(name, [0.0, 0])
            acc[0] += time.perf_counter() - t0
            acc[1] += 1

    def flops(self, n: float) -> None:
        if self.open is not None:
            self.open[3] += n

    def take(self) -> dict | None:
        """The phases since the last take, once the stream has finished them (a report, see `report`)."""
        spans, hosts = self.spans, self.hosts
        self.spans, self.hosts = [], {}
        if not spans:
            return None
        rows: dict = {}
        for name, start, end, flops in spans:
            row = rows.setdefault(name, {"name": name, "where": "stream", "seconds": 0.0, "calls": 0, "flops": 0.0})
            row["seconds"] += end.time_since(start) / 1e3
            row["calls"] += 1
            row["flops"] += flops
        idle = sum(b[1].time_since(a[2]) for a, b in zip(spans, spans[1:])) / 1e3
        rows[IDLE] = {"name": IDLE, "where": "gap", "seconds": idle, "calls": len(spans) - 1, "flops": 0.0}
        for name, (seconds, calls) in hosts.items():
            rows["host " + name] = {"name": name, "where": "host", "seconds": seconds, "calls": calls, "flops": 0.0}
        return report(spans[-1][2].time_since(spans[0][1]) / 1e3, list(rows.values()))


def report(span_s: float, rows: list[dict]) -> dict:
    """{"span_s", "phases": rows with share of the span and TFLOP/s (None where no FLOPs are counted)}.
    The stream rows and the gap row add up to the span; host rows overlap it."""
    for row in rows:
        row["share"] = row["seconds"] / span_s if span_s > 0 else 0.0
        row["tflops"] = row["flops"] / row["seconds"] / 1e12 if row["flops"] and row["seconds"] > 0 else None
    return {"span_s": span_s, "phases": rows}


def phase_lines(phases: dict, indent: str = "  ") -> list[str]:
    """The report as a table: stream phases in the order they first ran, the idle gaps, host work."""
    lines = [f"{indent}phases over a compute span of {phases['span_s']:.3f} s (stream rows and the idle row "
             f"sum to it; host rows run beside it):",
             f"{indent}  {'phase':38s} {'seconds':>9s} {'share':>7s} {'calls':>6s} {'TFLOP/s':>8s}"]
    for row in phases["phases"]:
        name = row["name"] if row["where"] != "host" else f"(host) {row['name']}"
        rate = f"{row['tflops']:8.2f}" if row["tflops"] is not None else ""
        lines.append(f"{indent}  {name:38s} {row['seconds']:9.4f} {100 * row['share']:6.1f}% {row['calls']:6d} "
                     f"{rate}".rstrip())
    covered = sum(r["share"] for r in phases["phases"] if r["where"] != "host")
    lines.append(f"{indent}  {'stream phases + idle':38s} {'':9s} {100 * covered:6.1f}%")
    return lines
