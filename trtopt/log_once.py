"""`each_warning_once`: one build (or `--backend auto`'s several) says each of its warnings once.

A build checks its plan more than once (the speed check verifies the faster forms it tries, `--backend auto` builds
for each runtime), and each check logs what it finds: a YOLOv8n build printed its verification's distribution-shift
warning twice, once for the plan and once for the form the speed check tried.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def each_warning_once() -> Iterator[None]:
    """While it lasts, the handlers of the root and `trtopt` loggers pass each of trtopt's warnings once."""
    first: dict[tuple[int, str], logging.LogRecord] = {}

    def first_time(record: logging.LogRecord) -> bool:  # every handler passes the first record of its text
        if not record.name.startswith("trtopt") or record.levelno < logging.WARNING:
            return True
        return first.setdefault((record.levelno, record.getMessage()), record) is record

    handlers = {*logging.getLogger().handlers, *logging.getLogger("trtopt").handlers}
    for handler in handlers:
        handler.addFilter(first_time)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(first_time)
