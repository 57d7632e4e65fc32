"""Ctrl-C during a run: SIGINT stops the run between rows, never inside one (docs/measurement.md, "How cells are
measured", *Ctrl-C*). The runner writes each row inside :meth:`StopAfterWrites.writing`; a SIGINT arriving then
takes effect (as ``KeyboardInterrupt``) once the row is complete, and at any other time at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


class StopAfterWrites:
    """SIGINT handling that lets a row being written finish first."""

    def __init__(self) -> None:
        self._writing = False
        self._stop_requested = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around one row write: a SIGINT meanwhile raises ``KeyboardInterrupt`` right after it, once it has
        completed (a write that raises propagates its own exception)."""
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
        if self._stop_requested:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """While running: SIGINT raises ``KeyboardInterrupt``, except while a row is being written (then right
        after it). Only in the main thread (signal handlers cannot be set elsewhere); the previous handler is
        restored on exit."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            if self._writing:
                self._stop_requested = True
            else:
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
