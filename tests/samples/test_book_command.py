"""``logbuf book``: ``--quiet`` prints only the final book (it once printed nothing at all)."""

from __future__ import annotations

from pathlib import Path

import pytest

import logbuf
from logbuf.cli import main

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("quiet", [True, False])
def test_book_prints_the_final_book_and_with_quiet_only_that(tmp_path: Path, quiet: bool,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with logbuf.MediaDriver.launch(tmp_path / "drv", idle_strategy="backoff:1000000") as driver:
        argv = ["book", "--dir", str(driver.directory), "--duration", "0.5", "--interval", "0.1"]
        assert main(argv + (["--quiet"] if quiet else [])) == 0
    books = [line for line in capsys.readouterr().out.splitlines() if line.startswith("seq ")]
    if quiet:
        assert books == ["seq 0  orders 0"]
    else:
        assert len(books) >= 2 and books[-1] == "seq 0  orders 0"  # periodic ones, then the final one
