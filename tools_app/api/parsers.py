"""The API's JSON parser: refuses up front what would otherwise fail deep inside, after a call was drafted."""

import math

from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_DEPTH = 64


def json_problem(document) -> str | None:
    """Why this parsed document cannot be stored or echoed back, or None.

    PostgreSQL cannot store NUL in text or JSON, no encoder accepts an unpaired surrogate, JSON has no infinity
    (a number like 1e400 parses to one), and deep nesting exhausts the recursion of every later encoder.
    """
    pending = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            pending.extend((key, depth) for key in value)
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            if "\x00" in value:
                return "a string contains a NUL character"
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "a string contains an unpaired surrogate"
        elif isinstance(value, float) and not math.isfinite(value):
            return "a number is out of range"
    return None


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            document = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels") from None
        problem = json_problem(document)
        if problem is not None:
            raise ParseError(f"JSON parse error - {problem}")
        return document
