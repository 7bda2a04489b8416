"""Work started in a thread now and waited for later: for start-up work that the first stages need not
wait for (the release flow's MLflow run, whose store takes seconds to create in a new home).

The work's exception is raised where its result is asked for, so that it fails the run as it would have
done in the caller's thread; `settled` waits without raising, for a run that is failing anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Background(Generic[T]):
    """`work()` running in a thread of its own from construction."""

    def __init__(self, work: Callable[[], T], name: str) -> None:
        self._work = work
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for the result
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> T:
        """The work's value, once it has finished; its exception if it raised one."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set: the work returned

    def settled(self) -> T | None:
        """The work's value once it has finished, or None if it raised (never raises)."""
        self._thread.join()
        return None if self._error is not None else self._value
