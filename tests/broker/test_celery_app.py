"""The Celery app speaks JSON only: pickle would let anyone who can write to Redis run code in a worker."""

from __future__ import annotations

import pickle

import pytest
from kombu.exceptions import ContentDisallowed
from kombu.serialization import loads
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import RedisSettings


def test_json_is_the_only_serializer_and_the_only_content_accepted() -> None:
    conf = create_celery(RedisSettings()).conf
    assert conf.task_serializer == conf.result_serializer == conf.event_serializer == "json"
    assert list(conf.accept_content) == ["json"]
    assert list(conf.result_accept_content or conf.accept_content) == ["json"]


def test_a_pickled_message_is_refused() -> None:
    accept = create_celery(RedisSettings()).conf.accept_content
    with pytest.raises(ContentDisallowed):
        loads(pickle.dumps({"x": 1}), "application/x-python-serialize", "binary", accept=accept)
