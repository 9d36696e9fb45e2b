"""Targets for the bad-input tests of tests/unit/test_own_model.py."""


def not_a_module(**kwargs: object) -> dict:
    return dict(kwargs)
