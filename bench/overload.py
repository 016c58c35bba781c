"""Overload: 4× capacity of full RAG for 60 s, with admission control on and then off.

    .venv/bin/python -m bench.overload [--duration 60] [--factor 4] [--redis-url URL]

One run on this machine (its own Redis database, flushed at start; ~10-12 minutes):

1. Start a retrieval worker, a generation worker (vLLM on the CPU, bf16, torch.compile as in
   production: about twice eager's throughput, so twice the requests and rejections that the
   percentiles are taken over; ``--eager`` starts in ~30 s instead of 1-2 min) and the API, with
   API keys on. The corpus is pydoc's language topics (ingested once into ``--home``).
2. Unloaded: full-RAG requests one at a time → unloaded P50/P99. The SLO is 2× the unloaded P99.
3. Capacity: the highest constant rate of full-RAG requests whose P99 stays within the SLO
   (admission control off; a ladder of rates ×1.4, 15 s each, unique queries, no cache hits).
4. On: ``--factor`` × capacity for ``--duration`` s from 4 keys (one sends 40%, its key is
   rate-limited to 1.25× capacity; the others 20% each), every request with a deadline of 1.5×
   the unloaded P99; half of them allow a degraded (retrieval-only) answer, half do not.
5. Off: the same load with admission control, rate limits and per-key caps off.

The load generator is open-loop (``bench/openloop.py``): requests leave on schedule, whatever
the server does. On 2 shared cores the processes get the CPU in the order they would get
machines: the API and Redis (the front door) first, the retrieval worker at nice 5 with one
encoder thread, the generation worker at nice 10 with its engine bound to the other core. The
load generator itself runs at nice -5 where it may (root), so that its own scheduling delays are
not counted as the server's latency.

Prints a table, writes ``<out>/overload_latency.png`` (latency over time, both runs), and ends
with one JSON line for the run with admission control on. ``predict_err`` is how far admission's
predicted wait (``timings.predicted_wait_ms`` of each full answer) was from the latency the
client saw, relative to it, as P50 / P90 over the full answers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.queues import GENERATION_QUEUE, QUEUES, RETRIEVAL_QUEUE
from ragline.broker.limits.backpressure import priority_lists
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys, indexes
from ragline.workers.generation.model_prep import prepare_default_model

from bench.env import settings_env, share_models
from bench.openloop import Sample, open_loop, percentile, sequential
from ragline import processes

INDEX = "overload"
SHARES = [0.4, 0.2, 0.2, 0.2]  # key 0 is the greedy client


@dataclass
class Stack:
    settings: Settings
    logs: Path
    supervisor: processes.Supervisor = field(default_factory=processes.Supervisor)

    def start(self, name: str, cmd: list[str], env: dict[str, str], *, nice: int = 0) -> None:
        """Start a child at this absolute nice value (whatever the load generator's own)."""
        log = (self.logs / f"{name}.log").open("ab")
        self.supervisor.start(name, cmd, env, stdout=log, nice=nice)

    def stop(self, name: str) -> None:
        self.supervisor.stop(name)

    def stop_all(self) -> None:
        self.supervisor.stop()

    def check(self) -> None:
        child = self.supervisor.exited()
        if child is not None:
            tail = (self.logs / f"{child.name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{child.name} exited ({child.proc.returncode}):\n{tail}")

    def start_workers(self, nice_generation: int) -> None:
        s = self.settings
        nice_retrieval = max(0, nice_generation // 2)
        self.start(
            "retrieval", processes.worker_command("retrieval", s), settings_env(s), nice=nice_retrieval
        )
        env = processes.child_env(s, kind="generation") | settings_env(s)
        self.start("generation", processes.worker_command("generation", s), env, nice=nice_generation)

    def start_api(self, *, admission: bool) -> str:
        s = self.settings
        port = processes.free_port()
        # Off: nothing refuses, the per-key caps on waiting requests included.
        caps = {} if admission else {"key_max_requests": 0, "key_max_streams": 0}
        env = settings_env(
            s.replace(api_port=port, admission_enabled=admission, rate_limit_enabled=admission, **caps)
        )
        self.start("api", processes.api_command(s.replace(api_port=port).api), env)
        base = f"http://127.0.0.1:{port}"
        self.wait_ready(base)
        return base

    def wait_ready(self, base: str, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError("ragline was not ready in time")


def ensure_index(settings: Settings, index: str = INDEX) -> None:
    """pydoc's topics, ingested once into the bench's home as ``index``; re-registered if Redis
    lost them."""
    from ragline.broker.redis.pool import sync_client
    from ragline.workers.retrieval import index_store
    from ragline.workers.retrieval.ingest import ingest

    from ragline.demo import write_demo_corpus

    client, keys = sync_client(settings.redis), Keys(settings.redis.key_prefix)
    for info in index_store.current_on_disk(settings.indexes_dir):
        indexes.register(client, keys, info)
    if indexes.lookup(client, keys, index) is None:
        with tempfile.TemporaryDirectory() as tmp:
            n = write_demo_corpus(Path(tmp))
            print(f"ingesting {n} pydoc topics (once)", flush=True)
            ingest(settings, [Path(tmp)], index_name=index, progress=False)


def questions() -> list[str]:
    from pydoc_data.topics import topics

    names = sorted(topics)
    forms = ("What does {} do in Python?", "Explain {} briefly.", "How is {} used?")
    return [form.format(name.replace("-", " ")) for name in names for form in forms]


class Bodies:
    """Unique full-RAG queries (no result-cache or embedding-cache hits), half of them strict."""

    def __init__(self, tag: str) -> None:
        self._questions = questions()
        self._tag = tag

    def __call__(self, i: int) -> dict[str, Any]:
        q = self._questions[i % len(self._questions)]
        return {"query": f"{q} [{self._tag}{i}]", "index": INDEX, "top_k": 3, "allow_degraded": i % 2 == 0}


def drained(settings: Settings, timeout_s: float = 120) -> None:
    """Wait until both queues are empty and nothing is held unacknowledged."""
    client = redis.Redis.from_url(settings.redis.redis_url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = sum(client.llen(k) for q in QUEUES for k in priority_lists(q))
        if waiting == 0 and client.hlen("unacked") == 0:
            return
        time.sleep(0.5)
    print("  (queues not drained in time; going on)", flush=True)


def prediction_errors(samples: list[Sample]) -> list[float]:
    """|predicted wait - latency| / latency of each full answer that reports a prediction."""
    return [
        abs(s.predicted_wait - s.latency) / s.latency
        for s in samples
        if s.outcome == "full" and math.isfinite(s.predicted_wait) and s.latency > 0
    ]


def done_counts(settings: Settings) -> dict[str, int]:
    """Requests each queue's workers have completed: the sum over the concurrency buckets of
    their completion counters (``b{n}_requests``, broker/limits/backpressure.py)."""
    client = redis.Redis.from_url(settings.redis.redis_url, decode_responses=True)
    keys = Keys(settings.redis.key_prefix)
    counts: dict[str, int] = {}
    for queue in (RETRIEVAL_QUEUE, GENERATION_QUEUE):
        fields = client.hgetall(keys.done(queue))
        counts[queue] = sum(int(float(v)) for k, v in fields.items() if str(k).endswith("_requests"))
    return counts


@dataclass
class RunStats:
    name: str
    offered: float
    samples: list[Sample]
    slo_s: float

    def count(self, *outcomes: str) -> int:
        return sum(1 for s in self.samples if s.outcome in outcomes)

    def latencies(self, *outcomes: str) -> list[float]:
        return [s.latency for s in self.samples if s.outcome in outcomes]

    @property
    def accepted(self) -> int:
        """Everything the server did not refuse at the door: it owes each an answer."""
        return sum(1 for s in self.samples if s.outcome not in ("429", "503"))

    @property
    def completed(self) -> int:
        return self.count("full", "degraded")

    @property
    def server_errors(self) -> int:
        """5xx other than 503, and transport errors (no answer at all)."""
        return self.count("other_5xx", "transport_error")

    def predict_err(self, q: float) -> float:
        """The q-th percentile of the full answers' relative prediction errors (nan: none predicted)."""
        return percentile(prediction_errors(self.samples), q)

    def goodput(self, duration_s: float) -> float:
        """Full answers within the SLO, per second of offered load."""
        return sum(1 for s in self.samples if s.outcome == "full" and s.latency <= self.slo_s) / duration_s

    def row(self, duration_s: float) -> str:
        acc = self.latencies("full", "degraded")
        full = self.latencies("full")
        rej = self.latencies("429", "503")
        ms = lambda v: "-" if math.isnan(v) else f"{v * 1000:.0f}"  # noqa: E731
        rej_p99 = percentile(rej, 99)
        err = " / ".join("-" if math.isnan(v) else f"{v:.2f}" for v in map(self.predict_err, (50, 90)))
        return (
            f"| {self.name} | {self.offered:.2f} | {len(self.samples)} | {self.count('full')} | "
            f"{self.count('degraded')} | {self.count('429')} | {self.count('503')} | "
            f"{self.count('timeout')} | "
            f"{self.server_errors} | {self.accepted} | {self.completed} | "
            f"{ms(percentile(acc, 50))} / {ms(percentile(acc, 99))} | {ms(percentile(full, 99))} | "
            f"{'-' if math.isnan(rej_p99) else f'{rej_p99 * 1000:.1f}'} | {self.goodput(duration_s):.2f} | "
            f"{err} |"
        )


HEADER = (
    "| run | offered/s | sent | full 200 | degraded 200 | 429 | 503 | timeouts | other 5xx | accepted | "
    "completed | accepted P50 / P99 ms | full P99 ms | reject P99 ms | goodput/s (full within SLO) | "
    "predict err P50 / P90 |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def find_capacity(
    url: str,
    headers: dict[str, str],
    bodies: Callable[[int], dict[str, Any]],  # a Bodies, or any body by request number
    settings: Settings,
    *,
    start: float,
    slo_s: float,
    step_s: float,
) -> tuple[float, list[tuple[float, float, int]]]:
    """The highest rate whose P99 meets the SLO: ×1.4 until one fails (×0.7 while the first ones do)."""
    ladder: list[tuple[float, float, int]] = []
    rate, best, offset = start, 0.0, 0
    for _ in range(7):
        samples = open_loop(
            url,
            rate=rate,
            duration_s=step_s,
            body=lambda i, o=offset: bodies(o + i),  # type: ignore[misc]  # o: the step's offset, bound now
            headers=[headers],
            timeout_s=60,
        )
        offset += len(samples)
        good = [s.latency for s in samples if s.outcome == "full"]
        bad = len(samples) - len(good)
        p99 = percentile(good, 99) if not bad else math.inf
        ladder.append((rate, p99, bad))
        print(f"  capacity: {rate:.2f}/s -> P99 {p99 * 1000:.0f} ms, {bad} not answered", flush=True)
        drained(settings)
        if p99 <= slo_s:
            best = rate
            rate *= 1.4
        elif best:
            break
        else:
            rate *= 0.7
    return best, ladder


def plot(runs: list[RunStats], unloaded_p99: float, slo_s: float, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {
        "full": ("tab:blue", "o", "full answer"),
        "degraded": ("tab:green", "o", "degraded (sources only)"),
        "429": ("tab:orange", "^", "429 rate limited"),
        "503": ("tab:red", "v", "503 overloaded"),
        "timeout": ("black", "x", "client timeout"),
        "other_5xx": ("purple", "s", "other 5xx"),
        "transport_error": ("purple", "s", "transport error"),
    }
    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 4.5), sharey=True)
    for ax, run in zip(axes, runs, strict=True):
        for outcome, (color, marker, label) in styles.items():
            pts = [(s.sent, max(s.latency, 1e-4)) for s in run.samples if s.outcome == outcome]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, s=8, c=color, marker=marker, label=f"{label} ({len(pts)})", alpha=0.7)
        ax.axhline(unloaded_p99, color="gray", linestyle=":", label="unloaded P99")
        ax.axhline(slo_s, color="gray", linestyle="--", label="SLO (2× unloaded P99)")
        ax.set(yscale="log", xlabel="send time (s)", title=f"{run.name}: {run.offered:.1f} req/s offered")
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("latency (s)")
    fig.tight_layout()
    path = out / "overload_latency.png"
    fig.savefig(path, dpi=100)
    return path


def main() -> int:
    processes.interrupt_on_signals()  # so the finally clause stops every child
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, -5)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of overload per run")
    parser.add_argument("--factor", type=float, default=4.0, help="offered load, × capacity")
    parser.add_argument("--step", type=float, default=15.0, help="seconds per capacity step")
    parser.add_argument("--unloaded", type=int, default=15, help="sequential requests for the unloaded P99")
    parser.add_argument("--deadline-factor", type=float, default=1.5, help="deadline, × unloaded P99")
    parser.add_argument("--nice-generation", type=int, default=10)
    parser.add_argument(
        "--engine-cores",
        default="1" if (os.cpu_count() or 1) <= 2 else "0-1",
        help="cores the engine's OpenMP threads are bound to (on 2 cores: leave one to the door)",
    )
    parser.add_argument("--eager", action="store_true", help="no torch.compile (faster start, half the rate)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--home", type=Path, default=Path.home() / ".cache" / "ragline-overload")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/6", help="a database of its own")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    share_models(args.home)
    settings = Settings().replace(
        home=args.home,
        redis_url=args.redis_url,
        default_index=INDEX,
        dtype="bfloat16",
        enforce_eager=args.eager,
        cpu_omp_threads_bind=args.engine_cores,
        torch_threads=1,  # the retrieval worker's encoder: it shares a core with the door
        max_new_tokens=args.max_new_tokens,
        auth_enabled=True,
    )
    redis.Redis.from_url(args.redis_url).flushdb()
    ensure_index(settings)
    prepare_default_model(settings)  # once, into the shared models folder
    client, keys = redis.Redis.from_url(args.redis_url), Keys(settings.redis.key_prefix)
    probe_key, _ = apikeys.create(client, keys, "bench-probe", rate=1e6, burst=1_000_000)
    probe = {"Authorization": f"Bearer {probe_key}"}

    logs = Path(tempfile.mkdtemp(prefix="ragline-overload-"))
    stack = Stack(settings, logs)
    started = time.monotonic()
    try:
        print(
            f"starting workers (vLLM {'eager' if args.eager else 'compiled'}, bf16); logs in {logs}",
            flush=True,
        )
        stack.start_workers(args.nice_generation)
        url = stack.start_api(admission=False) + "/v1/query"
        print(f"ready after {time.monotonic() - started:.0f} s", flush=True)

        sequential(url, n=3, body=Bodies("warm"), headers=probe)  # first requests pay for warm-up
        unloaded = sequential(url, n=args.unloaded, body=Bodies("unloaded"), headers=probe)
        assert all(s.outcome == "full" for s in unloaded), [s.status for s in unloaded]
        lat = [s.latency for s in unloaded]
        unloaded_p50, unloaded_p99 = percentile(lat, 50), percentile(lat, 99)
        slo_s = 2 * unloaded_p99
        print(
            f"unloaded: P50 {unloaded_p50 * 1000:.0f} ms, P99 {unloaded_p99 * 1000:.0f} ms; "
            f"SLO {slo_s * 1000:.0f} ms"
        )

        capacity, ladder = find_capacity(
            url, probe, Bodies("cap"), settings, start=1.5 / unloaded_p50, slo_s=slo_s, step_s=args.step
        )
        if not capacity:
            raise SystemExit("no rate met the SLO; capacity not found")
        offered = args.factor * capacity
        deadline_ms = round(args.deadline_factor * unloaded_p99 * 1000)
        print(f"capacity {capacity:.2f}/s; offering {offered:.2f}/s for {args.duration:.0f} s", flush=True)

        key_rate = 1.25 * capacity
        client_keys = [
            apikeys.create(client, keys, f"client-{k}", rate=key_rate, burst=max(3, round(2 * capacity)))[0]
            for k in range(len(SHARES))
        ]
        headers = [
            {"Authorization": f"Bearer {k}", "X-Request-Deadline-Ms": str(deadline_ms)} for k in client_keys
        ]
        timeout_s = max(30.0, 10 * unloaded_p99)
        runs: list[RunStats] = []
        server: dict[str, dict[str, int]] = {}
        for name, admission in (("admission on", True), ("admission off", False)):
            stack.stop("api")
            url = stack.start_api(admission=admission) + "/v1/query"
            before = done_counts(settings)
            samples = open_loop(
                url,
                rate=offered,
                duration_s=args.duration,
                body=Bodies("on" if admission else "off"),
                headers=headers,
                shares=SHARES,
                timeout_s=timeout_s,
            )
            run = RunStats(name, offered, samples, slo_s)
            runs.append(run)
            print(f"  {name}: {run.row(args.duration)}", flush=True)
            if admission:
                drained(settings)
                after = done_counts(settings)
                server[name] = {q: after[q] - before[q] for q in after}
    finally:
        stack.stop_all()

    return report(runs, ladder, capacity, unloaded_p50, unloaded_p99, slo_s, deadline_ms, server, args)


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def report(
    runs: list[RunStats],
    ladder: list[tuple[float, float, int]],
    capacity: float,
    unloaded_p50: float,
    unloaded_p99: float,
    slo_s: float,
    deadline_ms: int,
    server: dict[str, dict[str, int]],
    args: argparse.Namespace,
) -> int:
    print(
        f"\nunloaded full RAG (one at a time, n={args.unloaded}): P50 {unloaded_p50 * 1000:.0f} ms, "
        f"P99 {unloaded_p99 * 1000:.0f} ms; SLO = 2× unloaded P99 = {slo_s * 1000:.0f} ms"
    )
    print(
        "capacity ladder: "
        + ", ".join(
            f"{r:.2f}/s P99 {'-' if math.isinf(p) else f'{p * 1000:.0f} ms'}"
            + (f" ({b} unanswered)" if b else "")
            for r, p, b in ladder
        )
    )
    print(
        f"capacity: {capacity:.2f} full-RAG req/s; offered {args.factor:g}× = {args.factor * capacity:.2f}/s "
        f"for {args.duration:.0f} s from {len(SHARES)} keys (shares {SHARES}); deadline {deadline_ms} ms; "
        "half the requests allow a degraded answer\n"
    )
    print(HEADER)
    for run in runs:
        print(run.row(args.duration))
    on = runs[0]
    lag = max((s.lag for r in runs for s in r.samples), default=0.0)
    print(f"\nload generator: max send lag {lag * 1000:.0f} ms behind schedule")
    counts = server.get("admission on", {})
    full_on = on.count("full")
    print(
        f"server side, admission on: {counts.get(RETRIEVAL_QUEUE, 0)} retrievals completed for "
        f"{on.accepted} accepted; {counts.get(GENERATION_QUEUE, 0)} generations for {full_on} full answers"
    )
    rej = sorted((s for s in on.samples if s.outcome in ("429", "503")), key=lambda s: s.latency)
    if rej:
        rej_p50 = percentile([s.latency for s in rej], 50)
        print(
            f"rejections, admission on: {len(rej)}; P50 {rej_p50 * 1000:.1f} ms, "
            "slowest: "
            + ", ".join(f"{s.latency * 1000:.1f} ms ({s.status} at {s.sent:.1f} s)" for s in rej[-5:][::-1])
        )
    args.out.mkdir(parents=True, exist_ok=True)
    samples = {run.name: [dataclasses.asdict(s) for s in run.samples] for run in runs}
    (args.out / "overload_samples.json").write_text(json.dumps(samples))
    print(f"plot: {plot(runs, unloaded_p99, slo_s, args.out)}")
    accepted = on.latencies("full", "degraded")
    result = {
        "accepted_p99_over_unloaded": round(percentile(accepted, 99) / unloaded_p99, 3),
        "reject_p99_ms": round(percentile(on.latencies("429", "503"), 99) * 1000, 2),
        "accepted": on.accepted,
        "completed": on.completed,
        "timeouts": on.count("timeout"),
        "server_errors": on.server_errors,
        "predict_err_p50": _rounded(on.predict_err(50)),
        "predict_err_p90": _rounded(on.predict_err(90)),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
