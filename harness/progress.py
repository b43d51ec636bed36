"""Progress of long evaluations: one bar redrawn in place on a terminal, one line per step in a log.

Each step (an STS task, a transfer task) has a weight (its sentences, its fits); the time left is the
seconds spent so far per unit of weight done, times the weight still to do. On a terminal the bar is
redrawn as each step ends; in a log (stderr is not a terminal) each step ends with one line, so a
log shows where an evaluation is and how long it has left.
"""
from __future__ import annotations

import sys
import time
from typing import IO


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


class Progress:
    """``Progress(what, weights)``; ``done(step, note)`` when a step ends; ``close()`` at the end.

    Args:
        what: the work's name, at the start of each line ("STS", "transfer").
        weights: step name -> its share of the work (sentences to encode, fits to run).
        stream: where to write (stderr by default, so stdout keeps the results).
        bar: redraw one bar in place; None = when ``stream`` is a terminal.
    """

    def __init__(self, what: str, weights: dict[str, float], stream: IO[str] | None = None,
                 bar: bool | None = None) -> None:
        self.what = what
        self.weights = dict(weights)
        self.total = sum(self.weights.values()) or 1.0
        self.stream = stream if stream is not None else sys.stderr
        self.bar = self.stream.isatty() if bar is None else bar
        self.start = time.perf_counter()
        self.finished = 0.0
        self.steps: list[str] = []

    def left(self) -> float | None:
        """Seconds left at the rate so far; None before the first step ends."""
        if self.finished <= 0:
            return None
        spent = time.perf_counter() - self.start
        return spent / self.finished * (self.total - self.finished)

    def begin(self, note: str) -> None:
        """One line before the first step starts, so that a long first step is not silence."""
        self.stream.write(f"{self.what}: {note}\n")
        self.stream.flush()

    def done(self, step: str, note: str = "") -> None:
        self.finished += self.weights.get(step, 0.0)
        self.steps.append(step)
        spent = time.perf_counter() - self.start
        left = self.left() or 0.0
        count = f"{len(self.steps)}/{len(self.weights)}"
        if self.bar:
            width = 24
            filled = int(width * self.finished / self.total)
            line = (f"\r{self.what} [{'#' * filled}{'.' * (width - filled)}] {count} {step}"
                    f" {note} | {_clock(spent)} spent, about {_clock(left)} left")
            self.stream.write(line.ljust(100))
        else:
            self.stream.write(f"{self.what} {count} {step}: {note}{'; ' if note else ''}{_clock(spent)} spent, "
                              f"about {_clock(left)} left\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar and self.steps:
            self.stream.write("\n")
            self.stream.flush()

