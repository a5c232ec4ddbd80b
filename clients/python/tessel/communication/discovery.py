"""How the ranks of a job that started without a cluster learn where the coordinator their rank 0 serves is.

Rank 0 publishes {"address", "token", "pid"}; the other ranks look it up before a deadline.

* `FileExchange`: a private file in a directory every rank of the job sees — the job's session directory on one
  host (OpenMPI's, or $TMPDIR/tessel-<uid>), or any shared directory ($TESSEL_RENDEZVOUS_DIR, e.g. on NFS).
* `PmixExchange`: PMIx, the process-management interface `mpirun` (OpenMPI) and Slurm serve to every process they
  start, across hosts. It is reached through ctypes in libpmix, which those launchers ship: nothing to install.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from tessel.core.errors import ConfigurationError, RendezvousTimeoutError
from tessel.core.process import pid_alive

_POLL_S = 0.05


def default_directory() -> Path:
    """A directory only this user can use: $TESSEL_RENDEZVOUS_DIR, else $TMPDIR/tessel-<uid>/rendezvous."""
    shared = os.environ.get("TESSEL_RENDEZVOUS_DIR")
    if shared:
        return Path(shared)
    return Path(tempfile.gettempdir()) / f"tessel-{os.getuid()}" / "rendezvous"


class FileExchange:
    """Rank 0 writes the file atomically (0600, in a 0700 directory); the others poll for it."""

    def __init__(self, key: str, directory: Path | None = None, same_host: bool = True):
        self.directory = Path(directory) if directory is not None else default_directory()
        self.path = self.directory / f"{key}.json"
        self.same_host = same_host  # the publisher's pid can be checked: a file left by a dead one is stale
        self._published = False

    def _check_directory(self) -> None:
        """The file carries the job's token: only this user may be able to write where it lies."""
        info = self.directory.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise ConfigurationError(
                f"rendezvous directory {self.directory} is not this user's own (owner uid {info.st_uid}, mode "
                f"{info.st_mode & 0o777:o}): another user could plant a coordinator there; remove it, or set "
                "TESSEL_RENDEZVOUS_DIR to a directory only you can write"
            )

    def publish(self, payload: dict) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_directory()
        fd, temp = tempfile.mkstemp(dir=self.directory, prefix=".publish-")
        with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
            json.dump(dict(payload, pid=os.getpid(), host=socket.gethostname()), f)
        os.replace(temp, self.path)
        self._published = True

    def lookup(self, deadline: float, what: str) -> dict:
        while True:
            payload = self._read()
            if payload is not None:
                return payload
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"{what}: rank 0 did not publish its coordinator in {self.path} in time; it is slow to start, "
                    "failed (see its output), or does not share this directory (across hosts set "
                    "TESSEL_RENDEZVOUS_DIR to a shared directory, or TESSEL_COORDINATOR to a running cluster)"
                )
            time.sleep(_POLL_S)

    def _read(self) -> dict | None:
        try:
            payload = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # not there yet (or being replaced)
        self._check_directory()
        stale = self.same_host and payload.get("host") == socket.gethostname() and not pid_alive(payload.get("pid", 0))
        return None if stale else payload

    def remove(self) -> None:
        if self._published:
            with contextlib.suppress(OSError):
                self.path.unlink()


# ---------------------------------------------------------------------------------------------------- PMIx

_PMIX_SUCCESS = 0
_PMIX_GLOBAL = 3  # pmix_scope_t
_PMIX_STRING = 3  # pmix_data_type_t
_PMIX_MAX_NSLEN = 255
_PMIX_KEY = "tessel.coordinator"


class _PmixProc(ctypes.Structure):
    _fields_ = [("nspace", ctypes.c_char * (_PMIX_MAX_NSLEN + 1)), ("rank", ctypes.c_uint32)]


class _PmixValue(ctypes.Structure):
    # pmix_value_t: a uint16 type tag, then a union whose string member is a char* at offset 8. The union is
    # 24 bytes in PMIx 3-5; the padding leaves room for any version, and only `type` and `string` are touched.
    _fields_ = [("type", ctypes.c_uint16), ("string", ctypes.c_char_p), ("_rest", ctypes.c_byte * 48)]


def _libpmix():
    name = os.environ.get("TESSEL_LIBPMIX") or ctypes.util.find_library("pmix") or "libpmix.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise ConfigurationError(
            f"PMIx is not available to this process ({exc}): the ranks of an mpirun job over several hosts find "
            "rank 0's coordinator through it. Set TESSEL_LIBPMIX to libpmix.so, TESSEL_RENDEZVOUS_DIR to a "
            "directory every host shares, or TESSEL_COORDINATOR to a running cluster"
        ) from None
    lib.PMIx_Init.argtypes = [ctypes.POINTER(_PmixProc), ctypes.c_void_p, ctypes.c_size_t]
    lib.PMIx_Put.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_PmixValue)]
    lib.PMIx_Commit.argtypes = []
    lib.PMIx_Fence.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    lib.PMIx_Get.argtypes = [
        ctypes.POINTER(_PmixProc),
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.POINTER(_PmixValue)),
    ]
    lib.PMIx_Finalize.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


class PmixExchange:
    """Rank 0 puts the payload, every rank meets at a PMIx fence (the launcher's own barrier across hosts), then
    reads it: one collective step, as MPI implementations exchange their own addresses."""

    def __init__(self):
        self._lib = _libpmix()
        self._me = _PmixProc()
        status = self._lib.PMIx_Init(ctypes.byref(self._me), None, 0)
        if status != _PMIX_SUCCESS:
            raise ConfigurationError(
                f"PMIx_Init failed (status {status}): this process was not started by a PMIx launcher "
                "(mpirun, srun --mpi=pmix); start it with one, or set TESSEL_COORDINATOR"
            )
        self._payload: bytes | None = None

    @property
    def rank(self) -> int:
        return int(self._me.rank)

    def publish(self, payload: dict) -> None:
        self._payload = json.dumps(dict(payload, pid=os.getpid(), host=socket.gethostname())).encode()
        value = _PmixValue(type=_PMIX_STRING, string=self._payload)
        self._check("PMIx_Put", self._lib.PMIx_Put(_PMIX_GLOBAL, _PMIX_KEY.encode(), ctypes.byref(value)))

    def lookup(self, deadline: float, what: str) -> dict:
        """Every rank calls this (rank 0 after publish): the fence is collective."""
        self._check("PMIx_Commit", self._lib.PMIx_Commit())
        self._check("PMIx_Fence", self._lib.PMIx_Fence(None, 0, None, 0))
        rank0 = _PmixProc(nspace=self._me.nspace, rank=0)
        found = ctypes.POINTER(_PmixValue)()
        status = self._lib.PMIx_Get(ctypes.byref(rank0), _PMIX_KEY.encode(), None, 0, ctypes.byref(found))
        if status != _PMIX_SUCCESS or not found or found.contents.type != _PMIX_STRING:
            raise RendezvousTimeoutError(f"{what}: rank 0 published no coordinator through PMIx (status {status})")
        return json.loads(found.contents.string.decode())

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self._lib.PMIx_Finalize(None, 0)

    def _check(self, call: str, status: int) -> None:
        if status != _PMIX_SUCCESS:
            raise ConfigurationError(f"{call} failed with PMIx status {status}")
