"""What aiohttp's server logs for the broker's HTTP listeners (management API,
Prometheus endpoint).

aiohttp logs every request it cannot parse (an over-long header, a bad request
line, a broken chunked body) with `logger.exception`: a traceback per request, so
anyone who can reach the port can fill the log. `ServerLog` turns those, aiohttp's
HttpProcessingError, into one warning line naming the peer and the fault (at most
MAX_DETAIL characters of it); any other exception is a bug of a handler and keeps its
traceback.

Not here: the answer the client gets (aiohttp's 400, or 431 for a header too long).
"""

from __future__ import annotations

import logging
import sys

from aiohttp.http_exceptions import HttpProcessingError

MAX_DETAIL = 200  # characters of the parser's message kept in the line


def one_line(text: str, limit: int = MAX_DETAIL) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ServerLog(logging.LoggerAdapter):
    """The `logger` of aiohttp's request handlers (AppRunner(..., logger=...))."""

    def __init__(self, logger: logging.Logger, listener: str) -> None:
        super().__init__(logger, {})
        self.listener = listener   # "management", "Prometheus": who is speaking

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError):
            self.logger.warning("%s HTTP listener: %s: malformed request (%s %s)",
                                self.listener, msg % args if args else msg, error.code,
                                one_line(error.message or type(error).__name__))
            return
        self.logger.error(msg, *args, exc_info=exc_info, **kwargs)
