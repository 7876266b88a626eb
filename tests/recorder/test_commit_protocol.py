"""When the commit protocol says a commit is due (``CommitProtocol.reason``), with stand-in images."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from logbuf.recorder.commit import CommitProtocol
from logbuf.recorder.join import DeliveryJoin
from logbuf.recorder.losses import LossReport
from logbuf.recorder.streams import CAPTURE, MESSAGES, RecordedImage

TERM = 64 * 1024


class FinishedImage:
    """A stand-in for an image whose publisher finished at ``end`` and which the recorder read to the end."""

    def __init__(self, session_id: int, end: int) -> None:
        self.session_id = session_id
        self.join_position = 0
        self.position = end
        self.term_length = TERM
        self.is_closed = False
        self.log = SimpleNamespace(publication_window_length=TERM // 2, end_of_stream_position=end)

    def is_end_of_stream(self) -> bool:
        return True


def protocol(tmp_path: Path, streams: dict[str, Any]) -> CommitProtocol:
    writer = SimpleNamespace(has_sealed=False, has_open=False)
    commits = CommitProtocol(tmp_path, writer, sink=None, join=DeliveryJoin(), checkpoint=None,  # type: ignore[arg-type]
                             interval_s=3600.0, losses=LossReport(tmp_path, allow_loss=False))
    commits.streams = streams  # type: ignore[assignment]
    return commits


def test_an_image_released_to_its_end_before_its_end_was_seen_still_gets_a_commit_that_ends_it(
        tmp_path: Path) -> None:
    # The last commit released every byte of the first capture image, but its publisher's end of stream was only
    # seen afterwards: no bytes are left to release, yet only a commit marks the image ended — and the next
    # capture image (whose DELIVERED rows the messages stream waits for) is adopted only after that.
    capture = RecordedImage(FinishedImage(11, end=4096))  # type: ignore[arg-type]
    capture.processed = capture.released = 4096
    streams = {CAPTURE: SimpleNamespace(active=capture, stream_id=3)}
    commits = protocol(tmp_path, streams)
    assert commits.reason(has_staged=False) == "end of stream"
    plan = commits.release_plan()
    assert plan[CAPTURE][1].ended


def test_no_commit_is_due_once_a_finished_image_is_marked_ended(tmp_path: Path) -> None:
    messages = RecordedImage(FinishedImage(12, end=2048))  # type: ignore[arg-type]
    messages.processed = messages.released = 2048
    messages.ended = True
    commits = protocol(tmp_path, {MESSAGES: SimpleNamespace(active=messages, stream_id=1)})
    assert commits.reason(has_staged=False) is None
