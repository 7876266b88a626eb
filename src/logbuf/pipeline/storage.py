"""Where ``logbuf analyze`` reads and writes: a local path or a URI of any filesystem a cluster uses.

A :class:`Location` is what the user typed, kept for Spark (which reads it through Hadoop's FileSystem:
``file://``, ``hdfs://``, ``s3a://``...), plus the same place for the driver's own small reads and writes
through ``pyarrow.fs`` (the marker, the file listing, footers, the output). The pyarrow filesystem is opened on
first use, so a URI whose client library is missing on the driver fails there, with its name, not while the
command line is parsed. ``s3a://`` (Hadoop's spelling) is ``s3://`` to pyarrow.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from logbuf.recording.schema import RecordingFormatError

_PYARROW_SCHEME = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class Location:
    """A directory given as a local path or a URI (``file://``, ``hdfs://``, ``s3a://``, ...)."""

    text: str
    scheme: str = ""  # "" for a plain local path
    _fs: list = field(default_factory=list, compare=False, repr=False)  # opened pyarrow filesystem (lazily)

    @classmethod
    def parse(cls, text: str | os.PathLike) -> Location:
        raw = os.fspath(text)
        if "://" not in raw:
            return cls(raw)
        scheme = urlparse(raw).scheme.lower()
        if not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
            raise RecordingFormatError(f"{raw!r} is not a path or a URI")
        return cls(raw.rstrip("/") if len(raw.rstrip("/")) > len(scheme) + 3 else raw, scheme)

    @property
    def is_local(self) -> bool:
        return self.scheme in ("", "file")

    @property
    def local_path(self) -> Path:
        """The directory on this machine (local paths and ``file://`` only)."""
        if self.scheme == "":
            return Path(self.text)
        if self.scheme == "file":
            return Path(urlparse(self.text).path)
        raise RecordingFormatError(f"{self.text} is not on this machine's filesystem")

    @property
    def spark_uri(self) -> str:
        """What Spark is given: the URI as typed, a local path made absolute."""
        return str(self.local_path.resolve()) if self.scheme == "" else self.text

    def _open(self) -> tuple[Any, str]:
        import pyarrow.fs as pafs

        if self.is_local:
            return pafs.LocalFileSystem(), str(self.local_path.resolve())
        if not self._fs:
            scheme = _PYARROW_SCHEME.get(self.scheme, self.scheme)
            uri = scheme + self.text[len(self.scheme):]
            try:
                fs, path = pafs.FileSystem.from_uri(uri)
            except (OSError, ValueError) as exc:
                raise RecordingFormatError(f"{self.text}: cannot open its filesystem here ({exc})") from None
            self._fs.append((fs, path))
        return self._fs[0]

    @property
    def fs(self):
        return self._open()[0]

    @property
    def path(self) -> str:
        """The directory's path inside :attr:`fs`."""
        return self._open()[1]

    def child(self, *parts: str) -> Location:
        sub = posixpath.join(*parts)
        if self.scheme == "":
            return Location(os.path.join(self.text, *parts))
        return Location(self.text.rstrip("/") + "/" + sub, self.scheme, self._fs and [
            (self._fs[0][0], posixpath.join(self._fs[0][1], sub))] or [])

    def info(self, *parts: str):
        return self.fs.get_file_info(posixpath.join(self.path, *parts) if parts else self.path)

    def is_dir(self) -> bool:
        import pyarrow.fs as pafs

        return self.info().type == pafs.FileType.Directory

    def read_text(self, *parts: str) -> str:
        with self.fs.open_input_stream(posixpath.join(self.path, *parts)) as f:
            return f.read().decode()

    def files(self, suffix: str = "") -> list[str]:
        """Every file under the directory (recursive), as paths relative to it, sorted."""
        import pyarrow.fs as pafs

        if not self.is_dir():
            return []
        base = self.path.rstrip("/")
        selector = pafs.FileSelector(base, recursive=True)
        out = [info.path[len(base) + 1:] for info in self.fs.get_file_info(selector)
               if info.type == pafs.FileType.File and info.path.endswith(suffix)]
        return sorted(out)

    def __str__(self) -> str:
        return self.text


def check_output(out: Location) -> None:
    """OUT must be a directory we can create and write in: checked before Spark starts (minutes of work
    would otherwise end in a failed write). Creates the directory."""
    import pyarrow.fs as pafs

    try:
        info = out.info()
    except OSError as exc:
        raise RecordingFormatError(f"{out}: cannot write there ({exc})") from None
    if info.type == pafs.FileType.File:
        raise RecordingFormatError(f"{out}: exists and is not a directory")
    if out.is_local:
        path = out.local_path
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".logbuf-write-check-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise RecordingFormatError(f"{out}: cannot write there ({exc.strerror or exc})") from None
        return
    try:
        out.fs.create_dir(out.path, recursive=True)
    except OSError as exc:
        raise RecordingFormatError(f"{out}: cannot create it ({exc})") from None


class Staging:
    """The output directory as the job writes it: OUT itself when local, else a local temp dir copied to OUT
    through the same filesystem layer when complete (:meth:`publish`)."""

    def __init__(self, out: Location) -> None:
        self.out = out
        self.dir = out.local_path if out.is_local else Path(tempfile.mkdtemp(prefix="logbuf-analyze-out-"))

    def publish(self) -> None:
        if self.out.is_local:
            return
        import pyarrow.fs as pafs

        try:
            pafs.copy_files(str(self.dir), self.out.path, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self.out.fs)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
