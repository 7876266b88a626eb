"""Options of ``logbuf analyze`` (no pyspark / pyarrow import: the CLI parser is built from this)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from logbuf.cli_args import count
from logbuf.pipeline.errors import PipelineConfigError
from logbuf.pipeline.freezes import FreezeParams
from logbuf.pipeline.host import DEFAULT_LATE_THRESHOLD_NS, late_warnings, read_summaries
from logbuf.pipeline.quantiles import DEFAULT_MAX_COLLECT
from logbuf.units import NANOS_PER_MILLI, NANOS_PER_SECOND

DEFAULT_PERCENTILES = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0)
DEFAULT_BUCKET_SIZE = 1 << 16
READERS = ("auto", "arrow", "spark")  # sequences per bucket of the sequence space


@dataclass(frozen=True)
class AnalyzeConfig:
    session: str | None = None
    window_ns: int | None = None  # None: about 1000 windows over the recording
    bucket_size: int = DEFAULT_BUCKET_SIZE
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    freeze: FreezeParams = field(default_factory=FreezeParams)
    top_symbols: int = 20
    max_collect: int = DEFAULT_MAX_COLLECT
    sequence_partitions: int | None = None  # None: ~4 M messages per partition, at least 2 per core
    plots: bool = True
    cache_packets: bool | None = None  # persist the projected packets; None: when the recording is remote
    reader: str = "auto"  # arrow: row groups read by pyarrow in the tasks; spark: Spark's reader; auto: by path
    host_warnings: tuple[str, ...] = ()  # the producing processes ran late (pipeline.host): shown in the report

    def __post_init__(self) -> None:
        if self.window_ns is not None and self.window_ns <= 0:
            raise PipelineConfigError("window must be positive")
        if self.bucket_size < 1024:
            raise PipelineConfigError("bucket_size must be >= 1024")
        if self.reader not in READERS:
            raise PipelineConfigError(f"reader must be one of {', '.join(READERS)}")
        if self.top_symbols < 1:
            raise PipelineConfigError("top_symbols must be >= 1")
        for q in self.percentiles:
            if not 0.0 <= q <= 1.0:
                raise PipelineConfigError(f"percentile fraction {q} must be within [0, 1]")


def _duration_ns(text: str) -> int:
    """``250ms``, ``1s``, ``2.5s``, ``500us``, ``100000ns``."""
    raw = text.strip().lower()
    units = {"ns": 1, "us": 1_000, "ms": NANOS_PER_MILLI, "s": NANOS_PER_SECOND, "m": 60 * NANOS_PER_SECOND}
    unit = next((u for u in ("ns", "us", "ms", "s", "m") if raw.endswith(u)), None)
    if unit is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a unit: ns, us, ms, s or m (e.g. 250ms)")
    try:
        value = float(raw[: -len(unit)]) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 250ms, 1s)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return int(value)


def _percentiles(text: str) -> tuple[float, ...]:
    """``50,99,99.9`` -> (0.5, 0.99, 0.999), divided in decimal (99.9 / 100 in floats is 0.9990000000000001)."""
    try:
        values = tuple(float(Decimal(v.strip()) / 100) for v in text.split(",") if v.strip())
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r}: give percentiles like 50,99,99.9") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError("percentiles must be within 0..100")
    return values


def _conf(text: str) -> tuple[str, str]:
    """``KEY=VALUE``: a Spark setting passed through as is (e.g. spark.eventLog.enabled=true)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not key.startswith("spark."):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Spark setting KEY=VALUE (a key starting with spark.)")
    return key.strip(), value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recording", help="recording directory: a path or a URI Spark reads (file://, hdfs://, "
                                     "s3a://); written by logbuf record or logbuf scenario")
    p.add_argument("out", help="output directory for tables/, plots/, report.md, summary.json: a path or a URI "
                               "(file://, hdfs://, s3a://); created if missing, checked before Spark starts")
    p.add_argument("--master", default=None,
                   help="Spark master (default: local[*]; under spark-submit, the one it was given)")
    p.add_argument("--session", default=None,
                   help="MoldUDP64 session to analyse (default: the recording's only one; needed if several)")
    p.add_argument("--driver-memory", default="2g",
                   help="Spark driver heap; in local mode the whole heap (default: %(default)s)")
    p.add_argument("--conf", type=_conf, action="append", default=None, metavar="KEY=VALUE",
                   help="a Spark setting, passed through (repeatable), e.g. --conf spark.eventLog.enabled=true "
                        "(default: none)")
    p.add_argument("--shuffle-partitions", type=count, default=None, metavar="N",
                   help="Spark shuffle partitions (default: from the cores, coalesced by adaptive execution)")
    p.add_argument("--window", type=_duration_ns, default=None, metavar="DURATION",
                   help="time-series window, e.g. 250ms (default: at most 1500 windows from the first to the "
                        "last arrival, 100ms or longer)")
    p.add_argument("--percentiles", type=_percentiles, default=None, metavar="P,P,...",
                   help="delay percentiles, exact nearest rank (default: "
                        f"{','.join(f'{q * 100:g}' for q in DEFAULT_PERCENTILES)})")
    p.add_argument("--min-silence", type=_duration_ns, default=FreezeParams.min_silence_ns, metavar="DURATION",
                   help="shortest silence that can be a freeze (default 50ms)")
    p.add_argument("--min-lead", type=_duration_ns, default=FreezeParams.min_lead_ns, metavar="DURATION",
                   help="the other feed must have sent newer data this long before the resume (default 20ms)")
    p.add_argument("--max-freezes", type=count, default=FreezeParams.max_freezes, metavar="N",
                   help="freeze candidates examined, the strongest first (default: %(default)s)")
    p.add_argument("--top-symbols", type=count, default=20, metavar="N",
                   help="most active symbols to list (default: %(default)s)")
    p.add_argument("--host-summary", action="append", default=None, metavar="FILE",
                   help="summary JSON of the replay or feed handler that produced the recording (--summary-json; "
                        "repeatable): the report warns when either ran later than --late-threshold (default: none)")
    p.add_argument("--late-threshold", type=_duration_ns, default=DEFAULT_LATE_THRESHOLD_NS, metavar="DURATION",
                   help="how late the replay or handler may run before the report warns that delays reflect the "
                        "host (default 50ms)")
    p.add_argument("--cache-packets", choices=("auto", "yes", "no"), default="auto",
                   help="persist the projected packets for the later stages: yes, no, or auto = only when the "
                        "recording is not on a local disk (default: %(default)s)")
    p.add_argument("--reader", choices=READERS, default="auto",
                   help="arrow: each Spark task reads its Parquet row groups itself with pyarrow (every worker "
                        "must reach the files); spark: Spark's own Parquet reader (any filesystem Spark reads); "
                        "auto = arrow for a local path, spark otherwise (default: %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="tables and report only (default: draw the plots)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary (default: off)")


def config_from_args(args: argparse.Namespace) -> AnalyzeConfig:
    freeze = FreezeParams(min_silence_ns=args.min_silence, min_lead_ns=args.min_lead,
                          max_freezes=getattr(args, "max_freezes", FreezeParams.max_freezes))
    summaries = read_summaries(getattr(args, "host_summary", None) or [])
    warnings = late_warnings(summaries, getattr(args, "late_threshold", DEFAULT_LATE_THRESHOLD_NS))
    return AnalyzeConfig(session=args.session, window_ns=args.window, freeze=freeze,
                         percentiles=args.percentiles or DEFAULT_PERCENTILES, top_symbols=args.top_symbols,
                         plots=not args.no_plots, host_warnings=tuple(warnings),
                         cache_packets={"yes": True, "no": False}.get(getattr(args, "cache_packets", "auto")),
                         reader=getattr(args, "reader", "auto"))


