"""Fork while other threads are inside the package's locked paths; every child must get through them too.

Why a script of its own (run by tests/unit/test_fork_safe_locks.py in a fresh interpreter): the parent's
fork must not deadlock either, and a deadlocked fork in pytest's own process would hang the whole session
instead of failing one test.

A few threads loop over the locked paths, shared round-robin (a profile installed and removed, MaxText's
output-head profile installed under its module's lock, the serving shims' locks around the patching lock, the
caller-convention and deprecation-policy settings, an adapter class built, MaxText's profiles registered, the
resolution and the serving backends read) while the main thread forks children; each child runs every path once
and exits 0.
A child still running after the timeout is a hung child: it is asked for its stack (SIGUSR1, faulthandler),
killed, and reported with that stack. Prints one JSON object: forks, seconds, hung, failed, thread errors.
MaxText is not needed (the paths run on fake modules and the shipped matrix's rows). Each path runs once before
the threads start: a fork while a thread imports a module for the first time can leave the child waiting on that
module's import lock, which is CPython's, not the package's.
"""

from __future__ import annotations

import faulthandler
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `helpers`, run as a script

from helpers.fake_layers import LAYERS_SOURCE, tagger
from helpers.fake_modules import make_module
from helpers.shipped import shipped_matrix
from maxtext_compat import shims
from maxtext_compat.adapters.wrapper import adapted_class
from maxtext_compat.convention import callers, policy
from maxtext_compat.cpu import rpa as cpu_rpa
from maxtext_compat.cpu import serving as cpu_serving
from maxtext_compat.patching import traced
from maxtext_compat.resolution.installed import installed_resolution
from maxtext_compat.serve import vllm_plugin
from maxtext_compat.serving import backend
from maxtext_compat.serving_fixes import output_head
from maxtext_compat.serving_fixes import request_defects as serving_requests
from maxtext_compat.shims import maxtext_profiles

ROOT = "forkstress"
PROFILE = "fork-stress"
EMBEDDINGS = "def attend_on_embedding(query, embedding_table, attend_dtype=None, config=None):\n    return query\n"
ATTENTION_025 = (  # MaxText 0.2.5's Attention.__call__ parameters
    "self, inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, bidirectional_mask=None, "
    "rope_kwargs=None, kv_cache=None, attention_metadata=None, shared_key=None, shared_value=None"
)


def _setup() -> list[tuple[str, Callable[[], object]]]:
    make_module(ROOT)
    make_module(f"{ROOT}.layers", LAYERS_SOURCE)
    make_module(f"{ROOT}.layers.embeddings", EMBEDDINGS)  # what the output-head profile patches
    targets = (f"{ROOT}.layers:f", f"{ROOT}.layers:Attention.s")
    shims.register_profile(PROFILE, lambda: [shims.PatchSpec(t, tagger("A")) for t in targets])
    row = shipped_matrix().row("0.2.5")
    namespace: dict[str, object] = {}
    exec(f"def __call__({ATTENTION_025}):\n    return inputs_q, kv_cache\n", namespace)
    number = itertools.count()

    def profile() -> None:
        shims.install(PROFILE)
        shims.uninstall(PROFILE)

    def head() -> None:
        output_head.install(ROOT)  # its module lock held around a whole install
        shims.uninstall(output_head.PROFILE)

    def serving() -> None:  # each module's lock held while it asks the patching lock
        cpu_serving.uninstall()
        serving_requests.uninstall()
        cpu_rpa.status()

    def conventions() -> None:
        policy.set_deprecation_policy("warn")
        policy.set_strict(None)
        policy.set_deprecation_policy(None)
        callers.set_caller_convention("legacy")
        callers.set_caller_convention(None)

    def adapters() -> None:  # a new class each time: built under the adapters' lock
        adapted_class(type(f"Attention{next(number)}", (), {"__call__": namespace["__call__"]}), row=row)

    def reads() -> None:
        maxtext_profiles.register()
        installed_resolution()
        traced.compiled_before(PROFILE)
        backend.registered_backends()
        vllm_plugin.state()

    return [(f.__name__, f) for f in (profile, head, serving, conventions, adapters, reads)]


def _child(paths: list[tuple[str, Callable[[], object]]], trace: Path) -> None:
    code = 1
    try:
        with open(trace, "w") as out:
            faulthandler.register(signal.SIGUSR1, file=out, all_threads=False)
            try:
                for _, path in paths:
                    path()
                code = 0
            except BaseException:
                traceback.print_exc(file=out)
    finally:
        os._exit(code)


def main(forks: int, timeout: float, threads: int) -> dict[str, object]:
    """Fork `forks` children while `threads` threads share the paths round-robin; wait `timeout` s for each."""
    paths = _setup()
    stop, errors = threading.Event(), []

    def churn(mine: list[tuple[str, Callable[[], object]]]) -> None:
        try:
            while not stop.is_set():
                for _, path in mine:
                    path()
        except BaseException:
            errors.append(traceback.format_exc())

    for _, path in paths:  # every first-time import done: a fork during one (CPython's per-module import
        path()  # locks, not ours, and not taken around a fork) could hang a child on the import itself
    shares = [paths[i::threads] for i in range(threads)]
    workers = [threading.Thread(target=churn, args=(share,), daemon=True) for share in shares]
    traces = Path(tempfile.mkdtemp(prefix="fork-stress-"))
    children: dict[int, float] = {}
    start = time.monotonic()
    for t in workers:
        t.start()
    warnings.simplefilter("ignore", DeprecationWarning)  # "use of fork() may lead to deadlocks": the point here
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            _child(paths, traces / f"{os.getpid()}.txt")
        children[pid] = time.monotonic()
        time.sleep(0.005)  # let the threads move on between forks
    fork_seconds = time.monotonic() - start
    stop.set()
    status: dict[int, int] = {}
    for pid, forked in children.items():
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < forked + timeout:
            time.sleep(0.01)
        if done[0]:
            status[pid] = os.waitstatus_to_exitcode(done[1])
    hung = [pid for pid in children if pid not in status]
    for pid in hung:
        os.kill(pid, signal.SIGUSR1)  # its stack names the lock it waits for
    time.sleep(0.3 if hung else 0)
    for pid in hung:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    for t in workers:
        t.join(timeout)

    def trace(pid: int) -> str:
        path = traces / f"{pid}.txt"
        return path.read_text() if path.exists() else ""

    result = {
        "forks": forks,
        "fork_seconds": round(fork_seconds, 2),
        "hung": [{"pid": pid, "stack": trace(pid)} for pid in hung],
        "failed": [{"pid": pid, "error": trace(pid)} for pid, code in status.items() if code != 0],
        "errors": errors,
    }
    shutil.rmtree(traces, ignore_errors=True)
    return result


if __name__ == "__main__":
    faulthandler.dump_traceback_later(float(sys.argv[4]), exit=True)  # a fork that never returns: say where
    print(json.dumps(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))))
