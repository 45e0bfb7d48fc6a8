"""The process-wide state of the patching core: the lock, installed layers, the marker name.

Why a module of its own: every other part (resolution, conflict checks, writes, the
transaction) reads these, and none of them may own them without an import cycle.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

# Imported before the fork hook below is registered: registry's hook must be registered
# first so the before-fork hooks (run in reverse order) take LOCK, then the registry lock.
from maxtext_compat.shims import registry  # noqa: F401

if TYPE_CHECKING:
    from maxtext_compat.shims.patching.layers import _Layer

# One lock for every check-and-swap in the process (profiles.py takes it too, re-entrantly).
LOCK = threading.RLock()
MARKER = "__maxtext_compat_patches__"


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT: Any = _Missing()  # "no entry in this __dict__": restoring it means deleting the slot

_PID = [os.getpid()]  # refreshed after fork; os.getpid() per record is a syscall

# id(installed object) -> layer, for every layer installed by this copy of the library.
_OURS: dict[int, _Layer] = {}


# A fork while another thread is inside a check-and-swap would leave the child's lock held
# forever; taking it around fork makes the child inherit a consistent, unlocked state.
def _after_fork_in_child() -> None:
    _PID[0] = os.getpid()
    LOCK.release()


os.register_at_fork(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=_after_fork_in_child)
