"""One-line errors for the command lines (the recipe, the MuJoCo scripts): a bad input exits with one line
that names the field and the allowed values, not a traceback. ``--debug`` (or ``RGPO_TRL_DEBUG=1``) shows the
traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

DEBUG_FLAG = "--debug"


class UsageError(ValueError):
    """A bad command-line or configuration input, reported as one line."""


def debug_requested(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    return DEBUG_FLAG in argv or os.environ.get("RGPO_TRL_DEBUG", "") not in ("", "0")


def run_main(main: Callable[[], object], errors: tuple[type[BaseException], ...] = (UsageError,)) -> int:
    """Run ``main()`` with ``--debug`` taken out of ``sys.argv``; an exception of ``errors`` prints ``error:
    <its message on one line>`` to stderr and returns 2 (re-raised with ``--debug``); 0 otherwise."""
    debug = debug_requested()
    while DEBUG_FLAG in sys.argv:
        sys.argv.remove(DEBUG_FLAG)
    try:
        main()
    except errors as err:
        if debug:
            raise
        print(f"error: {' '.join(str(err).split())} ({DEBUG_FLAG} shows the traceback)", file=sys.stderr)
        return 2
    return 0


def quiet_cpu_libraries() -> None:
    """Two notices a CPU run of the recipe or the asset builder would print with nothing to act on, handled at
    their source or filtered narrowly: DeepSpeed's "Setting accelerator to CPU" (it is told the accelerator
    instead of guessing, only where torch sees no GPU) and transformers' FutureWarning that TRL's configs
    still default ``gradient_checkpointing`` (the deprecated alias, carried over to
    ``activation_checkpointing``)."""
    import warnings

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    warnings.filterwarnings(
        "ignore", message=r"`gradient_checkpointing` is deprecated", category=FutureWarning
    )


def plain_output_when_piped() -> bool:
    """When stdout is not a terminal (a log file, CI), turn off the Hugging Face progress bars, which would
    glue carriage-return frames to the log lines; returns whether it did."""
    if sys.stdout.isatty():
        return False
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets
        import huggingface_hub

        datasets.disable_progress_bars()
        huggingface_hub.utils.disable_progress_bars()
    except ImportError:  # optional here
        pass
    return True
