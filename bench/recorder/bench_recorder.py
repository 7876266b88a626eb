"""Recorder throughput: a publisher at full speed (the feed handler's three streams) -> ``Recorder`` -> Parquet.

    PYTHONPATH=src .venv/bin/python bench/recorder/bench_recorder.py --messages 5e6 --runs 3

Three processes, as in production: ``logbuf driver`` (IPC term length ``--term-length``), a publisher that
plays a synthetic ITCH day as the feed handler would publish it (messages with the sequence as reserved
value, PACKET rows for the A and B copy of every packet, DELIVERED runs, SESSION_CHANGED first and
END_OF_SESSION last), and the recorder (``Recorder.run(until_end_of_session=True)``, in this process, as
the end-to-end demo runs it).  The publisher never waits for the recorder except through back-pressure
(the recorder holds the window until its files are complete), so the end-to-end rate is the recorder's.

Reported per run: messages/s from the publisher's first message to the recorder's return (every message
in complete files, checkpoint written), the publisher's own rate, CPU seconds of the recorder per million
messages, files and bytes written.  The goal is the feed handler's rate (~1 M msg/s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import numpy as np  # noqa: E402

import logbuf  # noqa: E402
from logbuf.exchange.dayfile import LENGTH_PREFIX_SIZE, scan_frames  # noqa: E402
from logbuf.exchange.synth import SynthConfig, SyntheticDay  # noqa: E402
from logbuf.feed import published as out  # noqa: E402

SESSION = b"BENCH0001"
DAY_MESSAGES = 1_000_000  # the day is replayed with increasing sequences until --messages
CHUNK = 512  # messages per publisher step (~ one receive batch of the handler)
LOGBUF = [sys.executable, "-m", "logbuf.cli"]


# -- the publisher process ----------------------------------------------------------------------------------


def _offer(publication, data, reserved: int) -> None:  # type: ignore[no-untyped-def]
    while True:
        result = publication.offer(data, reserved)
        if result > 0:
            return
        if result == logbuf.CLOSED:
            raise SystemExit("publication closed")
        time.sleep(0)  # back-pressured: the recorder holds the window until its files are complete


def publish(directory: str, messages: int) -> None:
    day_messages = min(DAY_MESSAGES, max(messages, 20_000))
    chunks = [frames for frames, _ in SyntheticDay(SynthConfig(messages=day_messages, seed=11)).chunks()]
    data = np.concatenate(chunks)
    frames, end = scan_frames(memoryview(data), 0, day_messages + 1)
    offsets = (frames + LENGTH_PREFIX_SIZE).astype(np.int64)
    lengths = (np.diff(np.append(frames, end)) - LENGTH_PREFIX_SIZE).astype(np.int32)
    rng = np.random.default_rng(5)
    packet_sizes = rng.integers(1, 16, size=day_messages)  # messages per MoldUDP64 packet
    with logbuf.connect(directory) as client:
        msgs = client.add_exclusive_publication("aeron:ipc", out.MESSAGES_STREAM)
        events = client.add_exclusive_publication("aeron:ipc", out.EVENTS_STREAM)
        capture = client.add_exclusive_publication("aeron:ipc", out.CAPTURE_STREAM)
        while not (msgs.is_connected and events.is_connected and capture.is_connected):
            time.sleep(0.001)
        print(json.dumps({"start": time.time()}), flush=True)
        started = time.perf_counter()
        now = time.time_ns()
        _offer(events, out.FeedEvent(out.SESSION_CHANGED, 0, 1, 0, now, SESSION).encode(), 1)
        seq = 1
        done = 0
        k = 0
        while done < messages:
            i = done % day_messages
            n = min(CHUNK, messages - done, day_messages - i)
            sizes = []
            total = 0
            while total < n:
                size = int(min(packet_sizes[(k + len(sizes)) % day_messages], n - total))
                sizes.append(size)
                total += size
            k += len(sizes)
            firsts = seq + np.concatenate(([0], np.cumsum(sizes)[:-1]))
            now = time.time_ns()
            arrivals = now + np.arange(len(sizes), dtype=np.int64) * 1_000
            rows = np.zeros(2 * len(sizes), dtype=out.PACKET_ROW)
            rows["feed"] = np.repeat(np.array([ord("A"), ord("B")], np.uint8)[None, :], len(sizes), 0).reshape(-1)
            rows["arrival_ns"] = np.repeat(arrivals, 2) + np.tile([0, 20_000], len(sizes))
            rows["sequence"] = np.repeat(firsts, 2)
            rows["count"] = np.repeat(sizes, 2)
            rows["bytes"] = 20 + 40 * rows["count"]
            per_frame = capture.max_message_length // out.CAPTURE_ROW_LENGTH
            for s in range(0, rows.size, per_frame):
                _offer(capture, rows[s : s + per_frame].tobytes(), out.CAPTURE_PACKETS)
            seqs = np.arange(seq, seq + n, dtype=np.int64)
            sent = 0
            while sent < n:
                appended, result = msgs.offer_batch(data, lengths[i + sent : i + n], seqs[sent:],
                                                    offsets[i + sent : i + n])
                sent += appended
                if not appended:
                    if result == logbuf.CLOSED:
                        raise SystemExit("publication closed")
                    time.sleep(0)
            runs = np.zeros(len(sizes), dtype=out.DELIVERED_ROW)
            runs["feed"], runs["count"], runs["arrival_ns"], runs["first"] = ord("A"), sizes, arrivals, firsts
            _offer(capture, runs.tobytes(), out.CAPTURE_DELIVERED)
            seq += n
            done += n
        _offer(events, out.FeedEvent(out.END_OF_SESSION, 0, seq, 0, time.time_ns(), SESSION).encode(), seq)
        seconds = time.perf_counter() - started
        print(json.dumps({"published": done, "seconds": seconds}), flush=True)
        # stay until the recorder has read everything (a closed publication is only drained for a linger)
        while msgs.is_connected:
            time.sleep(0.05)


# -- one run ---------------------------------------------------------------------------------------------


def run_once(messages: int, term_length: str, work: Path, rows_per_file: int) -> dict:
    from logbuf.recorder import Recorder, RecorderConfig
    from logbuf.recording.reader import complete_files

    directory = work / "driver"
    driver = subprocess.Popen([*LOGBUF, "driver", "--dir", str(directory), "--ipc-term-length", term_length],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    publisher = None
    try:
        deadline = time.monotonic() + 10
        while not (directory / "cnc.dat").exists():
            if time.monotonic() > deadline or driver.poll() is not None:
                raise RuntimeError("the driver did not start")
            time.sleep(0.05)
        config = RecorderConfig(output=work / "recording", driver_directory=directory, rows_per_file=rows_per_file)
        with Recorder(config) as recorder:
            publisher = subprocess.Popen([sys.executable, __file__, "--publisher", str(directory), "--messages",
                                          str(messages)], stdout=subprocess.PIPE, text=True)
            assert publisher.stdout is not None
            start = json.loads(publisher.stdout.readline())["start"]
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            stats = recorder.run(until_end_of_session=True)
            finished = time.time()
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        published = json.loads(publisher.stdout.readline())
        publisher.wait(30)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        files = complete_files(work / "recording", "messages")
        return {
            "messages": stats.messages,
            "complete": stats.messages == messages,
            "seconds": finished - start,
            "msg_per_s": stats.messages / (finished - start),
            "publisher_msg_per_s": published["published"] / published["seconds"],
            "cpu_s_per_m": cpu / (stats.messages / 1e6),
            "files": stats.files,
            "message_files": len(files),
            "mb": stats.bytes / 1e6,
            "commits": stats.commits,
            "packets": stats.packets,
        }
    finally:
        if publisher is not None and publisher.poll() is None:
            publisher.kill()
            publisher.wait(10)
        driver.terminate()
        try:
            driver.wait(10)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=float, default=5e6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--term-length", default="64m", help="driver IPC term length (the window is half)")
    parser.add_argument("--rows-per-file", type=float, default=16e6)
    parser.add_argument("--json", metavar="PATH", help="also write the runs and the median as JSON")
    parser.add_argument("--publisher", metavar="DRIVER_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publisher:
        publish(args.publisher, int(args.messages))
        return 0
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-recorder-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                         else None) as work:
            result = run_once(int(args.messages), args.term_length, Path(work), int(args.rows_per_file))
        results.append(result)
        print(f"run {run + 1}: {result['msg_per_s'] / 1e6:.2f} M msg/s end to end ({result['messages']:,} messages "
              f"in {result['seconds']:.1f} s, complete={result['complete']}), publisher alone "
              f"{result['publisher_msg_per_s'] / 1e6:.2f} M msg/s, recorder CPU {result['cpu_s_per_m']:.2f} s/M msg, "
              f"{result['files']} files ({result['message_files']} messages files), {result['mb']:.0f} MB, "
              f"{result['commits']} commits, {result['packets']:,} packet rows", flush=True)
    rates = [r["msg_per_s"] for r in results]
    print(f"median {statistics.median(rates) / 1e6:.2f} M msg/s (min {min(rates) / 1e6:.2f}, max "
          f"{max(rates) / 1e6:.2f}) over {len(rates)} runs of {int(args.messages):,} messages; load average "
          f"{os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "median_msg_per_s": statistics.median(rates),
                                               "messages": int(args.messages), "term_length": args.term_length},
                                              indent=1) + "\n")
    return 0 if all(r["complete"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
