"""What verify found: ``Violation``s, counted per (file, check), at most ``limit`` listed per check and file;
``RowCheck`` reports a vectorised check over a row group with the words each fault is described in."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads with the checks that call RowCheck; the CLI reads this module's defaults only
    import numpy as np

DEFAULT_LIMIT = 20  # violations listed per (file, check); the rest are counted in one summary line
DEFAULT_TOKENIZER_CHECK = 64  # input records re-tokenized with the HF tokenizer by ``verify --input``


@dataclass(frozen=True)
class Violation:
    """One broken invariant: where (file, row in that file or None) and what."""

    file: str
    row: int | None
    what: str

    def __str__(self) -> str:
        return f"{self.file}:row {self.row}: {self.what}" if self.row is not None else f"{self.file}: {self.what}"


@dataclass
class VerifyReport:
    """The outcome of ``verify_build``: violations (at most ``limit`` per check and file) and what was read."""

    violations: list[Violation] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # (file, check) -> number of violations
    shards: int = 0
    rows: int = 0
    examples: int = 0
    input_records: int | None = None  # non-blank input lines checked with ``inputs``
    tokenized: int = 0  # input records re-tokenized with the HF tokenizer and compared (tokenizer_check.py)
    limit: int = DEFAULT_LIMIT

    @property
    def ok(self) -> bool:
        return not self.counts

    @property
    def num_violations(self) -> int:
        return sum(self.counts.values())

    def add(self, file: str, row: int | None, what: str, check: str) -> None:
        self.counts[(file, check)] += 1
        if self.counts[(file, check)] <= self.limit:
            self.violations.append(Violation(file, row, what))

    def rows_bad(self, file: str, rows: np.ndarray, check: str, describe) -> None:
        """Report ``rows`` (row numbers in ``file``) failing ``check``; ``describe(i)`` for the listed ones."""
        if len(rows) == 0:
            return
        done = self.counts[(file, check)]
        for k, r in enumerate(rows.tolist()):
            if done + k >= self.limit:
                break
            self.violations.append(Violation(file, int(r), describe(k)))
        self.counts[(file, check)] += len(rows)

    def lines(self) -> list[str]:
        """Every listed violation, then one line per check whose violations were not all listed."""
        out = [str(v) for v in self.violations]
        for (file, check), n in sorted(self.counts.items()):
            if n > self.limit:
                out.append(f"{file}: ... {n - self.limit} more '{check}' violations not listed")
        return out


@dataclass(frozen=True)
class RowCheck:
    """Report failing rows of one row group: ``check(bad, name, describe)`` lists the rows where ``bad`` (R,)
    under check ``name``, each described by ``describe(i)`` (i: the row's index in the group); returns ``bad``."""

    report: VerifyReport
    file: str
    rows: np.ndarray  # (R,) row numbers in the file

    def __call__(self, bad: np.ndarray, name: str, describe: Callable[[int], str]) -> np.ndarray:
        import numpy as np

        idx = np.flatnonzero(bad)
        self.report.rows_bad(self.file, self.rows[bad], name, lambda k: describe(int(idx[k])))
        return bad
