"""Readers and writers of the raw file formats behind the built-in sources: IDX (MNIST) and CIFAR-10 binary.

IDX layout: two zero bytes, a type code, the number of dimensions, then one big-endian uint32 per dimension and the
data in big-endian C order. Files may be gzip-compressed (detected by their magic bytes, not their name).

>>> import numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "x-idx1-ubyte")
>>> write_idx(path, np.arange(3, dtype=np.uint8))
>>> read_idx(path)
array([0, 1, 2], dtype=uint8)
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

from tessel.core.errors import ConfigurationError

# IDX type code -> big-endian numpy dtype.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"

CIFAR10_RECORD_BYTES = 1 + 3 * 32 * 32
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_TEST_FILES = ("test_batch.bin",)


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise ConfigurationError(
            f"{path}: the gzip stream is corrupt or truncated ({exc}); re-download or re-create the file"
        ) from exc


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (plain or gzip) into a native-endian numpy array of the stored shape."""
    path = Path(path)
    raw = _read_bytes(path)
    fix = "re-download the file or re-create it (python examples/make_digits.py OUT_DIR)"
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        head = raw[:4].hex() or "empty"
        raise ConfigurationError(
            f"{path}: not an IDX file: the magic number is 0x{head}, expected 0x0000TTNN with a type byte TT in "
            f"{{{', '.join(f'{c:02x}' for c in IDX_DTYPES)}}} and NN dimensions; {fix}"
        )
    dtype, ndim = IDX_DTYPES[raw[2]], raw[3]
    header_bytes = 4 + 4 * ndim
    if len(raw) < header_bytes:
        raise ConfigurationError(f"{path}: truncated IDX header: {ndim} dimensions need {header_bytes} bytes; {fix}")
    shape = struct.unpack(f">{ndim}I", raw[4:header_bytes])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(raw) - header_bytes
    if found != expected:
        what = "truncated" if found < expected else "has trailing bytes"
        raise ConfigurationError(
            f"{path}: IDX data {what}: shape {tuple(shape)} of {dtype.newbyteorder('=').name} needs {expected} bytes "
            f"after the {header_bytes}-byte header, found {found}; {fix}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_bytes).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=False)


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool = False) -> None:
    """Write `array` as an IDX file (gzip-compressed when `compress`); its dtype must be one IDX can hold."""
    array = np.asarray(array)
    codes = {dtype.newbyteorder("="): code for code, dtype in IDX_DTYPES.items()}
    if array.dtype not in codes:
        raise ConfigurationError(
            f"write_idx({path}): dtype {array.dtype} has no IDX type code; cast to one of "
            f"{sorted(d.name for d in codes)}"
        )
    code = codes[array.dtype]
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    body = np.ascontiguousarray(array, dtype=IDX_DTYPES[code]).tobytes()
    payload = header + body
    Path(path).write_bytes(gzip.compress(payload, mtime=0) if compress else payload)


def find_idx_file(dataset_dir: Path, prefix: str, kind: str) -> Path | None:
    """The MNIST file `{prefix}-{kind}-ubyte` in any of its usual spellings (dash or dot, optional .gz)."""
    for stem in (f"{prefix}-{kind}-ubyte", f"{prefix}-{kind.replace('-', '.')}-ubyte"):
        for name in (stem, stem + ".gz"):
            if (dataset_dir / name).is_file():
                return dataset_dir / name
    return None


def read_cifar10_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch: images (n, 32, 32, 3) uint8 in HWC order and labels (n,) uint32."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) == 0 or len(raw) % CIFAR10_RECORD_BYTES:
        raise ConfigurationError(
            f"{path}: a CIFAR-10 binary batch holds records of {CIFAR10_RECORD_BYTES} bytes (1 label + 3x32x32 "
            f"pixels) but the file has {len(raw)} bytes; the file is truncated or not CIFAR-10 binary — re-download "
            f"the 'binary version' of CIFAR-10"
        )
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR10_RECORD_BYTES)
    labels = records[:, 0].astype(np.uint32)
    if labels.max(initial=0) > 9:
        raise ConfigurationError(f"{path}: CIFAR-10 labels must be 0..9, found {int(labels.max())}")
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def write_cifar10_batch(path: str | os.PathLike, images: np.ndarray, labels: np.ndarray) -> None:
    """Write HWC uint8 images (n, 32, 32, 3) and labels as one CIFAR-10 binary batch (tests and tools)."""
    images = np.asarray(images, dtype=np.uint8).transpose(0, 3, 1, 2).reshape(len(images), -1)
    records = np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], images], axis=1)
    Path(path).write_bytes(records.tobytes())
