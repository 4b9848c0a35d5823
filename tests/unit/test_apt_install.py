"""scripts/apt-install (run by scripts/bootstrap) waits for another apt instead of failing at once: every
apt-get call asks apt to wait for dpkg's locks, and `update` is retried while another process holds the package
lists lock (apt 2.6 does not wait for that one). apt-get is a stand-in on PATH that behaves like a busy apt."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4711 (apt-get)"
FAKE_APT = f"""#!/bin/bash
echo "$*" >> "$FAKE_LOG"
case " $* " in
  *" DPkg::Lock::Timeout=$FAKE_WAIT "*) ;;
  *) echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4711 (apt-get)" >&2; exit 100;;
esac
if [[ " $* " == *" update "* ]]; then
  n=$(cat "$FAKE_STATE" 2>/dev/null || echo 0); echo $((n + 1)) > "$FAKE_STATE"
  if [ "$n" -lt "$FAKE_BUSY_UPDATES" ]; then echo "{LOCKED}" >&2; exit 100; fi
  if [ -n "${{FAKE_UPDATE_ERROR:-}}" ]; then echo "$FAKE_UPDATE_ERROR" >&2; exit 100; fi
fi
[ -e "$POLICY_RC_D" ] && echo "policy-rc.d present" >> "$FAKE_LOG"
exit 0
"""


def run(tmp_path: Path, *, busy: int, wait_s: int = 600,
        update_error: str = "") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """apt-install under a fake apt-get whose update finds the lists locked ``busy`` times; the fake refuses any
    call that does not ask to wait ``wait_s`` for dpkg's locks, as a busy apt would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_STATE": str(tmp_path / "state"), "FAKE_BUSY_UPDATES": str(busy), "FAKE_UPDATE_ERROR": update_error,
           "FAKE_WAIT": str(wait_s), "APT_RETRY_S": "0.05", "POLICY_RC_D": str(tmp_path / "policy-rc.d")}
    if wait_s != 600:
        env["APT_WAIT_S"] = str(wait_s)  # else the script's default, 600, is what the fake demands
    r = subprocess.run([str(REPO / "scripts/apt-install"), "lua5.3", "munge"], env=env, capture_output=True,
                       text=True, timeout=60, check=False)
    log = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
    return r, log


def test_waits_while_another_apt_holds_the_lists_then_installs(tmp_path: Path) -> None:
    r, log = run(tmp_path, busy=3)
    assert r.returncode == 0, r.stderr
    assert "another apt holds the package lists; waiting up to 600s" in r.stderr
    assert log == ["-o DPkg::Lock::Timeout=600 update -qq"] * 4 + [
        "-o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends lua5.3 munge", "policy-rc.d present"]
    assert not (tmp_path / "policy-rc.d").exists()  # removed again: it was ours


def test_gives_up_at_the_deadline(tmp_path: Path) -> None:
    r, log = run(tmp_path, busy=100, wait_s=0)
    assert r.returncode == 1 and LOCKED in r.stderr and "apt-get update failed" in r.stderr
    assert len(log) == 1


def test_other_update_errors_fail_at_once(tmp_path: Path) -> None:
    r, log = run(tmp_path, busy=0, update_error="E: The repository 'http://deb.debian.org bookworm' has no Release")
    assert r.returncode == 1 and "has no Release" in r.stderr
    assert len(log) == 1 and not (tmp_path / "policy-rc.d").exists()


def test_bootstrap_installs_through_apt_install() -> None:
    text = (REPO / "scripts/bootstrap").read_text()
    assert 'scripts/apt-install "${missing[@]}"' in text and "apt-get" not in text
