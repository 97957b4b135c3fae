"""The HTTP server's own edge: read deadlines, and problem+json for what uvicorn rejects itself.

uvicorn (httptools) has no deadline for reading a request: an unfinished head (slowloris) or a
body shorter than its Content-Length holds a connection, and its handler, for as long as the
client likes. And a request the parser cannot read (`Content-Length: -1`, two Content-Lengths,
a control byte in a header) is answered with uvicorn's plain-text 400, never reaching the app.
`GuardedHttpToolsProtocol` is uvicorn's protocol with both fixed:

- a request's head must arrive within `header_timeout` (of the connection opening, for the
  first request; of its first byte, for later ones), its body within `body_timeout` of the
  head. A late request gets 408 REQUEST_TIMEOUT (problem+json, `Connection: close`) when no
  answer has started, and the connection is closed. The application sees the request as
  disconnected, with `http.TIMED_OUT` set in its scope, so it counts a 408, not an error.
- a request the parser refuses gets 400 MALFORMED_REQUEST as problem+json, naming what the
  parser found, and the connection is closed (as uvicorn does: the stream is out of step).

The subtle part: the common request arrives whole in one read, and then no timer is created at
all; timers exist only while a head or body is incomplete after a read.

It also sends each answer's head and body in one write (`HeadWithBodyTransport`): uvicorn
writes them separately, two send() system calls and two TCP segments per small answer, a
measurable share of a gateway's CPU per request. A hot route with its whole answer at hand (a
`Reply`) can go further and write it past uvicorn's two `send` messages (`sent_whole`).

Further still, an app may answer a request the moment its head is read, without uvicorn's
request cycle, task or ASGI call (`DirectAnswer`: an app with a `direct_answer` method). The
protocol asks it first; a Reply is written at once, None leaves the request to the ASGI path.
An answer decided without awaiting anything (the gateway's sold-out lane) is a Reply; one that
waits for a single future (the issuer's lone press: its script call; the gateway's forwarded
press: a task of its own) is a `Later`, written from that future's done callback, without
uvicorn's cycle. The subtle part is uvicorn's books,
kept as its own answer keeps them: the connection closed or its keep-alive timer armed, the
rest of the request (a body) ignored, a pipelined request after it started once the answer is
out (docs/gateway.md, "Direct answers"; docs/issuer.md, "Lone presses answered later"). And
`server_options` is the one set of uvicorn options the HTTP services run with (the benchmarks
serve apps with it too).
"""

from __future__ import annotations

import asyncio
import functools
import http
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import httptools
from prometheus_client import Counter
from starlette.types import Scope, Send
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from flashcoupon_common.http import (
    NO_BODY,
    PROBLEM_JSON,
    TIMED_OUT,
    Headers,
    Reply,
    problem_body,
)
from flashcoupon_common.settings import positive, read_env, setting

logger = logging.getLogger(__name__)

REJECTED = Counter(
    "flashcoupon_http_rejected_total",
    "Requests the HTTP server refused before or instead of the application, by reason",
    ["service", "reason"],  # malformed, header_timeout, body_timeout, idle_timeout
)

# Where a connection is in reading its current request.
_FIRST, _HEAD, _BODY, _IDLE = range(4)


@dataclass(frozen=True)
class ServerTimeouts:
    """How long a client may take to send a request's head, and then its body."""

    header_timeout_seconds: float = setting(10.0, check=positive)
    body_timeout_seconds: float = setting(10.0, check=positive)

    @classmethod
    def from_env(cls, prefix: str, env: Mapping[str, str] | None = None) -> ServerTimeouts:
        """`prefix` is the service's (FLASHCOUPON_GATEWAY_HEADER_TIMEOUT_SECONDS, ...)."""
        return read_env(cls, env, prefix)


# What one service's server needs beyond the common options: the gateway faces shoppers'
# connections (kept alive through a shopper's presses), the issuer takes the gateways' bursts.
_SERVICE_OPTIONS: dict[str, dict[str, Any]] = {
    "gateway": {"timeout_keep_alive": 30},
    "issuer": {"backlog": 4096},
}


def server_options(service: str, timeouts: ServerTimeouts) -> dict[str, Any]:
    """uvicorn.run / uvicorn.Config keyword arguments for a service's HTTP server (the
    benchmarks serve their baselines with these too: flashcoupon_loadtest.serve).

    `proxy_headers` is off: uvicorn would otherwise rewrite the client address from
    X-Forwarded-For for a local peer, on every request; the gateway applies its own rule
    (TRUSTED_PROXIES hops), and the other services do not use the address.
    """
    return {
        "loop": "uvloop",
        "http": guarded_protocol(service, timeouts),
        "access_log": False,
        "log_config": None,
        "proxy_headers": False,
        **_SERVICE_OPTIONS.get(service, {}),
    }


def guarded_protocol(service: str, timeouts: ServerTimeouts) -> Any:
    """What to pass as uvicorn's `http=`: a picklable factory (uvicorn --workers spawns)."""
    return functools.partial(
        GuardedHttpToolsProtocol,
        service=service,
        header_timeout=timeouts.header_timeout_seconds,
        body_timeout=timeouts.body_timeout_seconds,
    )


class HeadWithBodyTransport:
    """A response cycle's view of the connection: the answer's head is held until its body.

    uvicorn writes a response's head and its body in two writes. The head is held and sent
    with the next write; should no body write follow in this turn of the event loop (a HEAD
    answer, a stream waiting for its first event), a callback sends it alone, so nothing waits
    on the hold. 1xx answers (100 Continue) are never held: the client waits for them.
    """

    __slots__ = ("_head", "_loop", "_transport")

    def __init__(self, transport: Any, loop: Any) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 1"):
            self._head = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def write_through(self, data: bytes) -> None:
        """Write `data` now, holding nothing: a whole answer (`sent_whole`)."""
        self._transport.write(data)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self._transport, name)


# Headers that frame the message: an answer carrying any of them but its one Content-Length is
# left to uvicorn's `send`, which knows what each means.
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})
# Header lines as `sent_whole` writes them: a lower-case token, ": ", a value without control
# characters (tab allowed), CRLF. Stricter than uvicorn's checks, which a line failing this
# still gets (the answer then goes the usual way and uvicorn accepts or refuses it).
_FIELD_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9a-z]+: [^\x00-\x08\x0a-\x1f\x7f]*\r\n)*")
# The server's own headers (server, date) as lines: uvicorn makes a new list when the date
# changes, once a second, so the last list seen and its lines are kept.
_defaults: tuple[Headers | None, bytes] = (None, b"")


# Header pairs already written as lines that passed _FIELD_LINES, with those lines: a hot route
# answers with the same few pairs (its content type, a handful of body lengths), so each is
# checked once. Bounded: odd pairs only make it refill.
_checked_lines: dict[tuple[bytes, bytes], bytes] = {}


def _header_lines(headers: Headers) -> bytes:
    return b"".join([name + b": " + value + b"\r\n" for name, value in headers])


def _checked_line(pair: tuple[bytes, bytes]) -> bytes | None:
    """`pair` as its header line, or None when the line would not pass _FIELD_LINES."""
    line = _checked_lines.get(pair)
    if line is None:
        line = pair[0] + b": " + pair[1] + b"\r\n"
        if _FIELD_LINES.fullmatch(line) is None:
            return None
        if len(_checked_lines) >= 4096:
            _checked_lines.clear()
        _checked_lines[pair] = line
    return line


def _default_lines(headers: Headers) -> bytes:
    global _defaults
    seen, lines = _defaults
    if headers is not seen:
        lines = _header_lines(headers)
        _defaults = (headers, lines)
    return lines


def sent_whole(send: Send, reply: Reply) -> bool:
    """Write `reply` as one answer at once, for an app called by `GuardedHttpToolsProtocol`;
    False, having sent nothing, when this cannot: then send it as ASGI messages (`Reply.send`).

    uvicorn's `send` takes an answer as two messages, each awaited, and checks and frames every
    header in Python; the held head (`HeadWithBodyTransport`) then costs a callback and a copy.
    For a complete answer that is 5–9 µs of the server's CPU (docs/gateway.md, "The answer in
    one write"). This writes the same bytes uvicorn would (`whole_answer`) and keeps its books as
    its `send` does (the cycle's answer started and complete, its waiters woken, the connection
    closed or its next request started). Only the first message of an answer, while the client
    reads, without access logging."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle:
        return False
    # The protocol gives each cycle this view of the connection (uvicorn's type says Transport).
    transport: Any = cycle.transport
    if (
        type(transport) is not HeadWithBodyTransport
        or cycle.response_started
        or cycle.disconnected
        or cycle.flow.write_paused
        or cycle.access_log
    ):
        return False
    data = whole_answer(reply, cycle.scope["method"], cycle.default_headers, cycle.keep_alive)
    if data is None:
        return False
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    transport.write_through(data)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        transport.close()
    cycle.on_response()
    return True


def whole_answer(
    reply: Reply, method: str, default_headers: Headers, keep_alive: bool
) -> bytes | None:
    """`reply` as the bytes uvicorn would write for it — its status line, its default headers
    (server, date), the reply's headers, `connection: close` when the connection is not kept
    alive, the body — or None when it is not the plain case: an answer (not to a HEAD) with a
    body and one matching Content-Length, every header line a lower-case token and a value
    without control characters. Anything else (a HEAD, a 1xx/204/304, chunked framing, a
    Connection header, an odd header) is left to uvicorn's `send`, which knows what each means."""
    status = reply.status
    if not 200 <= status < 600 or status in NO_BODY or method == "HEAD":
        return None
    body = reply.body
    length = None
    head = [STATUS_LINE[status], _default_lines(default_headers)]
    for pair in reply.headers:
        name = pair[0]
        if name in _FRAMING:
            if name != b"content-length" or length is not None:
                return None
            length = pair[1]
        line = _checked_line(pair)
        if line is None:
            return None
        head.append(line)
    if length != b"%d" % len(body):
        return None
    if not keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    head.append(body)
    return b"".join(head)


class Later(NamedTuple):
    """A direct answer that waits for one future: `answer(waits_on)` gives the Reply once
    `waits_on` is done (cancelled included), called from its done callback. An exception from
    `answer` (a bug) is logged and answered 500, as the apps' exception tables answer one."""

    waits_on: asyncio.Future[Any]
    answer: Callable[[asyncio.Future[Any]], Reply]


# An app's answer to a request the moment its head is read (`GuardedHttpToolsProtocol`), given
# the request's scope so far — type, method, path (an HTTP/1.1 request whose target has no
# query and nothing percent-encoded), headers, client, server, state: a Reply to write now,
# a Later to write once its future is done, or None (the request takes the ASGI path, which
# must give the same answer). The request's body, if any, is not read.
DirectAnswer = Callable[[Scope], "Reply | Later | None"]


class _Answered:
    """The protocol's `cycle` after a direct answer: a complete answer as far as uvicorn reads
    one (the rest of that request is ignored, the next request starts at once, a disconnect
    has no waiter to wake)."""

    __slots__ = ()
    response_complete = True

    @property
    def message_event(self) -> _Answered:
        return self

    def set(self) -> None:
        """Nothing waits on a direct answer's request."""


_ANSWERED: Any = _Answered()


class _Waiting:
    """The protocol's `cycle` while a `Later` answer waits: an answer in progress as far as
    uvicorn reads one (a request pipelined behind it is queued, reading paused; a body is
    taken and dropped; a disconnect or a shutdown is noted), written by `settle`."""

    __slots__ = (
        "_answer",
        "_method",
        "_protocol",
        "body",
        "disconnected",
        "keep_alive",
        "more_body",
        "response_complete",
    )

    def __init__(
        self, protocol: GuardedHttpToolsProtocol, later: Later, method: str, keep_alive: bool
    ) -> None:
        self._protocol = protocol
        self._answer = later.answer
        self._method = method
        self.body = bytearray()  # uvicorn appends what arrives; a body the app did not read
        self.disconnected = False
        self.keep_alive = keep_alive  # uvicorn's shutdown clears it: the answer then closes
        self.more_body = True  # uvicorn's on_message_complete clears it; nothing reads it
        self.response_complete = False

    @property
    def message_event(self) -> _Waiting:
        return self

    def set(self) -> None:
        """uvicorn wakes a cycle's reader on body, end and disconnect: nothing reads here."""
        self.body.clear()

    def settle(self, waits_on: asyncio.Future[Any]) -> None:
        protocol = self._protocol
        try:
            reply = self._answer(waits_on)
        except (Exception, asyncio.CancelledError):  # logged, answered as the tables answer it
            logger.exception("direct answer to %s failed", self._method)
            reply = _INTERNAL
        if self.disconnected or protocol.transport.is_closing():
            return  # as uvicorn's send to a client gone: nothing written, nothing counted
        keep_alive = self.keep_alive
        defaults = protocol.server_state.default_headers
        data = whole_answer(reply, self._method, defaults, keep_alive)
        if data is None:  # not the plain case: the app's mistake, answered as one
            logger.error("direct answer %d is not one the server writes whole", reply.status)
            keep_alive = False
            data = whole_answer(_INTERNAL, "POST", defaults, keep_alive)
            assert data is not None
        self.response_complete = True
        protocol.transport.write(data)
        if not keep_alive:
            protocol.transport.close()
        protocol.on_response_complete()  # counted; the next request started, or kept alive


_INTERNAL = Reply.of(
    500,
    [(b"content-type", PROBLEM_JSON.encode())],
    problem_body(500, "INTERNAL", "internal error; it has been logged"),
)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(
        self,
        *args: Any,
        service: str,
        header_timeout: float,
        body_timeout: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._service = service
        self._header_timeout = header_timeout
        self._body_timeout = body_timeout
        self._phase = _FIRST
        self._phase_deadline = 0.0
        self._deadline: float | None = None
        self._timer: Any = None
        # The app's direct answers (`DirectAnswer`), if it offers them: uvicorn gives the
        # protocol the loaded app itself (no middleware wraps it here: access log, proxy
        # headers and trace logging are off), and with a root path or a concurrency limit
        # the request is uvicorn's to shape.
        direct = getattr(self.app, "direct_answer", None)
        plain = not self.root_path and self.limit_concurrency is None
        self._direct: DirectAnswer | None = direct if plain else None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # A connection that never completes a request head is closed, even if it sends nothing.
        self._phase_deadline = self.loop.time() + self._header_timeout
        self._arm(self._phase_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            self._reject(400, "MALFORMED_REQUEST", f"malformed HTTP request: {exc}", "malformed")
            return
        self._arm(self._read_deadline())

    # Parser callbacks: note where the request stands; data_received arms the timer after.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase != _FIRST:  # the first request's clock started at connection_made
            self._phase_deadline = self.loop.time() + self._header_timeout
        self._phase = _HEAD

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._phase_deadline = self.loop.time() + self._body_timeout
        direct = self._direct
        if direct is not None and self._answered_directly(direct):
            return
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = HeadWithBodyTransport(self.transport, self.loop)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        super().on_message_complete()

    def _answered_directly(self, direct: DirectAnswer) -> bool:
        """Whether the app answered this request at once (`DirectAnswer`), written here with
        uvicorn's books kept as its `on_response_complete` keeps them."""
        running = self.cycle is not None and not self.cycle.response_complete
        url = self.url
        if (
            running  # pipelined behind an answer in progress: uvicorn queues it
            # The client is not reading: uvicorn's send waits for it, and requests pipelined
            # meanwhile queue with reading paused, where direct answers would pile up unread.
            or self.flow.write_paused
            or b"?" in url
            or b"%" in url
            or not url.isascii()
            or self.parser.should_upgrade()
            or self.parser.get_http_version() != "1.1"
        ):
            return False
        scope = self.scope
        scope["method"] = method = self.parser.get_method().decode("ascii")
        scope["path"] = url.decode("ascii")
        reply = direct(scope)  # type: ignore[arg-type]  # uvicorn's HTTPScope is a Scope
        if reply is None:
            return False
        keep_alive = self.parser.should_keep_alive()
        if isinstance(reply, Later):
            waiting = _Waiting(self, reply, method, keep_alive)
            self.cycle = waiting  # type: ignore[assignment]  # a cycle as far as uvicorn reads
            reply.waits_on.add_done_callback(waiting.settle)
            self._phase = _IDLE  # a body is read and dropped; the answer's keep-alive bounds it
            return True
        data = whole_answer(reply, method, self.server_state.default_headers, keep_alive)
        if data is None:
            return False
        self.transport.write(data)
        self.cycle = _ANSWERED
        self._phase = _IDLE  # a body still to come is read and ignored, as the keep-alive bounds
        self.server_state.total_requests += 1
        if not keep_alive:
            self.transport.close()
            return True
        self._unset_keepalive_if_required()  # a pipelined answer before this one armed it
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )
        return True

    def _read_deadline(self) -> float | None:
        if self._phase in (_FIRST, _HEAD, _BODY):
            return self._phase_deadline
        if self.cycle is None or self.cycle.response_complete:
            if self.timeout_keep_alive_task is not None:
                return None  # answered within this read (directly): the keep-alive bounds it
            # Bytes that are not a request (stray CRLFs) after an answer: uvicorn's keep-alive
            # timer was just cancelled by them, so this bounds the connection instead.
            return self.loop.time() + self._header_timeout
        return None  # the application is answering; nothing is being read

    def _arm(self, deadline: float | None) -> None:
        if deadline == self._deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadline = deadline
        if deadline is not None:
            self._timer = self.loop.call_at(deadline, self._read_timed_out)

    def _read_timed_out(self) -> None:
        self._timer = self._deadline = None
        if self.transport.is_closing():
            return
        if self._phase == _HEAD:
            detail = f"request head not received within {self._header_timeout:g} s"
            self._reject(408, "REQUEST_TIMEOUT", detail, "header_timeout")
        elif self._phase == _BODY:
            detail = f"request body not received within {self._body_timeout:g} s"
            self._reject(408, "REQUEST_TIMEOUT", detail, "body_timeout")
        else:  # connected (or answered) and then silent: nothing to answer
            REJECTED.labels(self._service, "idle_timeout").inc()
            self.transport.close()

    def _reject(self, status: int, code: str, detail: str, reason: str) -> None:
        """Answer `status` as problem+json unless an answer has begun; close either way."""
        REJECTED.labels(self._service, reason).inc()
        cycle = self.cycle if self._phase == _BODY else None
        if cycle is not None:
            # The application is running this request: it now reads a disconnect, and its own
            # answer (if any) goes nowhere; TIMED_OUT lets it count a 408 rather than a 499.
            if status == 408:
                cycle.scope[TIMED_OUT] = True  # type: ignore[literal-required]
            answered = cycle.response_started
            cycle.disconnected = True
            cycle.message_event.set()
        else:
            answered = self.cycle is not None and not self.cycle.response_complete
        if not answered:
            body = problem_body(status, code, detail)
            head = [b"HTTP/1.1 %d %s\r\n" % (status, http.HTTPStatus(status).phrase.encode())]
            head.append(_default_lines(self.server_state.default_headers))
            head.append(
                b"content-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                % (PROBLEM_JSON.encode(), len(body))
            )
            self.transport.write(b"".join(head) + body)
        self.transport.close()
