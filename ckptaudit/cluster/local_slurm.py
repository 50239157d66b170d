"""A single-node SLURM on this machine (Debian's slurm-wlm + munge, as root, no systemd) for tests and CI.

:func:`start_local_slurm` brings up ``munged``, ``slurmctld`` and ``slurmd`` as a one-node
cluster; it returns once ``sinfo`` shows the node ``idle``, or raises
:class:`SlurmSetupError` with the tail of each daemon's log.  The local cluster has no
accounting database, so Snakemake's SLURM executor needs ``--slurm-status-command squeue``
there (``MinJobAge=600`` keeps finished jobs visible to ``squeue`` for 10 minutes):
:data:`LOCAL_EXECUTOR_ARGS`.  Stdlib only: ``.ci/slurm-setup.sh`` runs it with the system python.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

#: What Snakemake's SLURM executor needs on the local cluster (no accounting database, so no
#: ``sacct``; no accounts).  The short status intervals keep the tests fast; they are not a
#: good idea on a shared cluster.
LOCAL_EXECUTOR_ARGS: Tuple[str, ...] = (
    "--slurm-no-account", "--slurm-status-command", "squeue",
    "--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2",
)

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scontrol")
MARKER = "# written by ckptaudit.cluster"
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
DEFAULT_STATE = Path("/var/lib/ckptaudit-slurm")
PARTITION = "local"
USABLE_STATES = {"idle", "mixed", "allocated", "completing"}


class SlurmSetupError(RuntimeError):
    """The local SLURM could not be brought up; the message carries each daemon's log tail."""


@dataclass
class LocalSlurm:
    """Facts about the running local cluster (``status`` prints them as JSON)."""

    conf: str
    node: str
    cpus: int
    real_memory_mb: int
    partition: str
    state_dir: str
    started: List[str]  # daemons this call started ("" when it found them running)
    seconds: float

    def env(self) -> Dict[str, str]:
        """Environment a client needs (``SLURM_CONF`` when the config is not the default)."""
        return {} if Path(self.conf) == DEFAULT_CONF else {"SLURM_CONF": self.conf}


def _which(name: str) -> Optional[str]:
    return shutil.which(name) or next((p for d in ("/usr/sbin", "/sbin") if os.access(p := f"{d}/{name}", os.X_OK)),
                                      None)


def slurm_installed() -> bool:
    """True when every binary the local cluster needs is installed (``slurm-wlm``, ``munge``)."""
    return all(_which(b) for b in SLURM_BINARIES)


def _run(cmd: Sequence[str], timeout: float = 15, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)


def _client_env(conf: Optional[Path]) -> dict:
    env = dict(os.environ)
    if conf is not None and conf != DEFAULT_CONF:
        env["SLURM_CONF"] = str(conf)
    return env


def node_states(conf: Optional[Path] = None) -> Dict[str, str]:
    """{node: state} from ``sinfo`` (``idle``, ``idle*`` …); empty when no controller answers."""
    sinfo = _which("sinfo")
    if not sinfo:
        return {}
    try:
        p = _run([sinfo, "-h", "-N", "-o", "%N %T"], timeout=10, env=_client_env(conf))
    except (subprocess.TimeoutExpired, OSError):
        return {}
    if p.returncode != 0:
        return {}
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1].lower()
    return out


def cluster_ready(conf: Optional[Path] = None) -> bool:
    """True when ``sinfo`` answers and at least one node can take jobs."""
    return any(s in USABLE_STATES for s in node_states(conf).values())


def _node_line() -> Tuple[str, int, int]:
    """``slurmd -C``'s NodeName line for this machine, and its CPUs and RealMemory (MiB)."""
    p = _run([_which("slurmd"), "-C"], timeout=20)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("NodeName=")), "")
    if p.returncode != 0 or not line:
        raise SlurmSetupError(f"slurmd -C: exit {p.returncode}: {p.stdout}{p.stderr}")
    fields = dict(kv.split("=", 1) for kv in line.split())
    return line, int(fields.get("CPUs", os.cpu_count() or 1)), int(fields.get("RealMemory", 1024))


def slurm_conf_text(node: str, node_line: str, state_dir: Path) -> str:
    """The one-node ``slurm.conf`` (22.05 and later): linuxproc process tracking, no task
    plugin, no accounting, cons_tres with cores and memory as consumable resources."""
    s = state_dir
    return "\n".join([
        MARKER + " (ckptaudit's single-node test cluster); `python -m ckptaudit.cluster stop` stops it",
        "ClusterName=ckptaudit",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=1024",
        "ReturnToService=2",
        # Finished jobs stay visible to squeue (and scontrol) for 10 minutes: Snakemake's
        # executor polls squeue here, there being no accounting database for sacct.
        "MinJobAge=600",
        "SlurmctldTimeout=60",
        "SlurmdTimeout=120",
        "InactiveLimit=0",
        "KillWait=10",
        "Waittime=0",
        f"StateSaveLocation={s}/ctld",
        f"SlurmdSpoolDir={s}/d",
        f"SlurmctldPidFile={s}/slurmctld.pid",
        f"SlurmdPidFile={s}/slurmd.pid",
        f"SlurmctldLogFile={s}/slurmctld.log",
        f"SlurmdLogFile={s}/slurmd.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"{node_line} NodeAddr=127.0.0.1 State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
        "",
    ])


def _tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"  ({path}: {e})"
    return "\n".join("  " + ln for ln in lines[-n:]) or f"  ({path} is empty)"


def _logs(state_dir: Path) -> str:
    out = []
    for name, path in (("munged", Path("/var/log/munge/munged.log")), ("slurmctld", state_dir / "slurmctld.log"),
                       ("slurmd", state_dir / "slurmd.log")):
        out.append(f"--- {name}: {path} (last lines)\n{_tail(path)}")
    return "\n".join(out)


def _pid_alive(pidfile: Path) -> Optional[int]:
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def munge_works() -> bool:
    """True when a credential round-trips through ``munge | unmunge`` (munged is up)."""
    munge, unmunge = _which("munge"), _which("unmunge")
    if not (munge and unmunge):
        return False
    try:
        cred = _run([munge, "-n"], timeout=10)
        if cred.returncode != 0:
            return False
        p = subprocess.run([unmunge], input=cred.stdout, capture_output=True, text=True, timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return p.returncode == 0


def _munge_key() -> Path:
    """``/etc/munge/munge.key``, made (by ``mungekey``, else from ``os.urandom``) when missing."""
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        mk = _which("mungekey")
        if mk:
            _run([mk, "--create", "--keyfile", str(key)], timeout=30)
        if not key.exists():
            key.write_bytes(os.urandom(1024))
    return key


def _munged_command(key: Path) -> List[str]:
    """The command that starts munged: as the ``munge`` user, which then owns the key and munge's folders
    (munged refuses keys and folders it does not own; the Debian package runs it so), else as root."""
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
    try:
        import pwd

        pw = pwd.getpwnam("munge")
    except KeyError:  # no munge user: run it as root
        return [_which("munged"), "--force"]
    for p in (key, Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge")):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    os.chmod(key, 0o400)
    os.chmod("/run/munge", 0o755)
    return [_which("runuser") or "runuser", "-u", "munge", "--", _which("munged")]


def _start_munged(started: List[str], state_dir: Path) -> None:
    if munge_works():
        return
    cmd = _munged_command(_munge_key())
    p = _run(cmd, timeout=30)
    if p.returncode != 0:
        raise SlurmSetupError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stdout}{p.stderr}\n"
                              f"{_logs(state_dir)}")
    started.append("munged")
    (state_dir / "munged.ours").write_text("munged was started by ckptaudit.cluster\n")
    for _ in range(50):
        if munge_works():
            return
        time.sleep(0.1)
    raise SlurmSetupError("munged started but `munge -n | unmunge` still fails\n"
                          f"--- munged log\n{_tail(Path('/var/log/munge/munged.log'))}")


def _choose_conf(conf: Optional[Path], state_dir: Path) -> Path:
    """Our config path: the given one; else /etc/slurm/slurm.conf unless a config that is not
    ours is there (a real cluster's), in which case one under ``state_dir`` (with SLURM_CONF)."""
    if conf is not None:
        return Path(conf)
    if not DEFAULT_CONF.exists() or MARKER in DEFAULT_CONF.read_text(errors="replace"):
        return DEFAULT_CONF
    return state_dir / "slurm.conf"


def start_local_slurm(state_dir: Path | str = DEFAULT_STATE, conf: Optional[Path | str] = None,
                      timeout_s: float = 90.0) -> LocalSlurm:
    """Bring up a one-node SLURM on this machine and wait until its node is ``idle``.

    Idempotent: a cluster that already answers ``sinfo`` with a usable node is left alone
    (whoever runs it), and daemons already running from an earlier call are not started
    twice.  Writes ``slurm.conf`` to ``/etc/slurm/slurm.conf`` unless a config not written
    by this module is there; then to ``STATE_DIR/slurm.conf`` and sets ``SLURM_CONF`` in
    this process's environment (children inherit it; other shells need
    ``export SLURM_CONF=…``).  The node is this machine under ``hostname -s`` with the CPUs
    and memory ``slurmd -C`` reports, in partition ``local``.

    The caller must be root and have ``slurm-wlm`` and ``munge`` installed
    (``apt-get install slurm-wlm munge``).  Raises :class:`SlurmSetupError` with the
    daemons' log tails when the node is not idle within ``timeout_s`` seconds.
    """
    t0 = time.monotonic()
    state_dir = Path(state_dir)
    conf_path = _choose_conf(Path(conf) if conf else None, state_dir)
    if not slurm_installed():
        missing = [b for b in SLURM_BINARIES if not _which(b)]
        raise SlurmSetupError(f"SLURM is not installed: missing {', '.join(missing)}; "
                              "run `apt-get install -y slurm-wlm munge` (Debian/Ubuntu)")
    node = socket.gethostname().split(".")[0]
    if conf_path.exists() and cluster_ready(conf_path):
        _export_conf(conf_path)
        return _info(conf_path, node, state_dir, [], t0)
    if os.geteuid() != 0:
        raise SlurmSetupError(f"starting a local SLURM needs root (running as uid {os.geteuid()})")

    started: List[str] = []
    for d in (state_dir, state_dir / "ctld", state_dir / "d"):
        d.mkdir(parents=True, exist_ok=True)
    _start_munged(started, state_dir)
    ctld_pid = _pid_alive(state_dir / "slurmctld.pid")
    d_pid = _pid_alive(state_dir / "slurmd.pid")
    if not (ctld_pid and d_pid and conf_path.exists()):
        _write_conf(conf_path, slurm_conf_text(node, _node_line()[0], state_dir))
    _export_conf(conf_path)
    env = _client_env(conf_path)
    if not ctld_pid:
        # -c: clean start (no saved jobs from an earlier cluster); -i: ignore unreadable state.
        _start_daemon("slurmctld", [_which("slurmctld"), "-c", "-i", "-f", str(conf_path)], env, state_dir, started)
    if not d_pid:
        _start_daemon("slurmd", [_which("slurmd"), "-f", str(conf_path)], env, state_dir, started)
    _wait_usable(conf_path, node, env, "slurmd" in started, t0 + timeout_s, timeout_s, state_dir)
    return _info(conf_path, node, state_dir, started, t0)


def _wait_usable(conf_path: Path, node: str, env: dict, slurmd_started: bool, deadline: float,
                 timeout_s: float, state_dir: Path) -> None:
    """Poll ``sinfo`` until ``node`` is usable (a node left down by an earlier run is resumed when slurmd was
    not started now); :class:`SlurmSetupError` with the daemons' logs at ``deadline`` (monotonic seconds)."""
    states: Dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(conf_path)
        if states.get(node) in USABLE_STATES:
            return
        if states.get(node, "").startswith(("down", "drain")) and not slurmd_started:
            # left down by an earlier run (e.g. a reboot without slurmd): resume it
            _run([_which("scontrol"), "update", f"nodename={node}", "state=resume"], env=env)
        time.sleep(0.5)
    raise SlurmSetupError(f"node {node} is not idle after {timeout_s:.0f} s (sinfo: {states or 'no answer'})\n"
                          f"{_logs(state_dir)}")


def _write_conf(conf_path: Path, text: str) -> None:
    """``text`` to ``conf_path`` unless it already holds it."""
    if not conf_path.exists() or conf_path.read_text(errors="replace") != text:
        conf_path.parent.mkdir(parents=True, exist_ok=True)
        conf_path.write_text(text)


def _start_daemon(name: str, cmd: List[str], env: dict, state_dir: Path, started: List[str]) -> None:
    """Run ``cmd`` (a daemon that forks away) and add ``name`` to ``started``; :class:`SlurmSetupError` with
    the daemons' logs when it exits non-zero."""
    p = _run(cmd, timeout=60, env=env)
    if p.returncode != 0:
        raise SlurmSetupError(f"{name}: exit {p.returncode}: {p.stdout}{p.stderr}\n{_logs(state_dir)}")
    started.append(name)


def _export_conf(conf_path: Path) -> None:
    if conf_path != DEFAULT_CONF:
        os.environ["SLURM_CONF"] = str(conf_path)


def _info(conf_path: Path, node: str, state_dir: Path, started: List[str], t0: float) -> LocalSlurm:
    cpus, mem = 0, 0
    try:
        p = _run([_which("scontrol"), "show", "node", node], timeout=10, env=_client_env(conf_path))
        for tok in p.stdout.split():
            if tok.startswith("CPUTot="):
                cpus = int(tok.split("=", 1)[1])
            elif tok.startswith("RealMemory="):
                mem = int(tok.split("=", 1)[1])
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass
    return LocalSlurm(conf=str(conf_path), node=node, cpus=cpus, real_memory_mb=mem, partition=PARTITION,
                      state_dir=str(state_dir), started=started, seconds=round(time.monotonic() - t0, 2))


def stop_local_slurm(state_dir: Path | str = DEFAULT_STATE) -> List[str]:
    """Stop the slurmd and slurmctld this module started (by the pids in ``state_dir``), and
    munged only when this module started it.  Returns what it signalled."""
    import signal

    state_dir = Path(state_dir)
    stopped = []
    daemons = [("slurmd", state_dir / "slurmd.pid"), ("slurmctld", state_dir / "slurmctld.pid")]
    if (state_dir / "munged.ours").exists():
        daemons.append(("munged", Path("/run/munge/munged.pid")))
        (state_dir / "munged.ours").unlink()
    for name, pidfile in daemons:
        pid = _pid_alive(pidfile)
        if pid:
            os.kill(pid, signal.SIGTERM)
            stopped.append(f"{name} ({pid})")
    for _ in range(100):
        if not any(_pid_alive(p) for p in (state_dir / "slurmd.pid", state_dir / "slurmctld.pid")):
            break
        time.sleep(0.1)
    return stopped
