"""Timed waits on MXNet's engine: asynchronous engine operations that hold their
arrays for a given time and cost almost no CPU.

An emulated accelerator (``cpsgd-bench --emulate-compute``, the training scripts'
``--emulate-compute``) pushes one operation per layer: it *reads* some arrays
(so it starts only once they are ready) and owns others (so whatever reads them
next waits until it completes).  The operations play as one stream, in the order
they were pushed, like the single compute stream of a GPU: one runs when the engine
has started it (its inputs are ready) and the previous one has finished, whichever
is later, for its time.  They are pushed with MXNet's C API
(``MXEnginePushAsyncND``): the engine thread that starts one only hands its
completion callback to a timer thread and is free again at once; the timer thread
sleeps until the operation's time is up, does its copies (if any) and completes it.
"""
import ctypes
import threading
import time
from typing import List, Sequence, Tuple

from mxnet.base import _LIB, check_call

# void (*EngineAsyncFunc)(void* run_context, void* on_complete, void* param)
_ASYNC_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# engine::CallbackOnComplete: {void (*callback_)(Engine*, void*, const Error*); Engine*; void*}
_ON_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class _CallbackOnComplete(ctypes.Structure):
    _fields_ = [("callback", ctypes.c_void_p), ("engine", ctypes.c_void_p),
                ("param", ctypes.c_void_p)]


class _Context(ctypes.Structure):  # mxnet::Context {DeviceType dev_type; int32 dev_id}
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


class Timer:
    """One thread that plays the pushed operations as one stream (see the module).

    Deadlines count from the previous operation's *deadline*, not from when this
    thread got around to it, so the engine's and this thread's wake-up latency
    does not add up over the ~100 operations of an iteration.

    ``late_seconds``: for operations pushed with ``track_late``, the total time by
    which they started after the previous operation's deadline, i.e. by which the
    work they wait for (a real backward pass) overran the emulated schedule.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._pending = {}   # id -> (seconds, copies, track_late), pushed, not yet started
        self._started = {}   # id -> (started at, callback, seconds, copies, track_late)
        self._next_push = 0
        self._head = 0       # the next operation to play
        self._last_deadline = 0.0
        self.late_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="emulated-compute",
                                        daemon=True)
        self._thread.start()
        self.func = _ASYNC_FUNC(self._on_start)

    def register(self, seconds: float, copies: List[Tuple[int, int, int]],
                 track_late: bool = False) -> int:
        """An id for the operation about to be pushed (push order = play order)."""
        with self._cond:
            op_id = self._next_push
            self._next_push += 1
            self._pending[op_id] = (seconds, copies, track_late)
        return op_id

    def _on_start(self, run_context, on_complete, param):
        # on an engine worker thread: record and return at once
        now = time.monotonic()
        cb = _CallbackOnComplete.from_address(on_complete)
        saved = (cb.callback, cb.engine, cb.param)
        op_id = param or 0
        with self._cond:
            seconds, copies, track_late = self._pending.pop(op_id)
            self._started[op_id] = (now, saved, seconds, copies, track_late)
            self._cond.notify()

    def _run(self):
        while True:
            with self._cond:
                while self._head not in self._started:
                    self._cond.wait()
                started, saved, seconds, copies, track_late = self._started.pop(self._head)
                self._head += 1
            if track_late and started > self._last_deadline:
                self.late_seconds += started - self._last_deadline
            deadline = max(started, self._last_deadline) + seconds
            self._last_deadline = deadline
            wait = deadline - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            for dst, src, nbytes in copies:
                ctypes.memmove(dst, src, nbytes)
            callback, engine, cb_param = saved
            _ON_COMPLETE(callback)(engine, cb_param, None)


_TIMER: List[Timer] = []


def timer() -> Timer:
    """The process's one timer (started on first use)."""
    if not _TIMER:
        _TIMER.append(Timer())
    return _TIMER[0]


def data_pointer(array) -> int:
    """The address of an NDArray's data (CPU arrays)."""
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    return ptr.value


def push_wait(seconds: float, reads: Sequence, writes: Sequence,
              copies: Sequence[Tuple[int, int, int]] = (), name: str = "emulated",
              track_late: bool = False) -> None:
    """Push one asynchronous engine operation.

    Args:
        seconds: how long it plays once started (and the previous one finished).
        reads: NDArrays it reads (it starts once they are ready).
        writes: NDArrays it owns until it completes.
        copies: ``(dst address, src address, bytes)`` copied before it completes.
        name: the operation's name in MXNet's profiler.
        track_late: count its late start in :attr:`Timer.late_seconds`.
    """
    stream = timer()
    op_id = stream.register(seconds, list(copies), track_late)
    ctx = _Context(1, 0)  # cpu(0)
    const = (ctypes.c_void_p * max(1, len(reads)))(*[a.handle.value for a in reads])
    mut = (ctypes.c_void_p * max(1, len(writes)))(*[a.handle.value for a in writes])
    check_call(_LIB.MXEnginePushAsyncND(
        stream.func, ctypes.c_void_p(op_id), None, ctypes.byref(ctx),
        const, ctypes.c_int(len(reads)), mut, ctypes.c_int(len(writes)),
        None, ctypes.c_int(0), ctypes.c_char_p(name.encode()), ctypes.c_bool(False)))
