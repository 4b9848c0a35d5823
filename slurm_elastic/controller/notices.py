"""The controller's side of resize notices (slurm_elastic/resize.py): write them, read acknowledgements.

The controller runs as root and writes into the job's working directory (shared filesystem, like goodput), so:
``.slurm-elastic`` there must be a plain directory owned by the job's user (the templates create it; the
controller creates it only in a working directory the user owns); the notice is written as a new file relative
to that directory (O_EXCL|O_NOFOLLOW), handed to the user (fchown) and renamed into place, so a symlink planted
by the user is replaced, never followed. An acknowledgement counts only from a regular file owned by the user.
Every failure is returned as text for the journal, never raised: a missing notice must not stop a resize (the
grace signal and the grace period still apply).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from dataclasses import dataclass

from slurm_elastic.goodput import DIR_NAME
from slurm_elastic.resize import Ack, Notice, parse_ack, parse_notice
from slurm_elastic.slurm.model import Job

MAX_READ = 4096


class NoticeError(Exception):
    """Why a notice could not be written or an acknowledgement not read."""


def _owner(job: Job) -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(job.user)
    except KeyError:
        raise NoticeError(f"unknown user {job.user!r}") from None
    return pw.pw_uid, pw.pw_gid


def _names(job_id: int) -> tuple[str, str]:
    return f"resize-{job_id}.json", f"resize-{job_id}.ack"


@dataclass
class NoticeBoard:
    """Notices in ``<working dir>/.slurm-elastic/resize-<unit id>.json``."""

    def _open_dir(self, job: Job, *, create: bool) -> tuple[int, int, int]:
        """(dir fd, uid, gid) of the job's ``.slurm-elastic`` directory."""
        if not job.working_dir or not os.path.isabs(job.working_dir):
            raise NoticeError("the job has no absolute working directory")
        uid, gid = _owner(job)
        try:
            wfd = os.open(job.working_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise NoticeError(f"cannot open the working directory: {e.strerror}") from e
        try:
            try:
                dfd = os.open(DIR_NAME, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=wfd)
            except FileNotFoundError:
                if not create:
                    raise NoticeError(f"no {DIR_NAME} directory") from None
                if os.fstat(wfd).st_uid != uid:
                    raise NoticeError(f"no {DIR_NAME} directory, and the working directory is not "
                                      f"{job.user}'s") from None
                try:
                    os.mkdir(DIR_NAME, 0o755, dir_fd=wfd)
                except FileExistsError:
                    pass
                dfd = os.open(DIR_NAME, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=wfd)
                if os.fstat(dfd).st_uid == 0 and uid != 0:
                    os.fchown(dfd, uid, gid)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NoticeError(f"{DIR_NAME} is not a plain directory") from e
                raise NoticeError(f"cannot open {DIR_NAME}: {e.strerror}") from e
        finally:
            os.close(wfd)
        if os.fstat(dfd).st_uid != uid:
            os.close(dfd)
            raise NoticeError(f"{DIR_NAME} is not owned by {job.user}")
        return dfd, uid, gid

    def post(self, job: Job, unit_id: int, notice: Notice) -> str:
        """Write ``notice`` for ``unit_id``; returns the file's path. Raises NoticeError."""
        dfd, uid, gid = self._open_dir(job, create=True)
        name = _names(unit_id)[0]
        tmp = f".{name}.{os.getpid()}.tmp"
        try:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dfd)
            try:
                os.fchown(fd, uid, gid)
                os.write(fd, notice.render().encode())
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            raise NoticeError(f"cannot write the notice: {e.strerror}") from e
        finally:
            os.close(dfd)
        return os.path.join(str(job.working_dir), DIR_NAME, name)

    def _read(self, dfd: int, name: str, uid: int) -> str | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise NoticeError(f"cannot open {name}: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                raise NoticeError(f"{name} is not a regular file owned by the job's user")
            return os.read(fd, MAX_READ).decode("utf-8", errors="replace")
        finally:
            os.close(fd)

    def acknowledgement(self, job: Job, unit_id: int, notice_id: str) -> Ack | None:
        """The job's acknowledgement of ``notice_id``; None when there is none (yet). Raises NoticeError."""
        dfd, uid, _ = self._open_dir(job, create=False)
        try:
            text = self._read(dfd, _names(unit_id)[1], uid)
        finally:
            os.close(dfd)
        ack = parse_ack(text) if text is not None else None
        return ack if ack is not None and ack.id == notice_id else None

    def withdraw(self, job: Job, unit_id: int, notice_id: str) -> bool:
        """Remove the notice if it is still ``notice_id`` (held workers then train on). Raises NoticeError."""
        dfd, _, _ = self._open_dir(job, create=False)
        name = _names(unit_id)[0]
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if not stat.S_ISREG(st.st_mode):
                return False
            text = self._read(dfd, name, st.st_uid)
            current = parse_notice(text) if text is not None else None
            if current is None or current.id != notice_id:
                return False
            os.unlink(name, dir_fd=dfd)
            return True
        except OSError as e:
            raise NoticeError(f"cannot remove the notice: {e.strerror}") from e
        finally:
            os.close(dfd)
