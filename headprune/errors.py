"""Errors a user can cause. Each message names the problem and what is accepted."""


class HeadpruneError(Exception):
    """Base class: bad input from a user (file, model, mask, parameter)."""


class UnsupportedArchitecture(HeadpruneError):
    pass


class ModelLoadError(HeadpruneError):
    pass


class DataError(HeadpruneError):
    pass


class UntrainedHeadError(HeadpruneError):
    """A model whose task head was newly initialised on load (a base or masked-LM checkpoint read as a
    classifier): its scores and pruning decisions would be noise."""


class MaskError(HeadpruneError):
    pass


class CriterionError(HeadpruneError):
    pass


class DeviceError(HeadpruneError):
    pass


class Cancelled(HeadpruneError):
    """Raised by a ``progress(fraction, message)`` callback to stop a long computation between batches.

    Every computation that takes a progress callback calls it between batches (or ablation passes, or pruning
    steps) and lets this propagate: nothing it would have stored is written (results are kept only once a run
    finishes), and the model it read is left intact.
    """

    def __init__(self, message: str = "Cancelled: the run was stopped before it finished; nothing was stored."):
        super().__init__(message)


class Interrupted(HeadpruneError):
    """A command stopped by a signal (Ctrl+C, SIGTERM) after keeping what it finished: the CLI prints the message
    and exits with ``status``, the shell's convention 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status
