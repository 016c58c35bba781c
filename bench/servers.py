"""Reference servers for the benchmarks, in the same framework (FastAPI on uvicorn) as ragline.

- ``naive``: per request one embedding and one FAISS search, no cache, no batching. An
  ``async def`` endpoint that encodes on the event loop's thread was the best naive variant
  measured here (a ``def`` endpoint on the thread pool was slower).
- ``floor``: one Redis GET, its bytes returned: the floor for any cache hit.

Run as ``python -m bench.servers naive|floor --port N`` with RAGLINE_ settings in the environment.
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from ragline.broker.config.settings import get_settings


def naive_app() -> FastAPI:
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import indexes
    from ragline.workers.retrieval import index_store
    from ragline.workers.retrieval.embedder import Embedder

    settings = get_settings()
    embedder = Embedder(settings.retrieval)
    info = indexes.lookup(
        sync_client(settings.redis), Keys(settings.redis.key_prefix), settings.retrieval.default_index
    )
    assert info is not None, "ingest the index first"
    loaded = index_store.load(info, ef_search=settings.retrieval.hnsw_ef_search)
    app = FastAPI()

    @app.post("/v1/query")
    async def query(request: Request) -> dict[str, object]:
        body = await request.json()
        vector = embedder.encode([body["query"]])
        hits = loaded.search(vector, int(body.get("top_k", 5)))[0]
        return {
            "sources": [
                {"chunk_id": c.chunk_id, "source": c.source, "title": c.title, "text": c.text, "score": s}
                for c, s in hits
            ]
        }

    return app


def floor_app() -> FastAPI:
    import redis.asyncio as aioredis

    settings = get_settings()
    client = aioredis.Redis.from_url(settings.redis.redis_url)
    app = FastAPI()

    @app.post("/v1/query")
    async def query() -> Response:
        return Response(await client.get("ragline-bench:floor"), media_type="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["naive", "floor"])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = naive_app() if args.kind == "naive" else floor_app()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
