"""Helpers shared by several test files (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import time
import uuid

from broker import jobs


def finished_job_record(webhook_url: str, *, owner: str = "carol") -> dict[str, str]:
    """A done retrieval job's record with a webhook, as the callbacks worker claims it."""
    record = jobs.new_record(
        job_id=uuid.uuid4().hex,
        owner=owner,
        request={"query": "q", "top_k": 1, "mode": "retrieval", "index": "i"},
        webhook_url=webhook_url,
        metadata={"a": 1},
        now=time.time(),
    )
    return {**record, "status": "done", "done_at": repr(time.time()), "result": json.dumps({"answer": None})}
