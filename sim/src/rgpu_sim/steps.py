"""A command that waits without saying so looks hung: starting the stack takes 10 s to a
minute on a busy machine, a soak's drain and checks half a minute. ``Steps`` says what is
being waited for. On a terminal it is one live line with a spinner and the seconds so far,
and each finished step leaves a line with its time; piped, each step is one plain line when it
begins, so a log shows where a run spent its time without a terminal's redraws."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["PIPED_EVERY", "Steps"]

PIPED_EVERY = 10.0
"""Seconds between progress lines when the output is not a terminal."""


class Steps:
    """The current step of a command; ``steps("waiting for x")`` ends the previous one."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._live: Progress | None = None
        self._task: TaskID | None = None
        self._step = ""
        self._since = 0.0
        self._printed = 0.0

    def __enter__(self) -> Steps:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.pause()

    def __call__(self, step: str) -> None:
        """Begin ``step`` (ending the one before)."""
        self.done()
        self._step, self._since = step, time.monotonic()
        if self._console.is_terminal:
            if self._live is None:
                self._live = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    TimeElapsedColumn(),
                    console=self._console,
                    transient=True,
                )
                self._live.start()
            self._task = self._live.add_task(step, total=None)
        else:
            self._console.print(f"{step} …", highlight=False, soft_wrap=True)

    def update(self, text: str) -> None:
        """Say how the current step is going: the live line on a terminal; piped, a line at
        most every ``PIPED_EVERY`` seconds, so a long step neither floods a log nor is silent."""
        if self._live is not None and self._task is not None:
            self._live.update(self._task, description=text)
            return
        now = time.monotonic()
        if now - self._printed >= PIPED_EVERY:
            self._printed = now
            self._console.print(text, highlight=False, soft_wrap=True)

    def done(self) -> None:
        """End the current step; on a terminal it stays as a line with its time."""
        if not self._step:
            return
        took = time.monotonic() - self._since
        if self._live is not None and self._task is not None:
            self._live.remove_task(self._task)
            self._live.console.print(f"[dim]{self._step} ({took:.1f}s)[/]", highlight=False)
            self._task = None
        self._step = ""

    def pause(self) -> None:
        """End the current step and give the terminal back (another live display may follow;
        the next step takes it again)."""
        self.done()
        if self._live is not None:
            self._live.stop()
            self._live = None
