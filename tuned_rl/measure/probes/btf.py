"""Struct field offsets of the running kernel, from its BTF (/sys/kernel/btf/vmlinux).

A raw tracepoint hands over ``struct task_struct`` pointers; BCC compiles against
kernel headers, which on this VM belong to another kernel build, so a field offset
taken from them would be wrong. The running kernel's own type information is right
by definition. Only what tuned-rl needs is read: the byte offset of a member of a
named struct. Format: Documentation/bpf/btf.rst.
"""

from __future__ import annotations

import struct
from functools import lru_cache

VMLINUX = "/sys/kernel/btf/vmlinux"
MAGIC = 0xEB9F
KIND_STRUCT, KIND_UNION = 4, 5

# Bytes that follow the 12-byte common header, per kind (vlen is the member count).
_EXTRA = {
    1: lambda vlen: 4,  # INT
    3: lambda vlen: 12,  # ARRAY
    4: lambda vlen: 12 * vlen,  # STRUCT
    5: lambda vlen: 12 * vlen,  # UNION
    6: lambda vlen: 8 * vlen,  # ENUM
    13: lambda vlen: 8 * vlen,  # FUNC_PROTO
    14: lambda vlen: 4,  # VAR
    15: lambda vlen: 12 * vlen,  # DATASEC
    17: lambda vlen: 4,  # DECL_TAG
    19: lambda vlen: 12 * vlen,  # ENUM64
}
_NO_EXTRA = {2, 7, 8, 9, 10, 11, 12, 16, 18}  # PTR FWD TYPEDEF VOLATILE CONST RESTRICT FUNC FLOAT TYPE_TAG


class BtfError(LookupError):
    """The BTF cannot be read, or does not hold the struct or member asked for."""


def member_offset(struct_name: str, member: str, path: str = VMLINUX) -> int:
    """Byte offset of ``member`` in ``struct struct_name`` of the kernel described by ``path``."""
    offsets = _struct_members(path, struct_name)
    if member not in offsets:
        raise BtfError(f"struct {struct_name} has no member {member} in {path}")
    bits = offsets[member]
    if bits % 8:
        raise BtfError(f"{struct_name}.{member} is a bit field")
    return bits // 8


@lru_cache(maxsize=None)
def _struct_members(path: str, struct_name: str) -> dict[str, int]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise BtfError(f"cannot read {path}: {err.strerror}") from err
    if len(data) < 24:
        raise BtfError(f"{path} is not BTF")
    magic, _version, _flags, header_len = struct.unpack_from("<HBBI", data, 0)
    if magic != MAGIC:
        raise BtfError(f"{path} is not little-endian BTF (magic {magic:#x})")
    type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
    types = header_len + type_off
    strings = data[header_len + str_off: header_len + str_off + str_len]

    def name(offset: int) -> str:
        return strings[offset: strings.index(b"\0", offset)].decode()

    position, end = types, types + type_len
    while position < end:
        name_off, info, _size = struct.unpack_from("<III", data, position)
        kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        position += 12
        if kind in (KIND_STRUCT, KIND_UNION) and name(name_off) == struct_name:
            members = {}
            for index in range(vlen):
                m_name, _m_type, m_offset = struct.unpack_from("<III", data, position + 12 * index)
                # With kind_flag, the top 8 bits hold a bit field's size, the rest its bit offset.
                members[name(m_name)] = m_offset & 0xFFFFFF if kind_flag else m_offset
            return members
        if kind in _EXTRA:
            position += _EXTRA[kind](vlen)
        elif kind not in _NO_EXTRA:
            raise BtfError(f"unknown BTF kind {kind} in {path}")
    raise BtfError(f"no struct {struct_name} in {path}")
