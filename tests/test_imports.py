"""Cheap start: ``import logbuf`` and a short-lived command load only what they use.

The checks run in a child interpreter (this process has imported everything already) and look at
``sys.modules``, not at a clock: which modules load is what decides start-up time.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import logbuf

SRC = Path(__file__).resolve().parents[1] / "src"

# what a short-lived command must not pay for: the driver, the client data path, the UDP stack, numpy
HEAVY = ("logbuf.driver", "logbuf.client", "logbuf.feed", "logbuf.recorder", "logbuf.pipeline", "numpy")


def _modules_after(code: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_import_logbuf_loads_no_submodule() -> None:
    modules = _modules_after("import logbuf")
    assert [m for m in modules if m.startswith("logbuf.")] == []
    assert _heavy(modules) == []


@pytest.mark.parametrize("command", ["stat", "errors"])
def test_the_stat_and_errors_commands_load_neither_driver_nor_numpy(command: str) -> None:
    modules = _modules_after(f"from logbuf.cli import build_parser\nbuild_parser([{command!r}])")
    assert "logbuf.tools.commands" in modules  # the command's own module is there ...
    assert _heavy(modules) == []  # ... and nothing of the heavy layers


def test_a_public_name_loads_its_module_on_first_use() -> None:
    modules = _modules_after("import logbuf\nlogbuf.Position")
    assert "logbuf.position" in modules
    assert "logbuf.driver.media_driver" not in modules


def test_every_public_name_resolves_and_dir_lists_it() -> None:
    for name in logbuf.__all__:
        assert getattr(logbuf, name) is not None, name
    assert set(logbuf.__all__) <= set(dir(logbuf))
    assert "importlib" not in dir(logbuf)  # helpers of the facade are not public


def test_the_facade_hands_out_the_defining_modules_objects() -> None:
    from logbuf.driver.media_driver import MediaDriver
    from logbuf.errors import LogbufError

    assert logbuf.MediaDriver is MediaDriver
    assert logbuf.LogbufError is LogbufError


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = logbuf.no_such_name  # type: ignore[attr-defined]


def test_the_version_is_the_installed_distributions() -> None:
    assert logbuf.__version__ == importlib.metadata.version("logbuf")


def test_all_lists_exactly_the_lazy_names() -> None:
    assert sorted(logbuf.__all__) == sorted([*logbuf._EXPORTS, "__version__"])
