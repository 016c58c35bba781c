"""Load generation with wrk (C, one thread: it must not take the CPU the servers need).

Each request's body comes from a Lua script, so every request can carry a distinct query
(cold cache) or cycle through a fixed set (warm cache).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

_SCRIPT = r"""
local queries = {}
for line in io.lines("%(queries)s") do queries[#queries + 1] = line end
local unique = %(unique)s
local extra = '%(extra)s'
local n = 0
local tag = '%(tag)s'  -- fresh per run: wrk's own random numbers repeat across runs
local offset = %(offset)d  -- where this run starts in the list, so runs do not repeat each other
request = function()
  n = n + 1
  local i = offset + n - 1
  local q = queries[i %% #queries + 1]
  -- Cold runs send each query once; past the end of the list a tag keeps them unique.
  if unique and i >= #queries then q = q .. " (" .. tag .. "-" .. i .. ")" end
  local body = '{"query": "' .. q .. '"' .. extra .. '}'
  return wrk.format("POST", "%(path)s", {["Content-Type"] = "application/json"}, body)
end
done = function(summary, latency, requests)
  local f = io.open("%(out)s", "w")
  f:write(string.format('{"requests": %%d, "duration_us": %%d, "errors": %%d, "non2xx": %%d, ' ..
    '"p50_us": %%d, "p99_us": %%d, "mean_us": %%f}',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(99), latency.mean))
  f:close()
end
"""


@dataclass(frozen=True, slots=True)
class LoadResult:
    connections: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int

    def row(self) -> dict[str, float]:
        return {"rps": self.rps, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "errors": self.errors}


def escape_query(query: str) -> str:
    """The query as the Lua script sends it (no quotes or backslashes to escape in JSON)."""
    return query.replace("\\", " ").replace('"', "'").replace("\n", " ")


def run_wrk(
    url: str,
    queries: list[str],
    *,
    connections: int,
    duration_s: float,
    unique: bool,
    extra_json: str = "",
    path: str = "/v1/query",
    offset: int = 0,
) -> LoadResult:
    """One wrk run; with ``unique`` each request sends the next query of the list from ``offset``."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed for the benchmarks: apt-get install wrk")
    with tempfile.TemporaryDirectory() as tmp:
        qfile = Path(tmp, "queries.txt")
        qfile.write_text("\n".join(escape_query(q) for q in queries) + "\n")
        out = Path(tmp, "out.json")
        script = Path(tmp, "load.lua")
        script.write_text(
            _SCRIPT
            % {
                "queries": qfile,
                "unique": "true" if unique else "false",
                "extra": extra_json.replace("'", "\\'"),
                "path": path,
                "out": out,
                "tag": uuid.uuid4().hex[:10],
                "offset": offset,
            }
        )
        cmd = [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{duration_s:.0f}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            url,
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=duration_s + 60)
        data = json.loads(out.read_text())
    seconds = data["duration_us"] / 1e6
    return LoadResult(
        connections=connections,
        requests=data["requests"],
        rps=data["requests"] / seconds,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=data["errors"] + data["non2xx"],
    )
