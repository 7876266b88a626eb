"""The recorder end to end: an embedded driver, the feed handler's streams played by the rig, Parquet read back.

The crash test runs ``logbuf record`` as a child process and kills it with SIGKILL mid-file.
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from recorder_rig import Day, FeedPublisher, FeedScript, expected_columns, make_script, synth_day

import logbuf
import support
from logbuf.cnc.counters import RECORDER_COUNTER_TYPE_ID
from logbuf.feed import published as out
from logbuf.recorder import Recorder, RecorderConfig, RecorderDataLoss, RecorderError
from logbuf.recorder.config import RecorderConfigError
from logbuf.recording import schema
from logbuf.recording.reader import complete_files, read_dataset

pytestmark = pytest.mark.timeout(90)
TERM = 256 * 1024  # small terms: commits every ~1000 messages, so every test crosses many files


def wait_until(predicate: Callable[[], object], what: str) -> object:
    return support.wait_until(predicate, 20.0, what=what)


def recorder_counters(client: logbuf.Client) -> dict[str, int]:
    return {i.label: i.value for i in client.counters if i.type_id == RECORDER_COUNTER_TYPE_ID}


@pytest.fixture(scope="module")
def day() -> Day:
    return synth_day(24_000)


def launch_driver(directory: Path, liveness_s: float = 10.0) -> logbuf.MediaDriver:
    return logbuf.MediaDriver.launch(directory, ipc_term_length=TERM, timer_interval_ns=50_000_000,
                                     client_liveness_timeout_ns=int(liveness_s * 1e9))


class Background:
    """Runs a callable on a thread and keeps its exception for the test to look at (``failed`` is set then)."""

    def __init__(self, target, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.error: BaseException | None = None
        self.result = None
        self.failed = threading.Event()

        def run() -> None:
            try:
                self.result = target(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                self.error = exc
                self.failed.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background work did not finish"


def check_recording(root: Path, day: Day, script: FeedScript) -> None:
    """Every delivered message exactly once with the right columns; packets and gaps exactly the published."""
    messages = read_dataset(root, schema.MESSAGES).to_pylist()
    keys = collections.Counter((m["session"], m["sequence"]) for m in messages)
    duplicated = [k for k, n in keys.items() if n > 1]
    assert not duplicated, f"recorded more than once: {duplicated[:5]}"
    assert set(keys) == set(script.messages), (
        f"missing {sorted(set(script.messages) - set(keys))[:5]}, extra {sorted(set(keys) - set(script.messages))[:5]}")
    types = collections.Counter()
    for m in messages:
        index, feed, arrival = script.messages[(m.pop("session"), m.pop("sequence"))]
        assert (m.pop("feed"), m.pop("arrival_ns")) == (feed, arrival)
        assert m.pop("hour") == schema.hour_label(arrival)
        assert m == expected_columns(day.message(index))
        types[m["type"]] += 1
    assert {"A", "E", "U", "R", "S", "Q", "I"} <= set(types), types  # the day's types, decoded per type above
    packets = read_dataset(root, schema.PACKETS).to_pylist()
    got = collections.Counter((p["session"], p["feed"], p["arrival_ns"], p["sequence"], p["count"], p["bytes"])
                              for p in packets)
    assert got == collections.Counter(script.packets)
    gaps = read_dataset(root, schema.GAPS).to_pylist()
    assert {g["feed"] for g in gaps} <= {"both"}
    assert sorted((g["session"], g["first"], g["last"], g["detected_ns"], g["recovered_ns"]) for g in gaps) == sorted(
        script.gaps)
    assert not list(root.rglob("*.tmp")), "a stopped recording leaves no in-progress file"


def test_streams_round_trip_into_parquet_across_two_sessions_and_many_files(tmp_path: Path, day: Day) -> None:
    script = make_script(day, [("S1", 14_000), ("S2", 7_000)], gap_every=97)
    assert len(script.gaps) >= 20 and any(g[4] is None for g in script.gaps)
    with launch_driver(tmp_path / "drv") as driver:
        config = RecorderConfig(output=tmp_path / "rec", driver_directory=driver.directory, rows_per_file=3_000,
                                row_group_rows=1_000, commit_interval_s=0.5)
        with Recorder(config) as recorder, logbuf.connect(driver.directory) as client:
            run = Background(recorder.run)
            publisher = FeedPublisher(client)
            publisher.wait_connected()
            publisher.play(day, script.steps)
            wait_until(lambda: recorder.stats().messages == len(script.messages) and recorder.stats().pending_join == 0,
                       what="every message recorded")

            wait_until(lambda: recorder_counters(client).get("recorder: messages rows") == len(script.messages),
                       what="counters")
            assert {"recorder: files completed", "recorder: held bytes", "recorder: lag bytes"} <= set(
                recorder_counters(client))
            recorder.stop()
            run.join()
            assert run.error is None
            stats = run.result
    assert stats.messages == len(script.messages) and stats.orphans == 0 and stats.duplicates == 0
    assert stats.files >= 8 and stats.commits >= 5
    check_recording(tmp_path / "rec", day, script)
    sessions = {p.parent.parent.name for p in complete_files(tmp_path / "rec", schema.MESSAGES)}
    assert sessions == {"session=S1", "session=S2"}


def test_commits_keep_up_with_a_small_publication_window(tmp_path: Path, day: Day) -> None:
    """The recorder holds what it has not made durable; with a 16 KiB window (not the default half term) it
    must commit often enough that the publisher never waits for the 60 s commit interval."""
    script = make_script(day, [("WIN", 6_000)])
    with logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=TERM, ipc_publication_window=16 * 1024,
                                   timer_interval_ns=50_000_000) as driver, \
            logbuf.connect(driver.directory) as client:
        config = RecorderConfig(output=tmp_path / "rec", driver_directory=driver.directory, commit_interval_s=60)
        with Recorder(config) as recorder:
            run = Background(recorder.run, until_end_of_session=True)
            publisher = FeedPublisher(client, deadline_s=5)  # fails if an offer stays back-pressured 5 s
            publisher.wait_connected()
            started = time.monotonic()
            try:
                publisher.play(day, script.steps)
            finally:
                publisher.stopped.set()
            run.join(30)
    assert time.monotonic() - started < 20
    assert run.error is None and run.result.commits >= 10
    check_recording(tmp_path / "rec", day, script)


def handler_restart_scripts(day: Day) -> tuple[FeedScript, FeedScript, FeedScript]:
    """A handler's run that stops mid-session, the next run's (a new session, later), and both together."""
    first_run = make_script(day, [("S1", 6_000)], gap_every=89, end_of_session=False)
    second_run = make_script(day, [("S2", 6_000)], gap_every=89, start_ns=first_run.end_ns)
    both = FeedScript(steps=[], messages={**first_run.messages, **second_run.messages},
                      packets=first_run.packets + second_run.packets, gaps=first_run.gaps + second_run.gaps)
    return first_run, second_run, both


def test_a_feed_handler_restart_is_followed_to_its_new_publications(tmp_path: Path, day: Day) -> None:
    first_run, second_run, script = handler_restart_scripts(day)
    with launch_driver(tmp_path / "drv") as driver, logbuf.connect(driver.directory) as client:
        config = RecorderConfig(output=tmp_path / "rec", driver_directory=driver.directory, commit_interval_s=0.5)
        with Recorder(config) as recorder:
            run = Background(recorder.run, until_end_of_session=True)
            # a recorder that fails stops the plays: the test reports its error, not an offer back-pressured 60 s
            first = FeedPublisher(client, stopped=run.failed)
            first.wait_connected()
            first.play(day, first_run.steps)
            first.close()  # the handler goes: its images end, are drained and close
            second = FeedPublisher(client, stopped=run.failed)  # a new handler: new publications and session ids
            second.wait_connected()
            second.play(day, second_run.steps)
            run.join(30)
            second.close()
    assert run.error is None, run.error
    assert (run.result.losses, run.result.orphans, run.result.mismatches) == (0, 0, 0)
    check_recording(tmp_path / "rec", day, script)


def test_an_image_closed_before_the_recorder_saw_its_end_ends_without_a_loss_when_it_was_read_to_the_end(
        tmp_path: Path, day: Day) -> None:
    """A commit released every byte of the first handler's images, then the handler closed: the driver finds
    them drained at once and the client closes them before the recorder's next cycle (as on a busy machine).
    Each was read to its end, so it ends without a loss and the next handler's images are recorded."""
    first_run, second_run, script = handler_restart_scripts(day)
    config = RecorderConfig(output=tmp_path / "rec", driver_directory=tmp_path / "drv", commit_interval_s=3600)
    with launch_driver(tmp_path / "drv") as driver, logbuf.connect(driver.directory) as client, \
            Recorder(config) as recorder:
        first = FeedPublisher(client)
        first.wait_connected()
        wait_until(lambda: all(s.subscription.images for s in recorder.streams.values()), what="images")
        playing = Background(first.play, day, first_run.steps)

        def all_read() -> bool:
            published = not playing.thread.is_alive()  # (before the cycle: nothing comes after it)
            return recorder.do_work() == 0 and published and recorder.join.pending_messages == 0
        wait_until(all_read, what="the first run read and joined")
        assert playing.error is None, playing.error
        recorder.commit()
        subscriptions = [s.subscription for s in recorder.streams.values()]
        assert all(s.active is not None and s.active.held == 0 and s.active.end_of_stream is None
                   for s in recorder.streams.values())
        first.close()
        wait_until(lambda: not any(s.images for s in subscriptions), what="the drained images closed")
        second = FeedPublisher(client)
        second.wait_connected()
        playing = Background(second.play, day, second_run.steps)
        try:
            stats = recorder.run(duration_s=60, until_end_of_session=True)  # (RecorderDataLoss before the fix)
        finally:
            second.stopped.set()  # (it returns at once if the recorder failed)
        playing.join()
        second.close()
    assert playing.error is None, playing.error
    assert second.published == len(second_run.messages)
    assert (stats.losses, stats.orphans, stats.mismatches) == (0, 0, 0)
    check_recording(tmp_path / "rec", day, script)


def test_a_recorder_killed_mid_file_and_restarted_records_every_message_exactly_once(tmp_path: Path,
                                                                                       day: Day) -> None:
    script = make_script(day, [("KILL1", 22_000)], gap_every=151)
    out_dir = tmp_path / "rec"
    command = [sys.executable, "-m", "logbuf.cli", "record", str(out_dir), "--dir", str(tmp_path / "drv"),
               "--rows-per-file", "4000", "--row-group-rows", "300", "--commit-interval", "0.3",
               "--until-end-of-session", "--quiet"]
    processes: list[subprocess.Popen] = []
    publisher: FeedPublisher | None = None
    try:
        with launch_driver(tmp_path / "drv", liveness_s=3.0), logbuf.connect(tmp_path / "drv") as client:
            processes.append(subprocess.Popen(command))
            publisher = FeedPublisher(client)
            publisher.wait_connected()
            playing = Background(publisher.play, day, script.steps, pause_every=100, pause_s=0.004,
                                 delivered_every=20)

            def mid_file() -> bool:
                done = complete_files(out_dir, schema.MESSAGES)
                return len(done) >= 3 and any((out_dir / schema.MESSAGES).rglob("*.tmp"))

            wait_until(mid_file, what="complete files and one being written")
            processes[0].kill()  # SIGKILL: no handler, no flush, no final commit
            assert processes[0].wait(10) == -9
            in_progress = list(out_dir.rglob("*" + schema.IN_PROGRESS_SUFFIX))
            assert in_progress, "killed while a file was being written"
            # meanwhile a reader sees only complete files, each message at most once
            readable = complete_files(out_dir, schema.MESSAGES)
            assert not set(readable) & set(in_progress)
            seen = read_dataset(out_dir, schema.MESSAGES, columns=["session", "sequence"]).to_pylist()
            assert len(seen) == len({(r["session"], r["sequence"]) for r in seen}) > 0
            assert playing.thread.is_alive(), "the kill must happen mid-stream"

            processes.append(subprocess.Popen(command, stderr=subprocess.PIPE, text=True))  # resumes
            playing.join(60)
            assert playing.error is None, playing.error
            _, stderr = processes[1].communicate(timeout=60)
            assert processes[1].returncode == 0, stderr  # stops by itself at the end of the session
            assert "warning" not in stderr and "loss" not in stderr, stderr  # resumed exactly: nothing to mend
        assert publisher.published == len(script.messages)
        assert not any(p.exists() for p in in_progress), "stale .tmp files are deleted on restart"
        check_recording(out_dir, day, script)
        checkpoint = json.loads((out_dir / "_recorder_checkpoint.json").read_text())
        assert checkpoint["last_durable"] == {"session": "KILL1", "sequence": 22_000} and checkpoint["clean_stop"]
        assert not (out_dir / "_recorder_losses.jsonl").exists()
    finally:
        if publisher is not None:
            publisher.stopped.set()
        for process in processes:
            support.stop_process(process, signal.SIGKILL)


def test_a_crash_after_a_commit_that_left_a_capture_frame_partly_joined_resumes_exactly(tmp_path: Path,
                                                                                     day: Day) -> None:
    """Driven cycle by cycle: one poll batch (4096 messages) per cycle while the capture stream already holds
    the DELIVERED rows of all of them, so the commit releases capture only to the start of a partly joined
    frame and the checkpoint must say how many of its entries are recorded; then a crash and a restart."""
    script = make_script(day, [("PART", 12_000)], gap_every=113)
    delivered = np.cumsum([s.indices.size if s.kind == "deliver" else 0 for s in script.steps])
    split = int(np.searchsorted(delivered, 6_000)) + 1  # the first ~6000 messages, then the rest
    config = RecorderConfig(output=tmp_path / "rec", driver_directory=tmp_path / "drv", commit_interval_s=60,
                            max_batches_per_cycle=1)
    with logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=4 << 20, timer_interval_ns=50_000_000,
                                   client_liveness_timeout_ns=1_000_000_000), \
            logbuf.connect(tmp_path / "drv") as client:
        publisher = FeedPublisher(client)
        first = Recorder(config)
        publisher.wait_connected()
        wait_until(lambda: all(s.subscription.images for s in first.streams.values()), what="images")
        publisher.play(day, script.steps[:split], delivered_every=10_000)
        first.do_work()  # messages: one batch of 4096; capture: every DELIVERED row
        assert first.stats().messages == 0 and first.join.pending_entries > 0
        first.commit()
        capture = json.loads((tmp_path / "rec" / "_recorder_checkpoint.json").read_text())["streams"]["capture"]
        assert capture[0]["skip_entries"] > 0, capture
        assert first.client is not None
        first.client._fail(logbuf.DriverTimeout("simulated crash"))  # no final commit, no release: a crash
        first.close()
        with Recorder(RecorderConfig(**{**config.__dict__, "max_batches_per_cycle": 16})) as second:
            run = Background(second.run, until_end_of_session=True)
            publisher.play(day, script.steps[split:])  # blocked until the driver drops the dead recorder
            run.join(60)
    assert run.error is None, run.error
    stats = run.result
    assert (stats.mismatches, stats.skipped_entries, stats.orphans, stats.losses) == (0, 0, 0, 0)
    check_recording(tmp_path / "rec", day, script)


def test_a_restart_after_the_driver_dropped_the_data_is_a_reported_loss_never_a_silent_gap(tmp_path: Path,
                                                                                          day: Day) -> None:
    script = make_script(day, [("LOSS", 20_000)], end_of_session=False)
    config = RecorderConfig(output=tmp_path / "rec", driver_directory=tmp_path / "drv", commit_interval_s=0.2)
    with launch_driver(tmp_path / "drv", liveness_s=1.0), logbuf.connect(tmp_path / "drv") as client:
        publisher = FeedPublisher(client, deadline_s=20)
        # plain subscribers keep the streams going while no recorder runs
        others = [client.add_subscription("aeron:ipc", s) for s in (out.MESSAGES_STREAM, out.EVENTS_STREAM,
                                                                    out.CAPTURE_STREAM)]
        draining = threading.Event()

        def drain() -> None:
            while not draining.is_set():
                if not sum(other.poll(lambda b, h: None, 1000) for other in others):
                    time.sleep(0.001)

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        try:
            first = Recorder(config)
            run = Background(first.run)
            publisher.wait_connected()
            publisher.play(day, script.steps[:600])
            wait_until(lambda: first.stats().commits >= 2, what="a first commit")
            assert first.client is not None
            first.client._fail(logbuf.DriverTimeout("simulated crash"))  # stops heart-beating, as if killed
            run.join()
            assert isinstance(run.error, logbuf.DriverTimeout)
            first.close()
            # the driver times the dead recorder out; the publisher moves on further than the log holds
            publisher.play(day, script.steps[600:])
        finally:
            draining.set()
            drainer.join(10)
        with pytest.raises(RecorderDataLoss, match="no longer had positions"), Recorder(config) as strict:
            strict.run(duration_s=5)
        with Recorder(RecorderConfig(**{**config.__dict__, "allow_loss": True})) as lenient:
            stats = lenient.run(duration_s=0.5)
    assert stats.losses >= 1
    losses = [json.loads(line) for line in (tmp_path / "rec" / "_recorder_losses.jsonl").read_text().splitlines()]
    assert {loss["stream"] for loss in losses} >= {"messages"} and not losses[0]["while_stopped"]
    assert all(loss["end_position"] > loss["first_position"] for loss in losses if loss.get("end_position"))


def test_a_recording_has_one_recorder_at_a_time(tmp_path: Path) -> None:
    with launch_driver(tmp_path / "drv"):
        config = RecorderConfig(output=tmp_path / "rec", driver_directory=tmp_path / "drv")
        with Recorder(config), pytest.raises(RecorderError, match="another recorder"):
            Recorder(config)


def test_bad_configurations_are_refused_with_a_reason() -> None:
    with pytest.raises(RecorderConfigError, match="capture stream"):
        RecorderConfig(output="x", capture_stream=None)
    with pytest.raises(RecorderConfigError, match="must differ"):
        RecorderConfig(output="x", events_stream=1001)
    with pytest.raises(RecorderConfigError, match="printable ASCII"):
        RecorderConfig(output="x", default_session="has/slash")


def test_the_command_line_reports_usage_errors(tmp_path: Path) -> None:
    def record(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "logbuf.cli", "record", str(tmp_path / "rec"), *args],
                              capture_output=True, text=True, timeout=30)

    refused = record("--capture-stream", "none", "--dir", str(tmp_path / "nodrv"))
    assert refused.returncode == 2 and "capture stream" in refused.stderr
    both = record("--duration", "1", "--until-end-of-session")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    no_driver = record("--dir", str(tmp_path / "nodrv"), "--duration", "1", "--connect-timeout", "0.2", "-q")
    assert no_driver.returncode == 1 and "no media driver" in no_driver.stderr  # not a usage error: the driver is away
    assert len(no_driver.stderr.strip().splitlines()) == 1, no_driver.stderr  # one line, no traceback
    assert not (tmp_path / "rec").exists()  # no directory, lock or marker left behind


def test_the_record_help_shows_every_default_and_the_common_spellings() -> None:
    done = subprocess.run([sys.executable, "-m", "logbuf.cli", "record", "--help"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for option in ("-q, --quiet", "--stream ID", "--duration S", "--channel", "--commit-interval",
                   "--connect-timeout", "--rows-per-file", "--row-group-rows", "--session", "--events-stream",
                   "--capture-stream", "--allow-loss", "--until-end-of-session"):
        assert option in text, option
    assert text.count("(default") >= 13, text
    assert "--messages-stream" not in text


@pytest.mark.timeout(240)
def test_the_command_line_stops_cleanly_on_sigterm(tmp_path: Path, day: Day) -> None:
    script = make_script(day, [("TERM", 3_000)], end_of_session=False)
    # 4 MiB terms: the 3000 messages stay below the hold threshold (half the window), so no commit comes due
    # however the reads are batched (a starved recorder reads a whole window at once and would commit it), and
    # the interval is ten minutes away: what the stop must complete is every message
    with logbuf.MediaDriver.launch(tmp_path / "drv", ipc_term_length=4 << 20, timer_interval_ns=50_000_000,
                                   client_liveness_timeout_ns=10_000_000_000), \
            logbuf.connect(tmp_path / "drv") as client:
        process = subprocess.Popen([sys.executable, "-m", "logbuf.cli", "record", str(tmp_path / "rec"), "--dir",
                                    str(tmp_path / "drv"), "--commit-interval", "600"],
                                   stderr=subprocess.PIPE, text=True)
        try:
            publisher = FeedPublisher(client)
            publisher.wait_connected(timeout=120)  # a starved machine starts the recorder's process slowly
            publisher.play(day, script.steps)
            # the recorder has read every message (nothing lags) but committed none
            def all_read_none_committed() -> bool:
                counters = recorder_counters(client)
                return (counters.get("recorder: held bytes", 0) > 0 and counters.get("recorder: lag bytes") == 0
                        and counters.get("recorder: commits") == 0)

            support.wait_until(all_read_none_committed, 120, what="the recorder to read every message")
            process.terminate()
            _, stderr = process.communicate(timeout=30)
        finally:
            support.stop_process(process, signal.SIGKILL)
    assert process.returncode == 0, stderr
    assert "stopped cleanly" in stderr and "messages" in stderr
    recorded = read_dataset(tmp_path / "rec", schema.MESSAGES, columns=["sequence"]).column("sequence").to_numpy()
    assert np.array_equal(np.sort(recorded), np.arange(1, 3_001))  # the open files were completed at the stop


def test_every_error_of_the_recorder_and_the_recording_format_is_a_logbuf_error() -> None:
    from logbuf.errors import LogbufError
    from logbuf.pipeline.errors import PipelineConfigError, PipelineError
    from logbuf.pipeline.spark import JavaNotFoundError
    from logbuf.recorder.checkpoint import CheckpointError
    from logbuf.recorder.columns import MessageDecodeError

    for error in (RecorderError, RecorderDataLoss, RecorderConfigError, CheckpointError, MessageDecodeError,
                  schema.RecordingFormatError, JavaNotFoundError, PipelineError, PipelineConfigError):
        assert issubclass(error, LogbufError), error
