"""Stands in for HF datasets, which SGLang's benchmark client imports at module
level and the device lacks; its random-ids dataset never calls it."""


def load_dataset(*a, **k):
    raise RuntimeError("datasets is not installed")
