"""A producer that knows nothing of strata but its documented record layout.

It plays the part of a simpler process: it creates a
POSIX shared-memory object with `shm_open` (through Python's standard
library), fills it with float32 data, and writes the BufferDescriptor and
Tensor records that name the object and views of it, packed with `struct`
field by field from docs/wire-format.md (sections 2 to 4). Nothing here
imports strata.

    python3 posix_shm_producer.py create NAME ROWS COLS   # prints records as JSON
    python3 posix_shm_producer.py read NAME NBYTES         # prints the bytes as hex
    python3 posix_shm_producer.py shrink NAME NBYTES       # ftruncate to NBYTES
    python3 posix_shm_producer.py unlink NAME

`create` lays out a ROWS x COLS float32 matrix `m[r][c] = r * COLS + c`,
followed by an output area of the same size, zeroed.
"""

import json
import os
import secrets
import struct
import sys
from multiprocessing import resource_tracker, shared_memory

MAGIC = 0x5342
HOST, READWRITE, POSIX_SHM = 0, 2, 1
F32 = 0


def identity(owner: bytes, buffer_id: int, generation: int) -> bytes:
    # owner_instance_id[8] @0, buffer_id u64 @8, generation u32 @16, pad[12] @20
    return struct.pack("<8sQI12x", owner, buffer_id, generation)


def descriptor(ident: bytes, nbytes: int, name: str) -> bytes:
    body = name.encode("ascii")
    assert 1 <= len(body) <= 32 and b"/" not in body
    # magic u16 @0, address_space u8 @2, access u8 @3, backend_kind u8 @4,
    # pad @5..8, identity @8, nbytes u64 @40, owner_worker_path_id u32 @48,
    # body_len u16 @52, pad @54..56, body[32] @56
    rec = struct.pack(
        "<HBBB3x32sQIH2x32s",
        MAGIC,
        HOST,
        READWRITE,
        POSIX_SHM,
        ident,
        nbytes,
        0,
        len(body),
        body.ljust(32, b"\0"),
    )
    assert len(rec) == 88
    return rec


def tensor(desc: bytes, byte_offset: int, shape, strides, dtype: int) -> bytes:
    n = len(shape)
    assert 1 <= n <= 5 and len(strides) == n
    shapes = list(shape) + [0] * (5 - n)
    stride = list(strides) + [0] * (5 - n)
    # buffer @0, byte_offset u64 @88, ndims u32 @96, shapes[5] u32 @100,
    # strides[5] u32 @120, dtype u8 @140, pad @141..144
    rec = desc + struct.pack("<QI5I5IB3x", byte_offset, n, *shapes, *stride, dtype)
    assert len(rec) == 144
    return rec


def open_existing(name: str) -> shared_memory.SharedMemory:
    shm = shared_memory.SharedMemory(name=name)
    # The object outlives this process: the consumer (or `unlink`) ends it.
    resource_tracker.unregister(shm._name, "shared_memory")
    return shm


def create(name: str, rows: int, cols: int) -> None:
    elems = rows * cols
    nbytes = 2 * elems * 4
    shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
    resource_tracker.unregister(shm._name, "shared_memory")
    shm.buf[: elems * 4] = struct.pack(f"<{elems}f", *range(elems))
    shm.buf[elems * 4 : nbytes] = bytes(elems * 4)
    shm.close()
    desc = descriptor(identity(secrets.token_bytes(8), 1, 1), nbytes, name)
    views = {
        # the whole matrix, row-major
        "matrix": tensor(desc, 0, [rows, cols], [cols, 1], F32),
        # its transpose: same bytes, axes swapped
        "transposed": tensor(desc, 0, [cols, rows], [1, cols], F32),
        # the output area
        "out": tensor(desc, elems * 4, [rows, cols], [cols, 1], F32),
        # every other column of the matrix
        "even_columns": tensor(desc, 0, [rows, (cols + 1) // 2], [cols, 2], F32),
    }
    print(
        json.dumps(
            {
                "name": name,
                "nbytes": nbytes,
                "descriptor": desc.hex(),
                "views": {k: v.hex() for k, v in views.items()},
            }
        )
    )


def main() -> None:
    cmd, name = sys.argv[1], sys.argv[2]
    if cmd == "create":
        create(name, int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "read":
        shm = open_existing(name)
        print(bytes(shm.buf[: int(sys.argv[3])]).hex())
        shm.close()
    elif cmd == "shrink":
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
        os.ftruncate(fd, int(sys.argv[3]))
        os.close(fd)
    elif cmd == "unlink":
        shm = open_existing(name)
        shm.close()
        shm.unlink()
    else:
        sys.exit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main()
