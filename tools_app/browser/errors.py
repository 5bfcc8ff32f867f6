"""The one error a browser call fails with: a code the model can act on and a message that says what to do."""

from __future__ import annotations

from typing import Any


class BrowserError(Exception):
    def __init__(self, code: str, message: str, **detail: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail
