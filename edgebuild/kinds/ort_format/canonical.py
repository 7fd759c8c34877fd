"""The ORT file rewritten so that one graph always gives the same bytes.

onnxruntime (measured on 1.32) writes an ``.ort`` file's kernel type-string resolver by
iterating hash maps whose seed changes with every process: the tables and strings of the
resolver land in another order, with other padding, and the file's digest changes, though
every value in it is the same (the entries are sorted by key on read) and the graph itself
(the model table and everything under it) is byte for byte the same. A flatbuffer is
written back to front, so the graph, written first, is the file's tail and the resolver,
written after it, sits between the root table and the graph. This module keeps the tail
as written and lays the head out again from its values alone: the root table, the format
version and the resolver, in one fixed order. What onnxruntime reads is unchanged.

Anything in the head this module does not know (a field a later ORT format adds) is
refused with :class:`UnknownLayout` rather than dropped: rewriting it would lose it.
"""

from __future__ import annotations

import mmap
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

FILE_IDENTIFIER = b"ORTM"
# The root table's fields (onnxruntime's ort.fbs, ``table InferenceSession``); field 2, a
# session state older formats kept, is not among those a head may hold here.
SESSION_ORT_VERSION, SESSION_MODEL, SESSION_RESOLVER = 0, 1, 3
# A flatbuffer's elements are aligned relative to its end, at most to 8 bytes (int64s):
# a tail kept whole, of a length that is a multiple of this, stays aligned in a new head.
ALIGNMENT = 8
COPY_CHUNK = 16 << 20


class UnknownLayout(ValueError):
    """The file's head holds something this module would not write back."""


@dataclass(frozen=True)
class KernelTypeStrArgs:
    kernel_type_str: bytes
    args: tuple[tuple[int, int], ...]  # (arg type: 0 input, 1 output; index)


@dataclass(frozen=True)
class OpKernelTypeStrArgs:
    op_id: bytes
    kernel_type_strs: tuple[KernelTypeStrArgs, ...]


@dataclass(frozen=True)
class Head:
    """What the head of an ORT file says: everything but the graph."""

    ort_version: bytes
    resolver: tuple[OpKernelTypeStrArgs, ...]
    model: int  # where the model table starts
    tail: int  # where the bytes kept as written start: the graph and all it refers to


class _Reader:
    """Bounds-checked reads of a flatbuffer's tables, strings and vectors."""

    def __init__(self, data: "bytes | mmap.mmap") -> None:
        self.data = data

    def _unpack(self, form: str, at: int) -> int:
        size = struct.calcsize(form)
        if at < 0 or at + size > len(self.data):
            raise UnknownLayout(f"an offset points outside the file (byte {at} of {len(self.data)})")
        return struct.unpack_from(form, self.data, at)[0]

    def vtable(self, table: int) -> int:
        return table - self._unpack("<i", table)

    def fields(self, table: int) -> dict[int, int]:
        """Where each present field of the table at ``table`` is, by field number."""
        vtable = self.vtable(table)
        vtable_size = self._unpack("<H", vtable)
        if vtable_size < 4 or vtable_size % 2:
            raise UnknownLayout(f"a table at byte {table} has a vtable of {vtable_size} bytes")
        present = {}
        for number in range((vtable_size - 4) // 2):
            offset = self._unpack("<H", vtable + 4 + 2 * number)
            if offset:
                present[number] = table + offset
        return present

    def offset(self, at: int) -> int:
        return at + self._unpack("<I", at)

    def scalar(self, form: str, at: int) -> int:
        return self._unpack(form, at)

    def string(self, at: int) -> bytes:
        start = self.offset(at)
        length = self._unpack("<I", start)
        if start + 4 + length > len(self.data):
            raise UnknownLayout(f"a string at byte {start} runs past the end of the file")
        return bytes(self.data[start + 4:start + 4 + length])

    def tables(self, at: int) -> list[int]:
        """The tables of the vector of tables the field at ``at`` refers to."""
        start = self.offset(at)
        count = self._unpack("<I", start)
        if start + 4 + 4 * count > len(self.data):
            raise UnknownLayout(f"a vector at byte {start} runs past the end of the file")
        return [self.offset(start + 4 + 4 * index) for index in range(count)]

    def known(self, table: int, what: str, allowed: set[int]) -> dict[int, int]:
        present = self.fields(table)
        unknown = sorted(set(present) - allowed)
        if unknown:
            raise UnknownLayout(f"{what} has field{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))}, "
                                f"which this rewrite does not know (it knows {', '.join(map(str, sorted(allowed)))})")
        return present


def read_head(data: "bytes | mmap.mmap") -> Head:
    """The head of the ORT file ``data``; :class:`UnknownLayout` if it holds anything else."""
    reader = _Reader(data)
    if len(data) < 8 or bytes(data[4:8]) != FILE_IDENTIFIER:
        raise UnknownLayout("the file does not start as an ORT file (no ORTM identifier)")
    if len(data) % ALIGNMENT:
        raise UnknownLayout(f"the file is {len(data)} bytes, not a multiple of {ALIGNMENT}")
    session = reader.offset(0)
    fields = reader.known(session, "the root table", {SESSION_ORT_VERSION, SESSION_MODEL, SESSION_RESOLVER})
    if SESSION_MODEL not in fields or SESSION_RESOLVER not in fields or SESSION_ORT_VERSION not in fields:
        raise UnknownLayout("the root table lacks its format version, its model or its kernel type-string resolver")
    model = reader.offset(fields[SESSION_MODEL])
    # The graph was written before anything of the head, so it, its vtable and all it refers
    # to lie at or after the lower of the two.
    tail = min(model, reader.vtable(model))
    resolver_table = reader.offset(fields[SESSION_RESOLVER])
    if not session < tail or not resolver_table < tail:
        raise UnknownLayout("the kernel type-string resolver was not written after the graph")
    entries = []
    resolver_fields = reader.known(resolver_table, "the kernel type-string resolver", {0})
    for op_table in reader.tables(resolver_fields[0]) if 0 in resolver_fields else []:
        op_fields = reader.known(op_table, "an operator's kernel type strings", {0, 1})
        if 0 not in op_fields:
            raise UnknownLayout("an operator of the kernel type-string resolver has no op_id")
        type_strs = []
        for type_table in reader.tables(op_fields[1]) if 1 in op_fields else []:
            type_fields = reader.known(type_table, "a kernel type string", {0, 1})
            if 0 not in type_fields:
                raise UnknownLayout("a kernel type-string entry has no kernel_type_str")
            args = []
            for arg_table in reader.tables(type_fields[1]) if 1 in type_fields else []:
                arg_fields = reader.known(arg_table, "an argument's type and index", {0, 1})
                args.append((reader.scalar("<B", arg_fields[0]) if 0 in arg_fields else 0,
                             reader.scalar("<I", arg_fields[1]) if 1 in arg_fields else 0))
            type_strs.append(KernelTypeStrArgs(reader.string(type_fields[0]), tuple(args)))
        entries.append(OpKernelTypeStrArgs(reader.string(op_fields[0]), tuple(type_strs)))
    return Head(reader.string(fields[SESSION_ORT_VERSION]), tuple(entries), model, tail)


def head_bytes(head: Head, tail_length: int, model_in_tail: int) -> bytes:
    """A head for ``head``'s values in one fixed layout, to be followed by a tail of
    ``tail_length`` bytes (a multiple of :data:`ALIGNMENT`) in which the model table
    starts ``model_in_tail`` bytes in."""
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    op_entries = []
    for op in head.resolver:
        type_entries = []
        for type_str in op.kernel_type_strs:
            args = []
            for arg_type, index in type_str.args:
                builder.StartObject(2)
                builder.PrependUint32Slot(1, index, 0)
                builder.PrependUint8Slot(0, arg_type, 0)
                args.append(builder.EndObject())
            args_vector = _vector_of_tables(builder, args)
            name = builder.CreateSharedString(type_str.kernel_type_str)
            builder.StartObject(2)
            builder.PrependUOffsetTRelativeSlot(1, args_vector, 0)
            builder.PrependUOffsetTRelativeSlot(0, name, 0)
            type_entries.append(builder.EndObject())
        type_vector = _vector_of_tables(builder, type_entries)
        op_id = builder.CreateString(op.op_id)
        builder.StartObject(2)
        builder.PrependUOffsetTRelativeSlot(1, type_vector, 0)
        builder.PrependUOffsetTRelativeSlot(0, op_id, 0)
        op_entries.append(builder.EndObject())
    op_vector = _vector_of_tables(builder, op_entries)
    builder.StartObject(1)
    builder.PrependUOffsetTRelativeSlot(0, op_vector, 0)
    resolver = builder.EndObject()
    version = builder.CreateString(head.ort_version)
    builder.StartObject(4)
    builder.PrependUOffsetTRelativeSlot(SESSION_RESOLVER, resolver, 0)
    # The model table is in the tail, which this builder never holds: a placeholder of an
    # offset's size, made the offset below once the head's length is known.
    builder.PrependUint32Slot(SESSION_MODEL, 0xFFFFFFFF, 0)
    builder.PrependUOffsetTRelativeSlot(SESSION_ORT_VERSION, version, 0)
    session = builder.EndObject()
    builder.minalign = max(builder.minalign, ALIGNMENT)
    builder.Finish(session, file_identifier=FILE_IDENTIFIER)
    out = bytearray(builder.Output())
    if len(out) % ALIGNMENT or tail_length % ALIGNMENT:
        raise UnknownLayout(f"a head of {len(out)} bytes before a tail of {tail_length} would misalign the graph")
    reader = _Reader(out)
    model_field = reader.fields(reader.offset(0))[SESSION_MODEL]
    struct.pack_into("<I", out, model_field, len(out) + model_in_tail - model_field)
    return bytes(out)


def _vector_of_tables(builder, tables: list[int]) -> int:
    builder.StartVector(4, len(tables), 4)
    for table in reversed(tables):
        builder.PrependUOffsetTRelative(table)
    return builder.EndVector()


def write_canonical(source: Path, target: Path) -> None:
    """``target``: the ORT file ``source`` with its head laid out in the one fixed way.
    The graph is copied through in chunks, never read whole."""
    from edgebuild.core.files import open_regular

    with open_regular(source) as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        head = read_head(data)
        # The tail starts where the graph does, rounded down to the alignment; the bytes
        # before the graph in that round-down are the old head's, and are zeroed.
        tail = head.tail - head.tail % ALIGNMENT
        new_head = head_bytes(head, len(data) - tail, head.model - tail)
        with target.open("wb") as out:
            out.write(new_head)
            out.write(bytes(head.tail - tail))
            file.seek(head.tail)
            shutil.copyfileobj(file, out, COPY_CHUNK)
    with open_regular(target) as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        rewritten = read_head(data)
    # The head read back says what the converter's said, and points at the same graph, or
    # the rewrite is wrong.
    if (rewritten.ort_version, rewritten.resolver, rewritten.model) != \
            (head.ort_version, head.resolver, len(new_head) + head.model - tail):
        raise UnknownLayout("the rewritten head does not read back as the converter's")
