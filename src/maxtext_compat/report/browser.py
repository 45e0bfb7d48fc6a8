"""Headless Chromium (Debian's `chromium`): the report page's DOM after its script ran, and a screenshot.

Why the browser itself: the page is read by people in a browser, with its script filling the details panel; a
parser of the HTML source would not see what the script does. Debian's package (`apt-get install chromium`,
`make chromium` in the checkout) is the one tested.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from maxtext_compat.errors import CompatError

# Flags that run it as root in a container, offline, without touching a profile or the network.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
NAMES = ("chromium", "chromium-browser", "google-chrome")


def find() -> str | None:
    """The Chromium executable on PATH, or None."""
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def _run(args: list[str], timeout: float) -> str:
    exe = find()
    if exe is None:
        raise CompatError(
            "no Chromium to open the report page with",
            argument="chromium",
            expected="Debian's chromium on PATH",
            found="none of " + ", ".join(NAMES),
            fix="install Chromium (Debian: apt-get install -y chromium; in the maxtext-compat checkout: make chromium)",
        )
    with tempfile.TemporaryDirectory(prefix="maxtext-compat-chromium-") as profile:
        proc = subprocess.run(
            [exe, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        raise CompatError(
            f"chromium exited with {proc.returncode}",
            argument="chromium",
            found=proc.stderr.strip()[-800:],
            fix="run the same command by hand to see why",
        )
    return proc.stdout


def dump_dom(url: str, *, timeout: float = 60.0) -> str:
    """The page's DOM as HTML after its scripts ran."""
    return _run(["--virtual-time-budget=5000", "--dump-dom", url], timeout)


def screenshot(url: str, out: Path, *, size: tuple[int, int] = (1500, 1100), timeout: float = 60.0) -> Path:
    """A PNG of the page at `size` (width, height) in `out`."""
    _run([f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", url], timeout)
    if not out.is_file():
        raise CompatError("chromium wrote no screenshot", argument="out", found=str(out), fix="check its stderr")
    return out
