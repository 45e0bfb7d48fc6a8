"""Every lock of the package, and the one fork hook that keeps them usable in a forked child.

Why one mechanism: vLLM, PyTorch data loaders and multiprocessing fork processes while other threads
run, and a thread inside one of our critical sections at that instant would leave the child a lock held
by a thread that does not exist there: the child's first `shims.install()`, `uninstall()` or call through
that path would wait forever. Each module used to make its own lock (two with an at-fork hook, the rest
without), so one forgotten hook was enough. Here every lock is made by `fork_safe_lock()` (a unit test
fails on any other), which registers it, and one `os.register_at_fork` hook covers them all: before a fork
the forking thread takes every registered lock, so the child starts with each one free and the state it
guards whole; after the fork, parent and child let go of what the hook took.

How the hook cannot deadlock the fork: code nests our locks (a shim module's lock around `install()`, the
patching lock around the registry's, a contract compiled under the patching lock), and a fork taking them
in an order that contradicts a nesting would wait for a thread that waits for it. So the hook waits
without a time limit only while it holds nothing; while it holds some, it waits at most `PATIENCE` for the
next one, and when that runs out it lets go of all, puts the lock it waited for first in the order (its
holder was likely waiting for one of those, so it is the outer one), and starts again. The order thus
settles, after a few corrections per process, into one that agrees with how the code nests its locks.

Why re-entrant: a fork from inside one of our own critical sections (a plugin that forks while holding
one) then takes that lock once more instead of waiting for itself, and the lock knows its owner. The
child's only thread is the forking one, under the same ident, so it releases exactly the holds the hook
added; the sections it was inside release theirs as they finish. In that case alone another thread may
wait for the lock the forking thread holds, so the hook stops waiting after `GIVE_UP` seconds, forks with
the locks it could take, and the child makes the others new (their holders do not exist there).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from typing import Any

__all__ = ["GIVE_UP", "PATIENCE", "fork_safe_lock", "registered_locks"]

PATIENCE = 0.25  # seconds a fork waits for a lock while it holds others, before it starts again
GIVE_UP = 5.0  # seconds a fork from inside one of our critical sections waits for the rest

_LOCKS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # creation number -> lock
_NUMBER = itertools.count()
_FIRST: list[int] = []  # locks moved to the front of the fork's order (numbers), first first
# The registration's own lock (plain: the hook takes it last, and whoever holds it waits for nothing), so that
# no lock is made, and taken, between the hook's list and the fork.
_GUARD = threading.Lock()
_MADE = [0]  # locks registered so far
_HELD: dict[int, tuple[list[Any], list[Any]]] = {}  # forking thread -> (what its hook took, what it could not)


def fork_safe_lock() -> threading.RLock:
    """A re-entrant lock that a fork never leaves held in the child (use it for every lock of the package).

    >>> from maxtext_compat.locks import fork_safe_lock, registered_locks
    >>> lock = fork_safe_lock()
    >>> with lock, lock:  # re-entrant
    ...     lock in registered_locks()
    True
    """
    lock = threading.RLock()
    with _GUARD:
        _LOCKS[next(_NUMBER)] = lock
        _MADE[0] += 1
    return lock


def registered_locks() -> list[Any]:
    """Every live lock made by `fork_safe_lock()`, in the order a fork takes them."""
    with _GUARD:
        return [lock for _, lock in _in_order()]


def _in_order() -> list[tuple[int, Any]]:
    """(number, lock) in the fork's order; the caller holds the guard (no registration meanwhile)."""
    live = dict(_LOCKS.items())
    first = [n for n in dict.fromkeys(_FIRST) if n in live]
    _FIRST[:] = first
    moved = set(first)
    return [(n, live[n]) for n in first] + [(n, lock) for n, lock in live.items() if n not in moved]


def _release(locks: list[Any]) -> None:
    for lock in reversed(locks):
        lock.release()


def _attempt(order: list[tuple[int, Any]], made: int, patient: bool) -> list[Any] | None:
    """One pass over the locks in order, then the guard; None (holding nothing) when it has to start again."""
    taken: list[Any] = []
    try:
        for number, lock in order:
            if lock.acquire(timeout=-1 if patient and not taken else PATIENCE):
                taken.append(lock)
                continue
            _release(taken)
            _FIRST.insert(0, number)  # its holder may be waiting for one of those: next time it comes first
            return None
    except BaseException:  # a signal handler raising in a wait: hold nothing
        _release(taken)
        raise
    _GUARD.acquire()  # whoever holds it is registering a lock, and waits for nothing else
    if _MADE[0] != made:  # a lock was made since the list: list again
        _GUARD.release()
        _release(taken)
        return None
    return [*taken, _GUARD]


def _take_all() -> tuple[list[Any], list[Any]]:
    """(every lock and the guard, held by this thread); from inside our own section, after GIVE_UP seconds,
    (the free ones and the guard, the others)."""
    give_up = time.monotonic() + GIVE_UP
    while True:
        with _GUARD:
            order, made = _in_order(), _MADE[0]
        own = any(lock._is_owned() for _, lock in order)  # then every wait is bounded: its holder may wait for us
        taken = _attempt(order, made, patient=not own)
        if taken is not None:
            return taken, []
        if own and time.monotonic() > give_up:
            _GUARD.acquire()
            locks = [lock for _, lock in _in_order()]
            taken = [lock for lock in locks if lock.acquire(blocking=False)]
            return [*taken, _GUARD], [lock for lock in locks if not any(lock is t for t in taken)]


def _before_fork() -> None:
    _HELD[threading.get_ident()] = _take_all()


def _after_fork_in_parent() -> None:
    taken, _ = _HELD.pop(threading.get_ident(), ([], []))
    _release(taken)


def _after_fork_in_child() -> None:
    """The forking thread is the child's only thread, under the same ident: it lets go of what its hook took;
    a lock the hook could not take was held by a thread the child does not have, and is made new."""
    taken, missing = _HELD.pop(threading.get_ident(), ([], []))
    _HELD.clear()
    _release(taken)
    for lock in missing:
        lock._at_fork_reinit()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
