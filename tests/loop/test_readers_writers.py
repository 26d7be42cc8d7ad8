"""add_reader / remove_reader / add_writer / remove_writer."""
import os
import selectors
import socket

import pytest

from loop_helpers import stop_after


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_reader_called_on_data(loop, pair):
    a, b = pair
    got = []

    def on_readable():
        got.append(a.recv(100))
        loop.stop()

    loop.add_reader(a.fileno(), on_readable)
    loop.call_later(0.01, b.send, b"hello")
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [b"hello"]
    assert loop.remove_reader(a.fileno()) is True


def test_reader_is_level_triggered(loop, pair):
    a, b = pair
    got = []

    def on_readable():
        got.append(a.recv(1))
        if len(got) == 10:
            # no more data: the reader must not be called again
            loop.call_later(0.05, loop.stop)

    b.send(b"0123456789")
    loop.add_reader(a.fileno(), on_readable)
    stop_after(loop, 5)
    loop.run_forever()
    assert b"".join(got) == b"0123456789"
    assert len(got) == 10
    loop.remove_reader(a.fileno())


def test_reader_with_args(loop, pair):
    a, b = pair
    got = []

    def on_readable(x, y):
        got.append((x, y, a.recv(10)))
        loop.stop()

    loop.add_reader(a, on_readable, 1, "two")
    b.send(b"z")
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [(1, "two", b"z")]
    loop.remove_reader(a)


def test_add_reader_returns_none(loop, pair):
    """asyncio's public add_reader/add_writer return None in 3.11."""
    a, _ = pair
    assert loop.add_reader(a.fileno(), lambda: None) is None
    assert loop.add_writer(a.fileno(), lambda: None) is None
    assert loop.remove_reader(a.fileno()) is True
    assert loop.remove_writer(a.fileno()) is True


def test_file_object_with_fileno(loop, pair):
    a, b = pair

    class Wrapper:
        def fileno(self):
            return a.fileno()

    got = []

    def on_readable():
        got.append(a.recv(10))
        loop.stop()

    w = Wrapper()
    loop.add_reader(w, on_readable)
    b.send(b"obj")
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [b"obj"]
    # fd and object are interchangeable for removal
    assert loop.remove_reader(a.fileno()) is True
    assert loop.remove_reader(w) is False


def test_remove_return_values(loop, pair):
    a, _ = pair
    fd = a.fileno()
    assert loop.remove_reader(fd) is False
    assert loop.remove_writer(fd) is False
    loop.add_reader(fd, lambda: None)
    assert loop.remove_writer(fd) is False
    assert loop.remove_reader(fd) is True
    assert loop.remove_reader(fd) is False
    loop.add_writer(a, lambda: None)
    assert loop.remove_reader(a) is False
    assert loop.remove_writer(a) is True
    assert loop.remove_writer(a) is False


def test_replace_reader(loop, pair):
    a, b = pair
    got = []

    def first():
        got.append("first")

    def second():
        got.append(("second", a.recv(10)))
        loop.stop()

    loop.add_reader(a.fileno(), first)
    loop.add_reader(a.fileno(), second)
    b.send(b"x")
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [("second", b"x")]
    assert loop.remove_reader(a.fileno()) is True


def test_writer_called_when_writable(loop, pair):
    a, b = pair
    got = []

    def on_writable():
        got.append(a.send(b"ping"))
        loop.remove_writer(a.fileno())
        loop.stop()

    loop.add_writer(a.fileno(), on_writable)
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [4]
    assert b.recv(10) == b"ping"


def test_writer_level_triggered_until_removed(loop, pair):
    a, _ = pair
    count = [0]

    def on_writable():
        count[0] += 1
        if count[0] == 5:
            assert loop.remove_writer(a.fileno()) is True
            loop.call_later(0.02, loop.stop)

    loop.add_writer(a.fileno(), on_writable)
    stop_after(loop, 5)
    loop.run_forever()
    assert count[0] == 5


def test_reader_and_writer_on_same_fd(loop, pair):
    a, b = pair
    events = []

    def on_read():
        events.append(("r", a.recv(10)))
        loop.stop()

    def on_write():
        events.append("w")
        loop.remove_writer(a.fileno())
        b.send(b"data")

    loop.add_reader(a.fileno(), on_read)
    loop.add_writer(a.fileno(), on_write)
    stop_after(loop, 5)
    loop.run_forever()
    assert events == ["w", ("r", b"data")]
    # removing the writer left the reader in place
    assert loop.remove_writer(a.fileno()) is False
    assert loop.remove_reader(a.fileno()) is True


def test_remove_writer_keeps_reader(loop, pair):
    a, b = pair
    got = []
    loop.add_reader(a.fileno(), lambda: (got.append(a.recv(10)), loop.stop()))
    loop.add_writer(a.fileno(), lambda: None)
    assert loop.remove_writer(a.fileno()) is True
    b.send(b"still")
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [b"still"]
    loop.remove_reader(a.fileno())


def test_reader_on_pipe_eof(loop):
    r, w = os.pipe()
    os.set_blocking(r, False)
    got = []

    def on_read():
        data = os.read(r, 100)
        got.append(data)
        if not data:
            loop.remove_reader(r)
            loop.stop()

    try:
        loop.add_reader(r, on_read)
        os.write(w, b"abc")
        loop.call_later(0.01, os.close, w)
        stop_after(loop, 5)
        loop.run_forever()
    finally:
        os.close(r)
        try:
            os.close(w)
        except OSError:
            pass
    assert got == [b"abc", b""]


def test_reader_exception_goes_to_handler_and_loop_continues(loop, pair):
    a, b = pair
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

    def bad_reader():
        a.recv(10)
        raise ValueError("reader failed")

    loop.add_reader(a.fileno(), bad_reader)
    b.send(b"x")
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    assert len(contexts) == 1
    assert isinstance(contexts[0]["exception"], ValueError)
    assert contexts[0]["message"].startswith("Exception in callback ")
    loop.remove_reader(a.fileno())


def test_many_readers(loop):
    pairs = [socket.socketpair() for _ in range(50)]
    hits = set()
    try:
        for i, (a, b) in enumerate(pairs):
            a.setblocking(False)

            def cb(i=i, a=a):
                a.recv(10)
                hits.add(i)
                loop.remove_reader(a.fileno())
                if len(hits) == len(pairs):
                    loop.stop()

            loop.add_reader(a.fileno(), cb)
        for _, b in pairs:
            b.send(b"x")
        stop_after(loop, 5)
        loop.run_forever()
        assert hits == set(range(50))
    finally:
        for a, b in pairs:
            a.close()
            b.close()


@pytest.mark.parametrize("method", ["add_reader", "add_writer", "remove_reader", "remove_writer"])
def test_invalid_fd(loop, method):
    args = (-1, lambda: None) if method.startswith("add") else (-1,)
    with pytest.raises(ValueError, match="^Invalid file descriptor: -1$"):
        getattr(loop, method)(*args)


@pytest.mark.parametrize("bad", [object(), "abc", 1.5, None])
@pytest.mark.parametrize("method", ["add_reader", "add_writer", "remove_reader", "remove_writer"])
def test_invalid_file_object(loop, method, bad):
    args = (bad, lambda: None) if method.startswith("add") else (bad,)
    with pytest.raises(ValueError) as ei:
        getattr(loop, method)(*args)
    assert str(ei.value) == f"Invalid file object: {bad!r}"


def test_closed_fd_add_raises_oserror_and_remove_returns_false(loop):
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(OSError):
        loop.add_reader(r, lambda: None)
    with pytest.raises(OSError):
        loop.add_writer(r, lambda: None)
    assert loop.remove_reader(r) is False
    assert loop.remove_writer(r) is False


def _outcome(call, *args):
    try:
        return call(*args)
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def test_socket_closed_before_remove_is_found_by_the_object(loop):
    # anyio closes a socket, then calls remove_reader(sock): the selector
    # finds the registration by the object, whose fileno() is -1 by then.
    a, b = socket.socketpair()
    loop.add_reader(a, lambda: None)
    a.close()
    assert loop.remove_writer(a) is False          # registered, no writer
    assert loop.remove_reader(a) is True
    # gone now: the object has no fd and no registration
    assert _outcome(loop.remove_reader, a) == "ValueError: Invalid file descriptor: -1"
    b.close()


def test_closed_socket_never_registered_by_the_object(loop):
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    loop.add_reader(a.fileno(), lambda: None)       # by number, not object
    fd = a.fileno()
    a.close()
    c.close()
    assert _outcome(loop.remove_reader, a) == "ValueError: Invalid file descriptor: -1"
    assert _outcome(loop.remove_reader, c) == "ValueError: Invalid file descriptor: -1"
    assert loop.remove_reader(fd) is True
    b.close()
    d.close()


def test_closed_socket_with_both_interests_drops_the_registration(loop):
    # Taking the reader off leaves the writer: a modify() of the dead fd,
    # which fails, and the selector forgets the fd altogether.
    a, b = socket.socketpair()
    loop.add_writer(a, lambda: None)
    loop.add_reader(a.fileno(), lambda: None)
    a.close()
    assert _outcome(loop._remove_reader, a) == "OSError: [Errno 9] Bad file descriptor"
    assert _outcome(loop._remove_writer, a) == "ValueError: Invalid file descriptor: -1"
    b.close()


def test_closed_socket_on_a_closed_loop(new_loop):
    lp = new_loop()
    a, b = socket.socketpair()
    lp.add_reader(a, lambda: None)
    lp.close()
    a.close()
    assert lp.remove_reader(a) is False
    b.close()


def test_closed_loop(new_loop, pair):
    a, _ = pair
    lp = new_loop()
    lp.close()
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        lp.add_reader(a.fileno(), lambda: None)
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        lp.add_writer(a.fileno(), lambda: None)
    assert lp.remove_reader(a.fileno()) is False
    assert lp.remove_writer(a.fileno()) is False


def test_close_loop_with_registered_reader(new_loop, pair):
    a, b = pair
    lp = new_loop()
    lp.add_reader(a.fileno(), lambda: None)
    lp.add_writer(b.fileno(), lambda: None)
    lp.close()
    # the fds themselves are untouched by close()
    b.send(b"ok")
    assert a.recv(10) == b"ok"


def test_io_callbacks_run_after_ready_and_before_timers(loop, pair):
    """_run_once order: already-ready callbacks, then I/O callbacks found by
    the poll, then expired timers."""
    a, b = pair
    out = []

    def on_read():
        a.recv(10)
        out.append("io")
        loop.remove_reader(a.fileno())

    b.send(b"x")
    loop.add_reader(a.fileno(), on_read)
    loop.call_later(-1, out.append, "timer")
    loop.call_soon(out.append, "soon")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == ["soon", "io", "timer"]


def test_reader_replaced_before_its_queued_callback_runs(loop, pair):
    """The old reader's callback already queued in this iteration is
    cancelled by add_reader() replacing it; the new one runs next time."""
    a, b = pair
    out = []

    def old():
        out.append("old")

    def new():
        out.append(("new", a.recv(10)))
        loop.remove_reader(a.fileno())
        loop.stop()

    b.send(b"x")
    loop.add_reader(a.fileno(), old)
    loop.call_soon(lambda: loop.add_reader(a.fileno(), new))
    stop_after(loop, 5)
    loop.run_forever()
    assert out == [("new", b"x")]


def test_reader_removed_before_its_queued_callback_runs(loop, pair):
    a, b = pair
    out = []
    b.send(b"x")
    loop.add_reader(a.fileno(), out.append, "reader")
    loop.call_soon(loop.remove_reader, a.fileno())
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert out == []


def test_readers_removing_each_other(loop):
    p1, p2 = socket.socketpair(), socket.socketpair()
    out = []
    try:
        fds = [p1[0].fileno(), p2[0].fileno()]

        def cb(i):
            out.append(i)
            loop.remove_reader(fds[i])
            loop.remove_reader(fds[1 - i])

        loop.add_reader(fds[0], cb, 0)
        loop.add_reader(fds[1], cb, 1)
        p1[1].send(b"x")
        p2[1].send(b"x")
        loop.call_later(0.05, loop.stop)
        loop.run_forever()
        # both were ready in the same poll; whichever ran first removed the other
        assert len(out) == 1
    finally:
        for s in (*p1, *p2):
            s.close()


def test_remove_and_readd_reader_inside_callback(loop, pair):
    a, b = pair
    out = []

    def cb():
        out.append(a.recv(1))
        loop.remove_reader(a.fileno())
        if len(out) < 3:
            loop.add_reader(a.fileno(), cb)
        else:
            loop.stop()

    b.send(b"abc")
    loop.add_reader(a.fileno(), cb)
    stop_after(loop, 5)
    loop.run_forever()
    assert out == [b"a", b"b", b"c"]


def test_fd_closed_and_number_reused(loop):
    """A registered fd closed behind the loop's back, then its number reused:
    remove_reader + add_reader on the new descriptor must work."""
    a, b = socket.socketpair()
    fd = a.fileno()
    loop.add_reader(fd, lambda: None)
    loop.remove_reader(fd)
    a.close()
    b.close()
    c, d = socket.socketpair()
    try:
        got = []
        loop.add_reader(c.fileno(), lambda: (got.append(c.recv(10)), loop.stop()))
        d.send(b"reused")
        stop_after(loop, 5)
        loop.run_forever()
        assert got == [b"reused"]
        assert loop.remove_reader(c.fileno()) is True
    finally:
        c.close()
        d.close()


def test_selector_view_of_watched_fds(loop):
    """loop._selector.get_key()/get_map(), as code that inspects the stock
    selector loop uses them: what has a reader or writer, and nothing else."""
    a, b = socket.socketpair()
    try:
        with pytest.raises(KeyError):
            loop._selector.get_key(a)
        loop.add_reader(a, lambda: None)
        key = loop._selector.get_key(a)
        assert (key.fileobj, key.fd, key.events) == (a, a.fileno(),
                                                     selectors.EVENT_READ)
        loop.add_writer(a.fileno(), lambda: None)
        key = loop._selector.get_key(a.fileno())
        assert key.events == selectors.EVENT_READ | selectors.EVENT_WRITE
        assert a.fileno() in loop._selector.get_map()
        assert b.fileno() not in loop._selector.get_map()
        loop.remove_reader(a)
        assert loop._selector.get_key(a).events == selectors.EVENT_WRITE
        loop.remove_writer(a)
        with pytest.raises(KeyError):
            loop._selector.get_key(a)
        assert a.fileno() not in loop._selector.get_map()
        loop.close()
        assert loop._selector is None
    finally:
        a.close()
        b.close()
