"""A rank's report to the launcher: its result (or error) serialised and framed
on its own pipe, and read by the launcher as the bytes arrive.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any


def serialize(value: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def deserialize(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


#: a rank's report on its pipe: the pickle's length, then the pickle
_REPORT_HEADER = struct.Struct("!Q")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send_report(outcome: Connection, report: tuple[bool, Any]) -> None:
    """Writes this rank's report to the launcher (framed by `ReportReader`)."""
    data = pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)
    _write_all(outcome.fileno(), _REPORT_HEADER.pack(len(data)) + data)


class ReportReader:
    """One rank's report, read as its bytes arrive and never waiting for
    more: a rank stopped (SIGSTOP, a debugger) half-way through writing a
    result larger than the pipe holds cannot keep the launcher past its
    timeout. (`Connection.recv` reads a whole message or waits.)"""

    def __init__(self, connection: Connection):
        self.connection = connection
        os.set_blocking(connection.fileno(), False)
        self._data = bytearray()

    def read(self) -> tuple[bool, Any] | None:
        """The report once complete, None while it is not; EOFError when
        the rank closed its end (it ended) before a whole report."""
        fd = self.connection.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                raise EOFError
            self._data += chunk
            report = self._complete()
            if report is not None:
                return report
        return self._complete()

    def _complete(self) -> tuple[bool, Any] | None:
        if len(self._data) < _REPORT_HEADER.size:
            return None
        (size,) = _REPORT_HEADER.unpack_from(self._data)
        if len(self._data) < _REPORT_HEADER.size + size:
            return None
        return pickle.loads(self._data[_REPORT_HEADER.size : _REPORT_HEADER.size + size])


def finished_results(outcomes: Mapping[int, tuple[bool, Any]]) -> dict[int, Any]:
    return {r: deserialize(outcome[1]) for r, outcome in outcomes.items() if outcome[0]}
