"""Fair turns on the ingest queue: each API key's ingest jobs wait in a list of their own, and
the keys with work take turns, one job each, so one key's backlog delays another key's upload
by the job running, not by the backlog.

The API pushes a job (:func:`apush`: its task kept in Redis) and sends one
``ragline.ingest_turn`` task (``broker/contract/queues.py``); the worker that takes a turn runs
the next key's oldest job (:meth:`Turns.take`), whichever upload sent the turn. A key whose job
runs waits parked, and rejoins the ring when that job ends, behind the keys that came meanwhile;
when no key is in the ring, a parked key's next job runs at once, so no worker idles while jobs
wait. A running job holds a lease that its worker renews; a job whose lease ended (its worker
died) goes back to the front of its key's list (:meth:`Turns.recover`, at every turn and at a
worker's start), so nothing accepted is lost, and no job runs on two workers at once while its
lease holds.

``<prefix>:ingest-ring`` list of keys whose turn comes, in order (each once);
``<prefix>:ingest-parked`` list of keys with jobs waiting while one of theirs runs;
``<prefix>:ingest-waiting:<key>`` list of that key's waiting job ids, oldest first;
``<prefix>:ingest-tasks`` hash job id -> :class:`QueuedIngest` JSON, until the job ends;
``<prefix>:ingest-running`` sorted set job id -> lease end (unix ms, Redis's clock).
The Lua scripts beside this module make each move in one step.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from ragline.broker.contract.messages import QueuedIngest
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.replies import text
from ragline.broker.redis.scripts import AsyncStateScript, StateScript, lua

_PUSH = lua(__package__, "ingest_turns_push")
_TAKE = lua(__package__, "ingest_turns_take")
_RENEW = lua(__package__, "ingest_turns_renew")
_REQUEUE = lua(__package__, "ingest_turns_requeue")
_WITHDRAW = lua(__package__, "ingest_turns_withdraw")
_FINISH = lua(__package__, "ingest_turns_finish")
# Jobs one look moves back from ended leases; the next turn moves more.
_RECOVER_BATCH = 100


async def apush(client: aioredis.Redis, keys: Keys, queued: QueuedIngest) -> None:
    """Queue ``queued`` behind its key's other jobs (the API, before it sends the turn)."""
    job_id = queued.task.job_id
    await AsyncStateScript(client, _PUSH)(
        keys=[keys.ingest_ring, keys.ingest_tasks, keys.ingest_waiting(queued.key)],
        args=[queued.key, job_id, queued.encode()],
    )


async def awithdraw(client: aioredis.Redis, keys: Keys, queued: QueuedIngest) -> None:
    """Undo :func:`apush` (the turn could not be sent)."""
    await AsyncStateScript(client, _WITHDRAW)(
        keys=[keys.ingest_ring, keys.ingest_parked, keys.ingest_tasks, keys.ingest_waiting(queued.key)],
        args=[queued.key, queued.task.job_id],
    )


@dataclass(frozen=True, slots=True)
class Taken:
    """A job a worker took, and runs under its lease."""

    job_id: str
    queued: QueuedIngest


class Turns:
    """The worker's side; each running job's lease lasts ``lease_s`` from its last renewal."""

    def __init__(self, client: redis.Redis, keys: Keys, *, lease_s: float) -> None:
        self._client = client
        self._keys = keys
        self._lease_ms = max(1, int(lease_s * 1000))
        self._take = StateScript(client, _TAKE)
        self._renew = StateScript(client, _RENEW)
        self._requeue = StateScript(client, _REQUEUE)
        self._finish = StateScript(client, _FINISH)
        self._lines = [keys.ingest_ring, keys.ingest_parked, keys.ingest_tasks, keys.ingest_running]

    def take(self) -> Taken | None:
        """The next key's oldest job, now running under a lease; None when none waits."""
        found = self._take(keys=self._lines, args=[self._keys.ingest_waiting(""), self._lease_ms])
        if not found:
            return None
        job_id, raw = found
        return Taken(text(job_id), QueuedIngest.decode(raw))

    def renew(self, taken: Taken) -> bool:
        """Its lease, for another ``lease_s``; False when it had ended (the job was queued again)."""
        return bool(int(self._renew(keys=[self._keys.ingest_running], args=[taken.job_id, self._lease_ms])))

    def give_back(self, taken: Taken) -> None:
        """Back to the front of its key's list, not run (its index was locked)."""
        self._requeue(keys=self._lines, args=[self._keys.ingest_waiting(""), 1, taken.job_id])

    def finish(self, taken: Taken) -> None:
        """The job ended: its task and lease go, and its key's next job gets a turn."""
        self._finish(keys=self._lines, args=[taken.queued.key, taken.job_id])

    def recover(self) -> int:
        """Running jobs whose lease ended back at the front of their keys' lists; how many."""
        return int(
            self._requeue(keys=self._lines, args=[self._keys.ingest_waiting(""), _RECOVER_BATCH, "expired"])
        )

    def waiting(self) -> int:
        """Jobs waiting their turn (not running)."""
        return int(self._client.hlen(self._keys.ingest_tasks)) - int(
            self._client.zcard(self._keys.ingest_running)
        )
