"""Exceptions shared by every layer.

`LaminaError` is raised for bad user input (a config field out of range, a
corpus that cannot be read, an id outside the vocabulary). It subclasses
`ValueError`, so callers that only know the standard library can still catch
it. The command line turns it into one line on stderr and exit status 2.

`CheckFailed` is raised by `lamina.checks` when a module breaks an invariant;
its message says what is wrong and by how much.
"""

from __future__ import annotations


class LaminaError(ValueError):
    """Bad input: the message names the field or value at fault."""


class CheckFailed(Exception):
    """An invariant check failed; the message says what and how far off."""
