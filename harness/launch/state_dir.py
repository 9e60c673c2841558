"""The state directory, where the harness's port locks live, shared by
every user of the machine: where it is, and that it is safe to use.
See :mod:`harness.launch.ports` for what the locks are for.

Design: one directory shared by every user, made like ``/tmp`` itself
---------------------------------------------------------------------
The state directory is the ``state_dir`` argument (what the ini option
``mwms_state_dir`` sets), else ``$MWMS_STATE_DIR``, else
``<tempfile.gettempdir()>/pytest-mwms-ports-v2``.  The harness creates it
(0700, then ``fchmod`` to 1777: world-writable and sticky, like ``/tmp``), so
every user can create lock files in it and nobody but a file's owner (and the
directory's owner, and root) can remove or replace them.  A per-user
directory was rejected: the runs of two users would not see each other's
locks and would rely on the test bind alone, which races the bind TensorFlow
makes in the worker seconds later, so two users' clusters could be handed
the same port.  (Where ``$TMPDIR`` differs between users, point
``MWMS_STATE_DIR`` of all of them at one directory.)

A process opens, locks or removes only lock files of its own uid.  A name in
the directory that is anything else (another user's lock file, a symbolic or
hard link, a FIFO, a directory) is left alone and its port skipped for this
reservation: its owner holds that port, or held it when their run died and
will sweep the file at their next reservation.  Skipping cannot lock anyone
out while the range has free ports, and cannot collide, because two users
never share a lock file; the alternative, locking another user's file, would
let its owner delete it under us.  Names are examined with ``lstat`` and
opened with ``O_NOFOLLOW | O_NONBLOCK`` without ``O_CREAT`` (so
``fs.protected_regular`` never applies and a planted link is never followed),
checked again with ``fstat`` (a regular file we own, one link); a missing file
is created with ``O_CREAT | O_EXCL`` (never through a link, never truncating
anything), mode 0600.  The directory itself is opened ``O_NOFOLLOW`` and used
through its descriptor; a symbolic link, or a directory that is not safe (see
:func:`_problem`), raises :class:`~harness.errors.StateDirError` naming the
path, its owner and mode, and the settings that choose another.

No litter: a lock file is removed when its reservation is released, with the
classic protocol: take the lock, then check that the name still denotes the
inode locked (``fstat`` vs ``lstat``: ``st_dev``/``st_ino``), else start over;
unlink only while holding the lock.  So a process that opened the file just
before it was removed finds out and creates a fresh one instead of "holding"
a deleted inode.  Each reservation first sweeps the user's own stale files
(left by a run that was SIGKILLed), under the same protocol.  Bound: the
directory holds one file per port currently reserved, plus the files of runs
that died holding ports, until their owner's next reservation; never more
than one per port of the range.

What the design does not defend against: a user who holds or pre-creates lock
files for every port, or binds them, denies the others ports (they get a
clear error); the directory's owner, when not root, can remove other users'
lock files and so break coordination.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
from typing import Optional, Tuple

from harness.errors import StateDirError, hide_in_setup_errors

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

ENV_VAR = "MWMS_STATE_DIR"
INI_OPTION = "mwms_state_dir"
DIR_NAME = "pytest-mwms-ports-v2"
DIR_MODE = 0o1777
FILE_MODE = 0o600


def default_state_dir(tempdir: Optional[str] = None) -> str:
    """The state directory when neither ``state_dir`` nor ``$MWMS_STATE_DIR``
    says: in ``tempdir``, else in ``tempfile.gettempdir()``."""
    return os.path.join(tempdir or tempfile.gettempdir(), DIR_NAME)


def resolve_state_dir(state_dir: Optional[str], tempdir: Optional[str] = None,
                      where: Optional[str] = None) -> Tuple[str, str]:
    """(path, where the path came from); ``tempdir``: the machine's temp
    directory, for the default, where this process's own differs;
    ``where``: how the user set ``state_dir`` (``--state-dir``)."""
    if state_dir:
        return os.path.abspath(os.fspath(state_dir)), (
            where or f"the ini option {INI_OPTION} (or reserve_ports(state_dir=...))")
    env = os.environ.get(ENV_VAR)
    if env:
        return os.path.abspath(env), f"the environment variable {ENV_VAR}"
    return default_state_dir(tempdir), "the default"


def _user(uid: int) -> str:
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _describe(st: os.stat_result) -> str:
    return (f"owner {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o} "
            f"({stat.filemode(st.st_mode)})")


def state_dir_error(path: str, source: str, problem: str,
                     st: Optional[os.stat_result] = None) -> StateDirError:
    """The error for an unusable state directory: what, why, what to do."""
    if st is None:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
    what = f" ({_describe(st)})" if st is not None else ""
    if st is not None and stat.S_ISDIR(st.st_mode):
        fix = f"Or have its owner run `chmod 1777 {path}` (or remove it)."
    elif st is not None:
        fix = f"Or have its owner remove {path}."
    else:
        fix = ""
    return StateDirError(
        f"pytest-mwms cannot use {path}{what} to coordinate ports with other runs: {problem}. "
        f"The path comes from {source}. Set the environment variable {ENV_VAR} (or the ini "
        f"option {INI_OPTION}) to another directory: a new path (the harness creates it, mode "
        f"1777 like /tmp), a directory shared like /tmp (mode 1777), or a private one of "
        f"yours; every user whose runs may overlap on this machine must use the same one, or "
        f"their ports may collide. {fix}".rstrip())


def _writable(path: str) -> bool:
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK | os.X_OK, effective_ids=effective)


def _problem(st: os.stat_result, path: str) -> Optional[str]:
    """Why a directory (its ``fstat``) is no place for lock files, or None.

    Accepted: a sticky directory we can write in (shared like /tmp, whoever
    owns it), or a directory of ours that nobody else can write in.
    """
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    me = os.geteuid()
    sticky = bool(st.st_mode & stat.S_ISVTX)
    if not _writable(path):
        return f"you ({_user(me)}) cannot create files in it"
    if not sticky and st.st_mode & 0o022:
        return ("others can write in it but it is not sticky (like /tmp, mode 1777), so "
                "anyone could remove or replace the lock files")
    if not sticky and st.st_uid != me:
        return (f"it belongs to another user, who could replace the lock files, and it is not "
                f"shared like /tmp (mode 1777); you are {_user(me)}")
    return None


def _being_made(path: str, me: int, opening: bool = False) -> bool:
    """Whether another user may be creating the directory this moment (the
    harness makes it 0700, then chmods it 1777).  ``opening``: our open just
    failed with EACCES, and a mode that lets us in now says it was chmod-ed
    in between."""
    try:
        st = os.lstat(path)
    except OSError:
        return opening
    mode = stat.S_IMODE(st.st_mode)
    return stat.S_ISDIR(st.st_mode) and st.st_uid != me and (
        mode == 0o700 or (opening and mode & 0o005 == 0o005))


def open_state_dir(path: str, source: str) -> int:
    """A descriptor of the state directory, created if missing; or StateDirError."""
    default = source == "the default"
    me = os.geteuid()
    deadline = None
    made = False
    for _ in range(1000):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                # 0700 until it is ours and chmod-ed: umask cannot spoil the mode,
                # and nobody can slip anything in before it is 1777.
                os.mkdir(path, 0o700)
                made = True
            except FileExistsError:
                pass
            except OSError as e:
                raise state_dir_error(
                    path, source, f"it does not exist and cannot be created ({e.strerror}; "
                    f"only the last component is created)") from None
            continue
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    target = ""
                    with contextlib.suppress(OSError):
                        target = f" to {os.readlink(path)}"
                    raise state_dir_error(
                        path, source, f"it is a symbolic link{target}, which the harness "
                        f"does not follow", st) from None
                raise state_dir_error(path, source, "it is not a directory", st) from None
            if e.errno == errno.EACCES and _being_made(path, me, opening=True):
                deadline = deadline or time.monotonic() + 1.0
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            raise state_dir_error(path, source, f"it cannot be opened ({e.strerror})") from None
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == me and mode != DIR_MODE and (
                    made or default):  # made just now, or the default left in another mode
                os.fchmod(fd, DIR_MODE)
                st = os.fstat(fd)
            problem = _problem(st, path)
        except BaseException:
            os.close(fd)
            raise
        if problem is None:
            return fd
        os.close(fd)
        if _being_made(path, me):
            deadline = deadline or time.monotonic() + 1.0
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
        raise state_dir_error(path, source, problem, st)
    raise state_dir_error(path, source, "it keeps disappearing while being opened")


def check_state_dir(state_dir: Optional[str] = None, where: Optional[str] = None) -> str:
    """The state directory :func:`reserve_ports` would use, created if
    missing and checked: its path, or :class:`~harness.errors.StateDirError`
    naming ``where`` the user set it (for the plugin to report once, at the
    start of a session)."""
    path, source = resolve_state_dir(state_dir, where=where)
    fd = open_state_dir(path, source)
    try:
        _probe(fd, path, source)
    finally:
        os.close(fd)
    return path


def _probe(fd: int, path: str, source: str) -> None:
    """Create and remove a file in the directory: permission bits do not
    say it for root, nor for a file system that takes no files (``/proc``),
    a read-only or a full one."""
    name = f".probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=fd))
    except OSError as e:
        raise state_dir_error(path, source, f"a file cannot be created in it "
                              f"({e.strerror})") from None
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=fd)
