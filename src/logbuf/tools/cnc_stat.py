"""``logbuf stat``: a snapshot of a media driver's counters (Aeron's AeronStat) as data, text and JSON.

Everything comes from the driver's ``cnc.dat`` (see ``logbuf.cnc.layout``): the header gives the CnC
version, driver pid, start time and client liveness timeout; the to-driver ring's trailer gives the
driver's heartbeat (epoch ms, stored periodically by its conductor); the counters sections give one
``(id, type id, value, label, key, registration id, …)`` per allocated counter.  Reading never writes.

Text, one header line then one line per counter (the layout AeronStat prints)::

    2026-11-22 14:23:45 - logbuf stat (CnC v0.2.0), pid 4242, heartbeat age 12 ms, up 3m05s
    ======================================================================
      0:                2,048 - Bytes sent
     40:            1,048,576 - pub-pos (sampled): 7 -1812 1001 aeron:ipc

The driver counts as *inactive* when its heartbeat is 0 (it shut down) or older than ``stale_after_ms``
(default: the client liveness timeout the driver wrote into the header, 10 s unless configured; Aeron's
clients likewise call a driver dead after 10 s without a heartbeat).
"""

from __future__ import annotations

import enum
import json
import os
import re
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from logbuf.cnc import counters as c
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.errors import CncFileError, CncNotReadyError
from logbuf.cnc.layout import version_string
from logbuf.directory import ENV_DIR
from logbuf.tools import _fmt
from logbuf.tools.counter_types import counter_type, decode_key, parse_counter_type, type_name
from logbuf.tools.exit_codes import DriverInactiveError, MissingFileError, UnusableFileError
from logbuf.units import NANOS_PER_MILLI, epoch_ms

DEFAULT_NOT_READY_WAIT_S = 1.0  # a driver writes the whole header within milliseconds of creating the file
_NOT_READY_RETRY_S = 0.01
RULE = "=" * 70

# units of counter values (``CounterSample.unit``); rates are per second of these
BYTES = "B"
NANOSECONDS = "ns"
EPOCH_MS = "epoch-ms"
STREAM_POSITION_TYPE_IDS = frozenset(
    {
        c.PUBLISHER_LIMIT_TYPE_ID,
        c.SENDER_POSITION_TYPE_ID,
        c.RECEIVER_HWM_TYPE_ID,
        c.SUBSCRIBER_POSITION_TYPE_ID,
        c.RECEIVER_POSITION_TYPE_ID,
        c.SENDER_LIMIT_TYPE_ID,
        c.PUBLISHER_POSITION_TYPE_ID,
    }
)
_S = c.SystemCounter
BYTE_SYSTEM_COUNTERS = frozenset(
    {_S.BYTES_SENT, _S.BYTES_RECEIVED, _S.BYTES_CURRENTLY_MAPPED, _S.RETRANSMITTED_BYTES}
)
NANOSECOND_SYSTEM_COUNTERS = frozenset(
    {_S.CONDUCTOR_MAX_CYCLE_TIME, _S.SENDER_MAX_CYCLE_TIME, _S.RECEIVER_MAX_CYCLE_TIME, _S.NAME_RESOLVER_MAX_TIME}
)
# where a subscriber's lag is measured from: the publication's position on this driver (IPC, or a UDP
# publication whose subscriber shares the driver), else how far the receiver has data (a network image)
LAG_PRODUCER_TYPE_IDS = (c.PUBLISHER_POSITION_TYPE_ID, c.RECEIVER_HWM_TYPE_ID)


# -- opening -----------------------------------------------------------------------------------------


def open_cnc(
    path: str | os.PathLike[str],
    not_ready_wait_s: float = DEFAULT_NOT_READY_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> CncFile:
    """Maps ``path`` (a cnc.dat) or raises a ToolError that says what is wrong, for the user.

    MissingFileError when the directory or the file is not there; UnusableFileError when the file is
    truncated, foreign, of another major CnC version, unreadable, or still version 0 (being initialised)
    after ``not_ready_wait_s``.
    """
    path = Path(path)
    directory = path.parent
    if not directory.is_dir():
        raise MissingFileError(
            f"no driver directory {directory} (choose one with --dir or ${ENV_DIR}): is the driver running?"
        )
    if not path.exists():
        raise MissingFileError(f"no {path.name} in {directory}: no driver is running there (or it shut down)")
    deadline = time.monotonic() + not_ready_wait_s
    while True:
        try:
            return CncFile.open(path)
        except CncNotReadyError as exc:
            if time.monotonic() >= deadline:
                raise UnusableFileError(f"{exc} (still so after {not_ready_wait_s:g} s)") from None
            sleep(_NOT_READY_RETRY_S)
        except CncFileError as exc:
            if not path.exists():  # the driver deleted it between our checks and the open
                raise MissingFileError(f"{path} disappeared: the driver shut down") from None
            raise UnusableFileError(f"cannot use {path}: {exc}") from None


# -- the driver, as the header and heartbeat describe it ------------------------------------------------


class DriverState(str, enum.Enum):
    ACTIVE = "active"
    STALE = "stale"  # heartbeat older than the limit: the driver died or is wedged
    SHUT_DOWN = "shut-down"  # heartbeat 0: the driver shut down (Aeron's NULL heartbeat)


@dataclass(frozen=True)
class DriverHeader:
    """cnc.dat's header fields and the driver heartbeat, read at ``time_ms`` (epoch ms)."""

    cnc_path: str
    cnc_version: int
    driver_pid: int
    start_timestamp_ms: int
    client_liveness_timeout_ns: int
    heartbeat_ms: int
    time_ms: int
    stale_after_ms: int

    @classmethod
    def read(cls, cnc: CncFile, time_ms: int, stale_after_ms: int | None = None) -> DriverHeader:
        layout = cnc.layout
        if stale_after_ms is None:
            stale_after_ms = layout.client_liveness_timeout_ns // NANOS_PER_MILLI
        return cls(
            cnc_path=str(cnc.path),
            cnc_version=layout.version,
            driver_pid=layout.pid,
            start_timestamp_ms=layout.start_timestamp_ms,
            client_liveness_timeout_ns=layout.client_liveness_timeout_ns,
            heartbeat_ms=cnc.to_driver.consumer_heartbeat_time,
            time_ms=time_ms,
            stale_after_ms=stale_after_ms,
        )

    @property
    def cnc_version_string(self) -> str:
        return version_string(self.cnc_version)

    @property
    def heartbeat_age_ms(self) -> int | None:
        """``now - heartbeat``, at least 0; None when the heartbeat is 0 (driver shut down).

        The driver may store a heartbeat after this reader took ``time_ms`` (both are epoch ms of one
        clock): such a heartbeat is fresh, age 0, not "in the future"."""
        return None if self.heartbeat_ms == 0 else max(0, self.time_ms - self.heartbeat_ms)

    @property
    def state(self) -> DriverState:
        age = self.heartbeat_age_ms
        if age is None:
            return DriverState.SHUT_DOWN
        return DriverState.STALE if age > self.stale_after_ms else DriverState.ACTIVE

    @property
    def uptime_ms(self) -> int:
        return max(0, self.time_ms - self.start_timestamp_ms)

    def inactive_reason(self) -> str | None:
        """None while the driver is active; otherwise one line for the user."""
        state = self.state
        if state is DriverState.ACTIVE:
            return None
        where = f"driver pid {self.driver_pid} ({self.cnc_path})"
        if state is DriverState.SHUT_DOWN:
            return f"{where} has shut down: its heartbeat is 0"
        age = self.heartbeat_age_ms or 0
        hint = "" if _pid_alive(self.driver_pid) is not False else "; that pid is not running"
        return (
            f"{where} is not alive: last heartbeat {_fmt.duration(age)} ago "
            f"at {_fmt.iso_ms(self.heartbeat_ms)} "
            f"(limit {_fmt.duration(self.stale_after_ms)}){hint}"
        )

    def check_active(self) -> None:
        """Raises DriverInactiveError unless the driver's heartbeat is fresh."""
        reason = self.inactive_reason()
        if reason:
            raise DriverInactiveError(reason)

    def summary(self) -> str:
        """``2026-11-22 14:23:45 - logbuf stat (CnC v0.2.0), pid 4242, heartbeat age 12 ms, up 3m05s``."""
        age = self.heartbeat_age_ms
        if age is None:
            heartbeat = "heartbeat 0 (driver shut down)"
        else:
            heartbeat = f"heartbeat age {age:,} ms"
            if age >= 1_000:
                heartbeat += f" ({_fmt.duration(age)})"
            if self.state is DriverState.STALE:
                heartbeat += f" STALE > {self.stale_after_ms:,} ms"
        return (
            f"{_fmt.wall_time(self.time_ms)} - logbuf stat (CnC v{self.cnc_version_string}), "
            f"pid {self.driver_pid}, {heartbeat}, up {_fmt.duration(self.uptime_ms)}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "time_ms": self.time_ms,
            "time": _fmt.iso_ms(self.time_ms),
            "cnc_path": self.cnc_path,
            "cnc_version": self.cnc_version,
            "cnc_version_string": self.cnc_version_string,
            "driver_pid": self.driver_pid,
            "driver_start_ms": self.start_timestamp_ms,
            "driver_start": _fmt.iso_ms(self.start_timestamp_ms),
            "uptime_ms": self.uptime_ms,
            "heartbeat_ms": self.heartbeat_ms,
            "heartbeat_age_ms": self.heartbeat_age_ms,
            "stale_after_ms": self.stale_after_ms,
            "client_liveness_timeout_ns": self.client_liveness_timeout_ns,
            "driver_state": self.state.value,
        }


def _pid_alive(pid: int) -> bool | None:
    """True/False when this process can tell (same pid namespace), None when it cannot."""
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    except (OverflowError, OSError):
        return None
    return True


# -- counters ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterSample:
    """One allocated counter, copied out of shared memory."""

    counter_id: int
    type_id: int
    value: int
    label: str
    registration_id: int
    owner_id: int
    reference_id: int
    key: bytes

    @property
    def type_name(self) -> str:
        return type_name(self.type_id)

    @property
    def key_fields(self) -> dict[str, object]:
        return decode_key(self.type_id, self.key)

    @property
    def value_is_epoch_ms(self) -> bool:
        known = counter_type(self.type_id)
        return bool(known and known.value_is_epoch_ms)

    @property
    def unit(self) -> str:
        """What the value counts: ``B`` (bytes: stream positions, Bytes sent/received/mapped), ``ns``
        (cycle times), ``epoch-ms`` (a timestamp, e.g. a client heartbeat) or ``""`` (events)."""
        if self.value_is_epoch_ms:
            return EPOCH_MS
        if self.type_id in STREAM_POSITION_TYPE_IDS:
            return BYTES
        if self.type_id == c.SYSTEM_COUNTER_TYPE_ID:
            system_id = self.key_fields.get("system_counter_id")
            if system_id in BYTE_SYSTEM_COUNTERS:
                return BYTES
            if system_id in NANOSECOND_SYSTEM_COUNTERS:
                return NANOSECONDS
        return ""

    def age_ms(self, time_ms: int) -> int | None:
        """For a timestamp counter: how long ago it was set (at least 0); None if unset or not a timestamp."""
        if not self.value_is_epoch_ms or self.value == 0:
            return None
        return max(0, time_ms - self.value)

    def to_dict(self, time_ms: int | None = None) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.counter_id,
            "type_id": self.type_id,
            "type": self.type_name,
            "value": self.value,
            "label": self.label,
            "registration_id": self.registration_id,
            "owner_id": self.owner_id,
            "reference_id": self.reference_id,
            "key": self.key_fields,
        }
        if not out["key"] and any(self.key):
            out["key_hex"] = self.key.rstrip(b"\0").hex()
        out["unit"] = self.unit
        if self.value_is_epoch_ms and time_ms is not None:
            out["age_ms"] = self.age_ms(time_ms)
        return out


@dataclass(frozen=True)
class CounterFilter:
    """Which counters to show: any of ``type_ids`` (all when None) and a label matching ``label`` (search)."""

    type_ids: frozenset[int] | None = None
    label: re.Pattern[str] | None = None

    @classmethod
    def parse(cls, types: Iterable[str] | None = None, label: str | None = None) -> CounterFilter:
        """From command-line text: type ids or names (comma-separated allowed) and a regular expression.

        Raises ValueError for an unknown type name or a bad expression.
        """
        type_ids = None
        if types:
            type_ids = frozenset(
                parse_counter_type(t) for text in types for t in text.split(",") if t.strip()
            )
        pattern = None
        if label is not None:
            try:
                pattern = re.compile(label)
            except re.error as exc:
                raise ValueError(f"bad --label expression {label!r}: {exc}") from None
        return cls(type_ids, pattern)

    def __call__(self, sample: CounterSample) -> bool:
        if self.type_ids is not None and sample.type_id not in self.type_ids:
            return False
        return self.label is None or self.label.search(sample.label) is not None


@dataclass(frozen=True)
class StreamLag:
    """How far one subscriber position is behind the stream's producer position on this driver.

    ``lag = producer_position - subscriber_position`` in bytes, at least 0 (pub-pos is *sampled* by the
    driver, so it may trail a subscriber that has read everything).  The producer is the stream's
    ``pub-pos`` when the publication is on this driver, else the image's ``rcv-hwm``.
    """

    session_id: int
    stream_id: int
    channel: str
    subscriber_counter_id: int
    subscriber_registration_id: int
    subscriber_position: int
    producer_type: str  # "pub-pos" or "rcv-hwm"
    producer_counter_id: int
    producer_position: int

    @property
    def lag(self) -> int:
        return max(0, self.producer_position - self.subscriber_position)

    def to_dict(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "stream_id": self.stream_id,
            "channel": self.channel,
            "subscriber_counter_id": self.subscriber_counter_id,
            "subscriber_registration_id": self.subscriber_registration_id,
            "subscriber_position": self.subscriber_position,
            "producer_type": self.producer_type,
            "producer_counter_id": self.producer_counter_id,
            "producer_position": self.producer_position,
            "lag_bytes": self.lag,
        }


@dataclass(frozen=True)
class StatSnapshot:
    """The driver header and every allocated counter at one instant."""

    header: DriverHeader
    counters: tuple[CounterSample, ...]

    def select(self, keep: Callable[[CounterSample], bool]) -> StatSnapshot:
        return replace(self, counters=tuple(s for s in self.counters if keep(s)))

    def find(
        self, label: str | re.Pattern[str] | None = None, type_id: int | None = None
    ) -> list[CounterSample]:
        """Counters of ``type_id`` whose label equals ``label`` (a str) or matches it (a compiled pattern)."""

        def keep(s: CounterSample) -> bool:
            if type_id is not None and s.type_id != type_id:
                return False
            if label is None:
                return True
            return s.label == label if isinstance(label, str) else label.search(s.label) is not None

        return [s for s in self.counters if keep(s)]

    def value(self, label: str) -> int:
        """The value of the counter labelled exactly ``label``; KeyError if none (ValueError if several)."""
        found = self.find(label)
        if not found:
            raise KeyError(label)
        if len(found) > 1:
            raise ValueError(f"{len(found)} counters are labelled {label!r}")
        return found[0].value

    def system_counter(self, system_id: int) -> int | None:
        """The value of Aeron system counter ``system_id`` (19: Unblocked Publications), None if absent."""
        for s in self.counters:
            if s.type_id == 0 and s.key_fields.get("system_counter_id") == system_id:
                return s.value
        return None

    def stream_lags(self) -> list[StreamLag]:
        """One ``StreamLag`` per subscriber position (``sub-pos``) whose stream has a producer position here,
        in counter order."""
        producers: dict[tuple[int, int], CounterSample] = {}
        for type_id in reversed(LAG_PRODUCER_TYPE_IDS):  # the preferred producer type is written last
            for s in self.counters:
                key = _stream_key(s) if s.type_id == type_id else None
                if key is not None:
                    producers[(key[1], key[2])] = s
        lags = []
        for s in self.counters:
            key = _stream_key(s) if s.type_id == c.SUBSCRIBER_POSITION_TYPE_ID else None
            if key is None:
                continue
            registration_id, session_id, stream_id, channel = key
            producer = producers.get((session_id, stream_id))
            if producer is None:
                continue
            lags.append(
                StreamLag(
                    session_id=session_id,
                    stream_id=stream_id,
                    channel=channel,
                    subscriber_counter_id=s.counter_id,
                    subscriber_registration_id=registration_id,
                    subscriber_position=s.value,
                    producer_type=producer.type_name,
                    producer_counter_id=producer.counter_id,
                    producer_position=producer.value,
                )
            )
        return lags

    def to_dict(
        self, rates: Mapping[int, float] | None = None, lags: Iterable[StreamLag] | None = None
    ) -> dict[str, object]:
        """The header fields, every counter (with ``unit``, ``age_ms`` for timestamps, ``rate_per_s`` when
        ``rates`` are given) and ``streams``: the subscriber lags (``stream_lags()`` unless given)."""
        out = self.header.to_dict()
        counters = []
        for s in self.counters:
            item = s.to_dict(self.header.time_ms)
            if rates is not None:
                item["rate_per_s"] = rates.get(s.counter_id)
            counters.append(item)
        out["counters"] = counters
        out["streams"] = [lag.to_dict() for lag in (self.stream_lags() if lags is None else lags)]
        return out

    def to_json(
        self,
        indent: int | None = None,
        rates: Mapping[int, float] | None = None,
        lags: Iterable[StreamLag] | None = None,
    ) -> str:
        return json.dumps(self.to_dict(rates, lags), indent=indent)


def _stream_key(sample: CounterSample) -> tuple[int, int, int, str] | None:
    """(registration id, session id, stream id, channel) of a stream-position counter; None if its key is
    not one (shared memory: a short or odd key must not break a listing)."""
    try:
        return c.decode_stream_position_key(sample.key)
    except (ValueError, struct.error):
        return None


# -- reading -------------------------------------------------------------------------------------------


def read_snapshot(cnc: CncFile, time_ms: int, stale_after_ms: int | None = None) -> StatSnapshot:
    """Copies the counters and header out of an open cnc.dat."""
    counters = tuple(
        CounterSample(
            counter_id=info.counter_id,
            type_id=info.type_id,
            value=info.value,
            label=info.label,
            registration_id=info.registration_id,
            owner_id=info.owner_id,
            reference_id=info.reference_id,
            key=info.key,
        )
        for info in cnc.counters_reader()
    )
    return StatSnapshot(DriverHeader.read(cnc, time_ms, stale_after_ms), counters)


class CncStatSource:
    """Snapshots of one cnc.dat path, kept mapped between reads (``--watch``).

    A driver that restarts replaces cnc.dat (unlink + create): the source notices the new inode and maps
    the new file; while there is no file each ``read`` raises MissingFileError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        stale_after_ms: int | None = None,
        clock_ms: Callable[[], int] = epoch_ms,
        not_ready_wait_s: float = DEFAULT_NOT_READY_WAIT_S,
    ) -> None:
        self.path = Path(path)
        self.stale_after_ms = stale_after_ms
        self._clock_ms = clock_ms
        self._not_ready_wait_s = not_ready_wait_s
        self._cnc: CncFile | None = None
        self._identity: tuple[int, int] | None = None

    def read(self) -> StatSnapshot:
        try:
            st = os.stat(self.path)
            identity: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            identity = None
        if self._cnc is not None and identity != self._identity:
            self.close()
        if self._cnc is None:
            self._cnc = open_cnc(self.path, self._not_ready_wait_s)
            self._identity = identity
        return read_snapshot(self._cnc, self._clock_ms(), self.stale_after_ms)

    def close(self) -> None:
        if self._cnc is not None:
            self._cnc.close()
        self._cnc = None
        self._identity = None

    def __enter__(self) -> CncStatSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_stat(
    cnc_path: str | os.PathLike[str],
    *,
    stale_after_ms: int | None = None,
    clock_ms: Callable[[], int] = epoch_ms,
    not_ready_wait_s: float = DEFAULT_NOT_READY_WAIT_S,
) -> StatSnapshot:
    """One snapshot of the counters in ``cnc_path``; liveness is not checked (``header.check_active()`` does).

    Raises MissingFileError / UnusableFileError (``ToolError``s with the CLI's exit codes).
    """
    with CncStatSource(
        cnc_path, stale_after_ms=stale_after_ms, clock_ms=clock_ms, not_ready_wait_s=not_ready_wait_s
    ) as source:
        return source.read()


# -- text ----------------------------------------------------------------------------------------------


def format_counter(sample: CounterSample, rate_text: str | None = None) -> str:
    """``%3d: %,20d - label`` (AeronStat's line), with a rate column between value and label if given."""
    if rate_text is None:
        return f"{sample.counter_id:3d}: {sample.value:20,d} - {sample.label}"
    return f"{sample.counter_id:3d}: {sample.value:20,d} {rate_text:>{RATE_WIDTH}} - {sample.label}"


RATE_WIDTH = 12  # "+999 MB/s", "age 12.3 s", "age 23h59m"


def rate_or_age(sample: CounterSample, per_s: float | None, time_ms: int) -> str:
    """The extra column of the detailed view: a timestamp's age, a changed counter's rate with its unit,
    or blank (unchanged, or no earlier snapshot)."""
    if sample.value_is_epoch_ms:
        age = sample.age_ms(time_ms)
        return "" if age is None else _fmt.age(age)
    return _fmt.rate(per_s, sample.unit) if per_s else ""


def format_lags(lags: Iterable[StreamLag]) -> list[str]:
    """The streams section: one line per subscriber position, its lag behind the stream's producer."""
    lags = list(lags)
    if not lags:
        return []
    lines = [
        RULE,
        "lag = producer position - subscriber position (producer: pub-pos, or rcv-hwm for a network image)",
        f"{'session':>11} {'stream':>8} {'sub':>4} {'producer':>8} {'position':>18} {'sub-pos':>18} "
        f"{'lag':>15}  channel",
    ]
    for lag in lags:
        lines.append(
            f"{lag.session_id:11d} {lag.stream_id:8d} {lag.subscriber_counter_id:4d} {lag.producer_type:>8} "
            f"{lag.producer_position:18,d} {lag.subscriber_position:18,d} {lag.lag:13,d} B  {lag.channel}"
        )
    return lines


def format_stat(
    snapshot: StatSnapshot,
    rates: Mapping[int, float] | None = None,
    *,
    details: bool = False,
    lags: Iterable[StreamLag] | None = None,
) -> str:
    """The header line, a rule, and one line per counter, exactly as AeronStat lays them out.

    ``details`` (the ``--watch`` view) adds a column with each counter's rate and unit
    (``rates``: counter id -> per second; blank when unchanged) or, for a timestamp, its age, and the
    streams section with each subscriber's lag (``lags``, default ``snapshot.stream_lags()``).
    """
    lines = [snapshot.header.summary(), RULE]
    if not details:
        lines.extend(format_counter(sample) for sample in snapshot.counters)
        return "\n".join(lines) + "\n"
    rates = rates or {}
    time_ms = snapshot.header.time_ms
    for sample in snapshot.counters:
        lines.append(format_counter(sample, rate_or_age(sample, rates.get(sample.counter_id), time_ms)))
    lines.extend(format_lags(snapshot.stream_lags() if lags is None else lags))
    return "\n".join(lines) + "\n"
