"""uvicorn's HTTP/1.1 protocol (h11), answering a request head past its limit with 431.

uvicorn gives h11 a limit on a request's head (`h11_max_incomplete_event_size`, 16 KiB by
default; the decider sets MAX_HEADER_BYTES) and answers anything h11 refuses with a 400,
then closes the socket with the rest of the head unread: the kernel resets the
connection, and a client still sending a 1 MB header saw neither answer (issue 16). Here a
head past the limit gets `431 Request Header Fields Too Large`, the sending side is shut
(the client reads the answer, then the end), and what the client still sends is read and
dropped for at most LINGER_S and LINGER_BYTES before the socket is closed.

A subclass of uvicorn's own h11 protocol, given to uvicorn.Config(http=…), its documented
way to choose the protocol class; it overrides `data_received` (asyncio's) and
`send_400_response`, where uvicorn answers what h11 refuses. tests/faults/test_http_faults.py
holds the answer to it across upgrades.
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from decider.api.http import json_response

#: The most a request's line and headers may hold.
MAX_HEADER_BYTES = 64 * 2**10
LINGER_S = 2.0
LINGER_BYTES = 4 * 2**20


class HeaderLimitedH11Protocol(H11Protocol):
    _lingering = False
    _dropped = 0

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # answered already: read and drop, so that the client reads it
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self.transport.close()
            return
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        buffered, _ = self.conn.trailing_data
        if len(buffered) <= MAX_HEADER_BYTES:
            super().send_400_response(msg)
            return
        self.logger.warning("refused a request whose head is past %d bytes (431)", MAX_HEADER_BYTES)
        body = json_response(
            {"detail": f"the request's line and headers are past {MAX_HEADER_BYTES} bytes"}
        ).body
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(
                status_code=431, headers=headers, reason=b"Request Header Fields Too Large"
            ),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
