"""``python -m bench profile``: where the per-message path spends its time (see results/PROFILE.md).

Three views, each printed and written to ``profile.json``:

1. **Per-call costs in one process** (median of 7 repeats of a timed loop): one bare cffi crossing, a bare
   Python call, the stamp read, ``offer`` (exclusive / concurrent), ``poll`` per fragment with an empty and
   with the benchmark's handler, and the batch calls per message — against the 200 ns per message per side
   that 5 M msg/s allows.
2. **Which side bounds the two-process rate**: the per-message producer against a batch consumer and the
   batch producer against a per-message consumer, interleaved with the plain per-message and batch rows.
3. **cProfile** of a producer loop and a consumer loop (in one process, the log pre-filled for the consumer).

``--callgrind`` adds instruction counts per offer / per polled fragment split by shared object (libpython,
the cffi backend, logbuf's shim, libc) with valgrind: exact, and immune to this VM's placement noise.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import machine, runner
from bench.peers.base import BATCH, messages, stamp_at
from bench.peers.logbuf_peers import (
    FRAGMENT_LIMIT,
    BatchPollReceiver,
    LogbufPerMessage,
    OfferBatchSender,
    OfferSender,
    PollReceiver,
    open_image,
    open_publication,
)

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET_NS = 1e9 / 5_000_000  # per message per side at the 5 M msg/s target


# -- mixed rigs: one side per-message, the other batch ---------------------------------------------------


class PerMessageProducerBatchConsumer(LogbufPerMessage):
    """``offer`` per message into a consumer that never limits it (batch_poll + numpy)."""

    key = "bench.profile:PerMessageProducerBatchConsumer"
    label = "offer → batch_poll"

    def receiver(self, spec: Any, size: int, wait: str) -> BatchPollReceiver:
        return BatchPollReceiver(open_image(spec), size)


class BatchProducerPerMessageConsumer(LogbufPerMessage):
    """``poll`` per fragment fed by a producer that never limits it (offer_batch)."""

    key = "bench.profile:BatchProducerPerMessageConsumer"
    label = "offer_batch → poll"

    def sender(self, spec: Any, producer: int, size: int) -> OfferBatchSender:
        return OfferBatchSender(open_publication(spec), producer, size)


# -- in-process measurements -----------------------------------------------------------------------------


@contextmanager
def _local_log(term_length: int = 64 * 1024 * 1024) -> Iterator[tuple[Any, Any, Any]]:
    """A log in /dev/shm with a huge limit: (log, exclusive publication factory, image factory)."""
    from logbuf import ConcurrentPublication, ExclusivePublication, Image, LogBuffers, Position

    directory = tempfile.mkdtemp(prefix="bench-profile-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    log = LogBuffers.create(os.path.join(directory, "p.logbuffer"), term_length=term_length, mtu=8192,
                            pre_touch=True)
    log.is_connected = True
    try:
        def publication(concurrent: bool = False) -> Any:
            cls = ConcurrentPublication if concurrent else ExclusivePublication
            return cls(log, Position.standalone(1 << 62))

        def image() -> Any:
            return Image(log, Position.standalone(0))

        yield log, publication, image
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def _per_call(fn: Callable[[int], None], n: int, repeats: int = 7) -> float:
    """Median ns per iteration of ``fn(n)`` (which runs n iterations)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        times.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(times)


def per_call_costs(n: int, size: int = 32) -> dict[str, float]:
    from logbuf.native import ffi, lib

    out: dict[str, float] = {}
    cell = ffi.new("int64_t *")
    msgs = messages(size, 0)
    offset = size - 8
    view = memoryview(msgs[0])

    def cffi_call(k: int) -> None:
        get = lib.lb_get_i64_acquire
        for _ in range(k):
            get(cell)

    def noop(a: Any, b: Any) -> None:
        return None

    def python_call(k: int) -> None:
        for _ in range(k):
            noop(view, None)

    def stamp(k: int) -> None:
        for _ in range(k):
            stamp_at(view, offset)

    def empty_loop(k: int) -> None:
        for _ in range(k):
            pass

    out["empty loop iteration"] = _per_call(empty_loop, n)
    out["cffi call (lb_get_i64_acquire)"] = _per_call(cffi_call, n)
    out["Python call of a 2-argument function"] = _per_call(python_call, n)
    out["stamp read (struct unpack_from)"] = _per_call(stamp, n)

    # each measurement gets a fresh log holding all 7 repeats (at most 7 x n frames of 64 B: keep n <= 250k so
    # nothing laps the 3 x 64 MiB terms; there is no conductor cleaning behind)
    for concurrent in (False, True):
        with _local_log() as (_, publication, _image_factory):
            sender = OfferSender(publication(concurrent), 0, size)
            out[f"offer() {'concurrent' if concurrent else 'exclusive'}, per message"] = _per_call(sender.send, n)

    with _local_log() as (_, publication, image):
        OfferSender(publication(), 0, size).send(7 * n)
        img = image()

        def poll_noop(k: int) -> None:
            got = 0
            while got < k:
                got += img.poll(noop, min(FRAGMENT_LIMIT, k - got))

        out["poll(), empty handler, per fragment"] = _per_call(poll_noop, n)

    with _local_log() as (_, publication, image):
        OfferSender(publication(), 0, size).send(7 * n)
        receiver = PollReceiver(image(), size)
        out["poll(), benchmark handler (stamp sum), per fragment"] = _per_call(receiver.receive, n)

    # the fixed cost of a poll that finds one fragment (what a ping-pong pays on each side), and its parts
    with _local_log() as (log, publication, image):
        from logbuf.logbuffer.term_reader import TermReader
        from logbuf.position import Position

        OfferSender(publication(), 0, size).send(7 * n)
        img = image()
        reader = TermReader(log.term_pointer(0), log.term_length, 4096)
        position = Position.standalone(0)
        term = log.terms.view
        poll = img.poll

        def poll_one(k: int) -> None:
            for _ in range(k):
                poll(noop, 1)

        def read(k: int) -> None:
            for _ in range(k):
                reader.read(0, 0, 1)

        def pairs(k: int) -> None:
            for _ in range(k):
                reader.pairs(1)

        def commit(k: int) -> None:
            for _ in range(k):
                position.set(0)

        def slice_payload(k: int) -> None:
            for _ in range(k):
                term[32:64]  # noqa: B018  (the cost being measured)

        out["poll(noop, 1) finding one fragment"] = _per_call(poll_one, n)
        out["  part: TermReader.read (one cffi call)"] = _per_call(read, n)
        out["  part: TermReader.pairs (ffi.unpack into a list)"] = _per_call(pairs, n)
        out["  part: sub-pos commit (Position.set, one cffi call)"] = _per_call(commit, n)
        out["  part: memoryview slice of the payload"] = _per_call(slice_payload, n)

    # a whole round trip's software, in one process: what is left of a ping-pong without the other core
    with _local_log() as (_, ping_pub, ping_img), _local_log() as (_, pong_pub, pong_img):
        ping_tx, ping_rx = OfferSender(ping_pub(), 0, size), PollReceiver(ping_img(), size)
        pong_tx, pong_rx = OfferSender(pong_pub(), 0, size), PollReceiver(pong_img(), size)

        def round_trips(k: int) -> None:
            for i in range(k):
                ping_tx.send_one(i)
                pong_tx.send_one(ping_rx.receive_one())
                pong_rx.receive_one()

        out["round trip in one process (2 x offer + 2 x poll(handler, 1))"] = _per_call(round_trips, n)

    with _local_log() as (_, publication, image):
        sender = OfferBatchSender(publication(), 0, size)
        out[f"offer_batch({BATCH}) per message"] = _per_call(sender.send, n)
        receiver = BatchPollReceiver(image(), size)
        out["batch_poll() + numpy check per message"] = _per_call(receiver.receive, n)
    return out


def two_sided(size: int, count: int, runs: int) -> dict[str, list[float]]:
    """Interleaved two-process runs: which side bounds the per-message rate."""
    keys = ["logbuf", PerMessageProducerBatchConsumer.key, BatchProducerPerMessageConsumer.key, "logbuf-batch"]
    rates: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(runs):
        for key in keys:
            n = count * (5 if key == "logbuf-batch" else 1)
            rates[key].append(runner.throughput(key, size, count=n, warmup=1000).msgs_per_s)
    return rates


def cprofile(n: int, size: int = 32) -> dict[str, str]:
    out = {}
    with _local_log() as (_, publication, image):
        sender = OfferSender(publication(), 0, size)
        prof = cProfile.Profile()
        prof.runcall(sender.send, n)
        out["producer: OfferSender.send (offer per message)"] = _stats(prof)
        receiver = PollReceiver(image(), size)
        prof = cProfile.Profile()
        prof.runcall(receiver.receive, n)
        out["consumer: PollReceiver.receive (poll + handler per fragment)"] = _stats(prof)
    return out


def _stats(prof: cProfile.Profile) -> str:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(8)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return "\n".join(lines[start:])


# -- callgrind --------------------------------------------------------------------------------------------


_CALLGRIND_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from bench.profile import _local_log, OfferSender, PollReceiver
with _local_log(16 * 1024 * 1024) as (_, publication, image):
    sender = OfferSender(publication(), 0, 32)
    receiver = PollReceiver(image(), 32)
    sender.send({offers})
    receiver.receive({polls})
"""

# where an instruction ran, by the shared object callgrind_annotate names
_OBJECTS = (("libpython", "Python interpreter"), ("_cffi_backend", "cffi backend"), ("_native", "logbuf C shim"),
            ("_struct", "struct module"), ("libc.so", "libc (memcpy, malloc, ...)"))


def callgrind(n: int) -> dict[str, Any]:
    """Instructions per ``offer`` and per polled fragment, by shared object.

    Three runs that differ only in how many calls they make (n offers; 2n offers; 2n offers + 2n polled
    fragments): the differences cancel start-up exactly (fixed hash seed, one BLAS thread), so
    (run2 - run1) / n is one offer and (run3 - run2) / 2n one polled fragment with the benchmark's handler.
    """
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        return {"error": "valgrind / callgrind_annotate are not installed"}
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    runs = []
    for offers, polls in ((n, 0), (2 * n, 0), (2 * n, 2 * n)):
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "s.py")
            Path(script).write_text(_CALLGRIND_SCRIPT.format(root=root, offers=offers, polls=polls))
            out = os.path.join(tmp, "cg.out")
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, script],
                           check=True, capture_output=True, timeout=1800, env=env)
            annotate = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", out],
                                      check=True, capture_output=True, text=True).stdout
            runs.append(_parse(annotate))
    out: dict[str, Any] = {}
    for name, (more, fewer, calls) in {"offer": (runs[1], runs[0], n),
                                        "polled_fragment": (runs[2], runs[1], 2 * n)}.items():
        out[f"instructions_per_{name}"] = _diff(more[0], fewer[0], calls)
        out[f"top_functions_per_{name}"] = dict(list(_diff(more[1], fewer[1], calls).items())[:12])
    return out


def _parse(annotate: str) -> tuple[dict[str, float], dict[str, float]]:
    """callgrind_annotate's per-function ``Ir`` lines summed by shared object, and by function."""
    objects: dict[str, float] = {}
    functions: dict[str, float] = {}
    for line in annotate.splitlines():
        parts = line.split()
        if not parts or not parts[0].replace(",", "").isdigit() or "PROGRAM" in line:
            continue
        ir = float(parts[0].replace(",", ""))
        where = line.rsplit("[", 1)[1] if line.rstrip().endswith("]") else line
        obj = next((label for key, label in _OBJECTS if key in where), None)
        if obj is None:
            obj = "Python interpreter" if "Python-3" in line else "other"
        objects[obj] = objects.get(obj, 0.0) + ir
        # "123 (0.1%)  /path/file.c:function [/lib/object.so]" -> "function (object)"
        body = line.split(")", 1)[1].strip() if ")" in line else " ".join(parts[1:])
        body = body.rsplit(" [", 1)[0]
        function = body.rsplit(":", 1)[-1].split("'", 1)[0]
        key = f"{function} ({obj})"
        functions[key] = functions.get(key, 0.0) + ir
    return objects, functions


def _diff(more: dict[str, float], fewer: dict[str, float], calls: int) -> dict[str, float]:
    per_call = {k: (more.get(k, 0.0) - fewer.get(k, 0.0)) / calls for k in set(more) | set(fewer)}
    items = sorted(((k, round(v, 1)) for k, v in per_call.items() if abs(v) >= 0.5), key=lambda kv: -kv[1])
    return dict(items + [("total", round(sum(per_call.values()), 1))])


# -- the command ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000, help="iterations per in-process measurement (<= 250k)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per two-process run")
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds of the two-process runs")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions with valgrind")
    parser.add_argument("--callgrind-calls", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if min(args.calls, args.messages, args.runs, args.callgrind_calls) < 1:
        parser.error("counts must be positive")
    if args.calls > 250_000 or args.callgrind_calls > 250_000:
        parser.error("--calls and --callgrind-calls are at most 250,000 (the in-process logs are not cleaned)")

    info = machine.describe()
    result: dict[str, Any] = {"command": "python -m bench profile " + " ".join(sys.argv[2:] if argv is None else argv),
                              "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": info}
    costs = per_call_costs(args.calls)
    result["per_call_ns"] = costs
    print(f"Per-call costs, one process, 32 B (median of 7 x {args.calls:,}); budget at 5 M msg/s: "
          f"{BUDGET_NS:.0f} ns per message per side")
    for name, ns in costs.items():
        print(f"  {ns:8.1f} ns  {name}")

    rates = two_sided(32, args.messages, args.runs)
    result["two_process_msgs_per_s"] = rates
    print(f"\nTwo processes, 32 B, {args.messages:,} messages, median of {args.runs} interleaved runs:")
    labels = {"logbuf": "offer → poll (per-message row)", "logbuf-batch": "offer_batch → batch_poll (batch row)",
              PerMessageProducerBatchConsumer.key: PerMessageProducerBatchConsumer.label + " (producer alone)",
              BatchProducerPerMessageConsumer.key: BatchProducerPerMessageConsumer.label + " (consumer alone)"}
    for key, values in rates.items():
        print(f"  {statistics.median(values) / 1e6:7.2f} M msg/s  {labels[key]}  "
              f"(runs: {', '.join(f'{v / 1e6:.2f}' for v in values)})")

    profiles = cprofile(args.calls)
    result["cprofile"] = profiles
    for name, text in profiles.items():
        print(f"\ncProfile, {name}, {args.calls:,} messages:\n{text}")

    if args.callgrind:
        cg = callgrind(args.callgrind_calls)
        result["callgrind"] = cg
        print(f"\nInstructions (callgrind, {args.callgrind_calls:,} calls): {json.dumps(cg, indent=1)}")
    info["load_1m_at_end"] = machine.load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0



