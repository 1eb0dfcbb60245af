"""Errors a user can cause. Each message names the problem and what is accepted."""


class HeadpruneError(Exception):
    """Base class: bad input from a user (file, model, mask, parameter)."""


class UnsupportedArchitecture(HeadpruneError):
    pass


class ModelLoadError(HeadpruneError):
    pass


class DataError(HeadpruneError):
    pass


class MaskError(HeadpruneError):
    pass


class CriterionError(HeadpruneError):
    pass


class DeviceError(HeadpruneError):
    pass
