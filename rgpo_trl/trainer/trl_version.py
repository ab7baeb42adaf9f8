"""The TRL versions the trainers are tested with. `RGPOTrainer` and `PPORLHFTrainer` override private
`GRPOTrainer` methods (`_compute_loss`, `_generate_and_score_completions`, `_save_checkpoint`,
`_load_optimizer_and_scheduler`, `_get_per_token_logps_and_entropies`'s callers), which TRL may change in any
release; outside the tested range they may still work, so importing them warns once instead of failing.

Where a trainer has to mirror TRL code (TRL has no hook between the pieces it needs), the tests pin a digest
of the mirrored TRL lines (`source_segment_digest`), so that a TRL release that changes them fails a test
naming the lines instead of silently diverging."""

from __future__ import annotations

import hashlib
import warnings

from packaging.version import Version

TESTED_TRL = (Version("1.16"), Version("1.17"))  # [low, high): the releases the test suite has run against


def check_trl_version(installed: str) -> bool:
    """True when ``installed`` is in the tested range; otherwise warn, naming the range (called once, at
    import)."""
    low, high = TESTED_TRL
    if low <= Version(Version(installed).base_version) < high:  # a pre-release counts as its release
        return True
    warnings.warn(
        f"rgpo-trl's trainers are tested with trl>={low},<{high}; trl {installed} is installed. They "
        "override private GRPOTrainer methods, which may have changed: run the test suite (`make test`) "
        "before relying on results.",
        UserWarning,
        stacklevel=3,
    )
    return False


def source_segment_digest(source: str, start: str, end: str) -> str:
    """16 hex digits of the SHA-256 of ``source`` from ``start`` through the first ``end`` after it, each line
    without its comment and surrounding whitespace, blank lines dropped (so that reformatting or a new
    comment in TRL does not count as a change, new code does)."""
    i = source.index(start)
    j = source.index(end, i) + len(end)
    lines = [_without_comment(line).strip() for line in source[i:j].splitlines()]
    segment = "\n".join(line for line in lines if line)
    return hashlib.sha256(segment.encode()).hexdigest()[:16]


def _without_comment(line: str) -> str:
    """``line`` up to its comment: a ``#`` outside a one-line string literal (a ``#`` inside a string is code,
    so a change after it still changes the digest)."""
    quote = None
    escaped = False
    for k, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[:k]
    return line
