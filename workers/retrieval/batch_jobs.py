"""Job tracking and cancellation for a retrieval batch, whose requests each have their own
stream and maybe their own job: the batch's counterpart of ``hooks.TrackJob`` and
``hooks.Cancellation``, which serve a task of one request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis
from ragline.broker.contract.messages import Cancelled, RetrieveRequest, RetrieveTask
from ragline.broker.redis.keys import Keys
from ragline.broker.streams.cancel import is_cancelled
from ragline.broker.streams.events import EventWriter, finished
from ragline.workers.task_call import Hook, Skip, TaskCall

# The event writer of one job's request: (request id, job id) -> its writer.
JobWriter = Callable[[str, str], EventWriter]


@dataclass(frozen=True, slots=True)
class Serving:
    """What this run of a batch serves."""

    pending: list[RetrieveRequest]
    # The requests that are jobs: their events go through these, which drive the job records.
    writers: dict[str, EventWriter]


class BatchJobs(Hook[RetrieveTask]):
    """Which requests of the batch this run serves: a redelivered batch (its worker died, or
    stopped before it ran it) leaves out the requests that finished already, and a job's
    request moves to ``stage`` or is left out when its job was cancelled or is gone. A first
    delivery has no finished request (only the API sends batches), so it spends no round trip
    asking. None left: the task ends."""

    def __init__(self, stage: str, client: Callable[[], redis.Redis], keys: Keys, writer: JobWriter) -> None:
        self.stage = stage
        self.client = client
        self.keys = keys
        self.writer = writer

    def serving(self, call: TaskCall[RetrieveTask]) -> Serving:
        serving: Serving = call.get(self)
        return serving

    def before(self, call: TaskCall[RetrieveTask]) -> None:
        requests = call.payload.requests
        done: set[str] = set()
        if call.redelivered:
            done = finished(self.client(), self.keys, [r.request_id for r in requests])
        writers = {r.request_id: self.writer(r.request_id, r.job_id) for r in requests if r.job_id}
        pending = [
            r
            for r in requests
            if r.request_id not in done
            and (r.request_id not in writers or writers[r.request_id].start(self.stage))
        ]
        call.put(self, Serving(pending, writers))
        if not pending:
            raise Skip("each request finished already, or its job was cancelled")

    def stopped_for_cancel(self, call: TaskCall[RetrieveTask], request_id: str) -> bool:
        """Whether a job's request was cancelled since it started (asked before it goes on to
        generation); if so its stream and job end as cancelled."""
        writer = self.serving(call).writers.get(request_id)
        if writer is None or not is_cancelled(self.client(), self.keys, request_id):
            return False
        writer.emit(Cancelled())
        return True
