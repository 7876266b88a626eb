"""What the tests share: waiting with a timeout, stopping processes by PID, reading a child's lines without
losing one, tshark, network namespaces; and test-only tools (``support.pcap``, ``support.arbsim``).

Importable as ``support`` from any test (pytest puts ``tests/`` on ``sys.path`` for the root conftest); a
child script run from a subdirectory puts ``tests/`` on its path first.
"""

from support.drivers import running_driver
from support.lines import LineReader, LineSplitter, lines_of
from support.netns import in_namespace, network_namespace
from support.processes import ROOT, SRC, child_env, stop_process
from support.tshark import require_tool
from support.waiting import WaitTimeout, wait_until

__all__ = [
    "ROOT", "SRC", "LineReader", "LineSplitter", "WaitTimeout", "child_env", "in_namespace", "lines_of",
    "network_namespace", "require_tool", "running_driver", "stop_process", "wait_until",
]
